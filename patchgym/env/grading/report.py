"""Structured pytest results for grading: the report plugin installed where the tests can read it but not change it,
under a name that says nothing, writing each result to a side channel that only the sandbox's runner holds; pytest
run as the agent's user (never root, so nothing it starts can reach the runner), with no plugin the grader did not
name; what came through the channel read and checked.

Unlike parsing printed logs, a test that prints `PASSED tests/x.py::test_y` cannot change this result, and unlike a
report file, nothing the tests leave behind can rewrite it after the fact.
"""

import json
import secrets
import shlex
import string
from dataclasses import dataclass
from pathlib import Path

from patchgym.env.grading.report_reader import ReportMissing, Tampered, durations, statuses_of
from patchgym.sandbox import ExecResult, Sandbox, SandboxError

PLUGIN_SOURCE = (Path(__file__).parent / "pytest_plugin.py").read_text()
READER_SOURCE = (Path(__file__).parent / "report_reader.py").read_text()  # for exported verifiers
SIDE_CHANNEL_FD = 3  # patchgym.sandbox.runner.SIDE_CHANNEL_FD, the descriptor a command's side channel is on
CHANNEL_LIMIT = 64 << 20  # a report larger than this is not an honest one
# How a factory task's tests run when graded (and validated): the report is the verdict, so no tracebacks (inverse
# canaries fail by design, and formatting a failure costs more than running the test); test modules imported as
# Python imports them, so the plugin can check each test's code against its file exactly (assertion rewriting would
# cost as much again to check; it changes messages, not outcomes).
FACTORY_ARGS = "--tb=no --assert=plain"
__all__ = ["ReportMissing", "Tampered"]  # re-exported: callers catch them from here


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


def neutral_name(length: int = 10) -> str:
    """A random name (letters only) for what the grader puts where the tests can see it."""
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(length))


@dataclass(frozen=True)
class InstalledPlugin:
    """The report plugin as installed: `-p module`, found on `directory`."""

    directory: str
    module: str

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": self.directory}


def plugin_source(target: int | str = SIDE_CHANNEL_FD, strict: bool = False) -> str:
    """The plugin's source set to write to `target` (a descriptor, or a file path), `strict` or not."""
    source = PLUGIN_SOURCE.replace("\n_TARGET = 3  #", f"\n_TARGET = {target!r}  #", 1)
    return source.replace("\n_STRICT = False  #", f"\n_STRICT = {strict!r}  #", 1)


def install_report_plugin(sandbox: Sandbox, strict: bool = False) -> InstalledPlugin:
    """Write the plugin, set to the side channel, into a fresh root-owned directory of `sandbox` that any user can
    read; both named at random."""
    plugin = InstalledPlugin(f"/tmp/{neutral_name()}", f"_{neutral_name()}")
    sandbox.exec(["mkdir", "-m", "755", plugin.directory])
    sandbox.write_file(f"{plugin.directory}/{plugin.module}.py", plugin_source(SIDE_CHANNEL_FD, strict), mode=0o644)
    return plugin


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


def plugin_args(module: str, plugins: list[str] | None) -> list[str]:
    """pytest arguments that load the report plugin first, then `plugins`."""
    return ["-p", module] + [arg for name in plugins or () for arg in ("-p", name)]


def pytest_command(command: str, plugin: InstalledPlugin, plugins: list[str] | None) -> str:
    """`command` (a pytest run) with autoload off, only `plugins` and the report plugin loaded; with `plugins` None
    autoload stays on (an imported row's environment, whose harness loads its plugins so).

    PYTHONSAFEPATH: `python -m pytest` must not put the workspace first on sys.path, where a file from the patch
    could stand in for pytest or for the plugin before either is imported. PYTEST_PLUGINS and PYTEST_ADDOPTS are the
    grader's to set, and it sets neither.
    """
    autoload = "" if plugins is None else "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
    env = f"PYTHONSAFEPATH=1 {autoload}PYTHONPATH={plugin.directory}${{PYTHONPATH:+:$PYTHONPATH}}"
    args = shlex.join(plugin_args(plugin.module, plugins))
    return f"export {env}; unset PYTEST_PLUGINS PYTEST_ADDOPTS; {command} {args}"


def run_reported(sandbox: Sandbox, command: str | list[str], cwd: str, timeout: float,
                 output_limit: int | None = None) -> ExecResult:
    """Run `command` (one that loads the report plugin) as the agent's user, with the side channel the plugin
    writes to."""
    return sandbox.exec(command, cwd=cwd, timeout=timeout, output_limit=output_limit, agent=True,
                        side_channel=CHANNEL_LIMIT)


def read_report(run: ExecResult) -> dict[str, str]:
    """The statuses the plugin sent through `run`'s side channel; ReportMissing when there is no sign the suite ran,
    Tampered when the run changed how tests run or report, or something besides the plugin wrote to the channel."""
    if run.side_channel_overflow:
        raise Tampered(f"the test run sent over {CHANNEL_LIMIT >> 20} MB through the report channel")
    if not run.side_channel:
        raise ReportMissing("no test result came through the report channel: pytest did not start, or not with the "
                            "report plugin")
    return statuses_of(run.side_channel, "the report channel")


def read_durations(run: ExecResult) -> dict[str, float]:
    """Each test's seconds in `run`'s report (read_report first: this one trusts the records it reads)."""
    return durations(run.side_channel)
