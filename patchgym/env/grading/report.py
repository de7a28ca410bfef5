"""Structured pytest results for grading: install the `patchgym_report` plugin in a sandbox, run pytest with it and
no plugin the grader did not name, read what it wrote.

Unlike parsing printed logs, a test that prints `PASSED tests/x.py::test_y` cannot change this result.
"""

import json
import shlex
from pathlib import Path

from patchgym.env.grading.parsers import ERROR, FAILED, PASSED, SKIPPED, XFAIL
from patchgym.sandbox import SandboxError

PLUGIN_DIR = "/opt/patchgym/grader"  # inside the sandbox, outside any workspace the agent edits
PLUGIN_MODULE = "patchgym_report"
PLUGIN_SOURCE = (Path(__file__).parent / "pytest_plugin.py").read_text()


# The pytest11 entry points installed, as a JSON list (Python 3.6 and later; importlib.metadata from 3.8).
_LIST_PLUGINS = """
import json
try:
    from importlib.metadata import entry_points
    found = entry_points()
    found = found.select(group="pytest11") if hasattr(found, "select") else found.get("pytest11", ())
    names = [ep.name for ep in found]
except ImportError:
    import pkg_resources
    names = [ep.name for ep in pkg_resources.iter_entry_points("pytest11")]
print(json.dumps(sorted(set(names))))
"""


class ReportMissing(Exception):
    """The report file is absent or holds no result: no sign the suite ran, which must not grade as a pass."""


class Tampered(ReportMissing):
    """The run changed how pytest runs or reports tests, or ended before the plugin's closing check: there is no
    report to trust, so a caller that does not tell the two apart (the task factory) treats it as missing."""


def install_report_plugin(sandbox) -> dict[str, str]:
    """Write the plugin into PLUGIN_DIR in `sandbox`; return the env to run pytest with."""
    sandbox.write_file(f"{PLUGIN_DIR}/{PLUGIN_MODULE}.py", PLUGIN_SOURCE)
    return {"PYTHONPATH": PLUGIN_DIR}


def pytest_report_args(report_path: str) -> list[str]:
    """pytest arguments that load the plugin and send its report to `report_path`."""
    return ["-p", PLUGIN_MODULE, f"--patchgym-report={report_path}"]


def installed_plugins(sandbox, cwd: str, prelude: str = "") -> list[str]:
    """The pytest plugins installed in `sandbox` (entry point names): list them before a patch is applied,
    so that a plugin the patch registers (a `*.dist-info` of its own) is never among them. `prelude`: shell lines
    that activate the environment the tests run in (an imported row's conda env or venv)."""
    command = (["bash", "-c", f"{prelude}\nexec python -c {shlex.quote(_LIST_PLUGINS)}"] if prelude
               else ["python", "-c", _LIST_PLUGINS])
    result = sandbox.exec(command, cwd=cwd, timeout=120)
    lines = result.output.strip().splitlines()
    if not result.ok or not lines:
        raise SandboxError(f"grader: listing the installed pytest plugins failed: {result.output[-2000:]}")
    return json.loads(lines[-1])


def pytest_command(command: str, report_path: str, plugins: list[str] | None) -> str:
    """`command` (a pytest run) with autoload off, only `plugins` and the report plugin loaded, to `report_path`;
    with `plugins` None autoload stays on (an imported row's environment, whose harness loads its plugins so).

    PYTHONSAFEPATH: `python -m pytest` must not put the workspace first on sys.path, where a file from the patch
    could stand in for pytest or for our plugin before either is imported. PYTEST_PLUGINS and PYTEST_ADDOPTS are the
    grader's to set, and it sets neither.
    """
    # The report plugin first: it must be imported before any other plugin, which may be code under test.
    args = pytest_report_args(report_path) + [arg for name in plugins or () for arg in ("-p", name)]
    autoload = "" if plugins is None else "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
    env = f"PYTHONSAFEPATH=1 {autoload}PYTHONPATH={PLUGIN_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"
    return f"export {env}; unset PYTEST_PLUGINS PYTEST_ADDOPTS; {command} {shlex.join(args)}"


def _records(text: str) -> list[dict]:
    """The report's JSON objects; a line cut short by a killed run is skipped."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("nodeid"), str):
            records.append(record)
    return records


def _phase_status(record: dict) -> str | None:
    """One report's status: None where the phase says nothing (a passing setup or teardown)."""
    when, outcome = record.get("when"), record.get("outcome")
    xfail_marked = record.get("wasxfail") is not None
    if when == "collect":
        return ERROR if outcome == "failed" else SKIPPED
    if outcome == "skipped":
        return XFAIL if xfail_marked else SKIPPED
    if outcome == "failed":
        # A strict xpass fails the call phase itself, so it lands here as FAILED.
        return FAILED if when == "call" else ERROR
    if outcome == "passed" and when == "call":
        return PASSED  # a non-strict xpass too (pytest marks it passed, with wasxfail set)
    return None  # passing setup/teardown, or an outcome we do not grade ("rerun")


def _combine(earlier: str | None, later: str) -> str:
    """A test's status after another phase: a teardown ERROR spoils a pass, but a failed call stays FAILED."""
    if earlier == FAILED and later == ERROR:
        return FAILED
    return later


def parse_report(text: str) -> dict[str, str]:
    """Map each test id (pytest nodeid) in a plugin report to PASSED, FAILED, SKIPPED, ERROR or XFAIL.

    A module that failed to collect maps to ERROR under the module's own id (`tests/test_x.py`).
    """
    statuses: dict[str, str] = {}
    for record in _records(text):
        status = _phase_status(record)
        if status is not None:
            statuses[record["nodeid"]] = _combine(statuses.get(record["nodeid"]), status)
    return statuses


def check_closing(records: list[dict]) -> None:
    """Raise Tampered unless the last record is the plugin's closing check, clean, after exactly its own lines."""
    end = records[-1] if records and records[-1].get("when") == "end" else None
    if end is None:
        raise Tampered("pytest ended before the report plugin's closing check (killed, crashed or cut short)")
    if end.get("tampered"):
        raise Tampered("; ".join(map(str, end["tampered"])))
    if end.get("lines") != len(records) - 1 or any(r.get("when") == "end" for r in records[:-1]):
        raise Tampered(f"the report holds {len(records) - 1} results but the plugin wrote {end.get('lines')}")


def read_report(sandbox, report_path: str) -> dict[str, str]:
    """The parsed report at `report_path` in `sandbox`; ReportMissing when there is no sign the suite ran,
    Tampered when the run changed how pytest reports (then no result of it counts)."""
    try:
        text = sandbox.read_file(report_path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ReportMissing(f"no test report at {report_path}: pytest did not start, or not with the plugin") from None
    records = _records(text)
    if not [r for r in records if r.get("when") != "end"]:
        raise ReportMissing(f"the test report at {report_path} has no test result: the suite did not run")
    check_closing(records)
    return parse_report(text)
