"""Structured pytest results for grading: install the `patchgym_report` plugin in a sandbox, read what it wrote.

Unlike parsing printed logs, a test that prints `PASSED tests/x.py::test_y` cannot change this result.
"""

import json
from pathlib import Path

from patchgym.env.grading.parsers import ERROR, FAILED, PASSED, SKIPPED, XFAIL

PLUGIN_DIR = "/opt/patchgym/grader"  # inside the sandbox, outside any workspace the agent edits
PLUGIN_MODULE = "patchgym_report"
PLUGIN_SOURCE = (Path(__file__).parent / "pytest_plugin.py").read_text()


class ReportMissing(Exception):
    """The report file is absent or holds no result: no sign the suite ran, which must not grade as a pass."""


def install_report_plugin(sandbox) -> dict[str, str]:
    """Write the plugin into PLUGIN_DIR in `sandbox`; return the env to run pytest with."""
    sandbox.write_file(f"{PLUGIN_DIR}/{PLUGIN_MODULE}.py", PLUGIN_SOURCE)
    return {"PYTHONPATH": PLUGIN_DIR}


def pytest_report_args(report_path: str) -> list[str]:
    """pytest arguments that load the plugin and send its report to `report_path`."""
    return ["-p", PLUGIN_MODULE, f"--patchgym-report={report_path}"]


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


def read_report(sandbox, report_path: str) -> dict[str, str]:
    """The parsed report at `report_path` in `sandbox`; ReportMissing when there is no sign the suite ran."""
    try:
        text = sandbox.read_file(report_path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ReportMissing(f"no test report at {report_path}: pytest did not start, or not with the plugin") from None
    if not _records(text):
        raise ReportMissing(f"the test report at {report_path} has no test result: the suite did not run")
    return parse_report(text)
