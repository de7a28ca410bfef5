"""An imported row's eval script, run the way its harness runs it but so that the patch cannot forge the verdict,
and the verdict read from its log as the harness reads it.

The row's eval script (SWE-bench's shape: it resets the test_patch's files, applies test_patch, and prints
`>>>>> Start Test Output` / `>>>>> End Test Output` around the test command) is changed in three ways only:
- its two markers become per-run random ones, read from a file the script deletes before anything of the patch
  runs, so no text the code under test prints can open or close the test output;
- where the tests run under pytest, exports make pytest load the grader's report plugin first, only the plugins
  installed before the patch (autoload off), and the grader's copy of the pytest configuration;
- nothing else: the files it resets are the row's, as in the official harness.
"""

import re
import shlex

from patchgym.env.grading import parsers
from patchgym.tasks.task import Task, TaskError

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
TEST_EXIT_CODE = re.compile(r">>>>> Test Exit Code:\s*(-?\d+)")
NONCE_VAR = "__patchgym_nonce"
# The parsers of rows whose tests pytest runs (the swebench parsers of pytest's `-rA` output): their verdict is
# pytest's structured report, the log only cross-checks it.
# swebench's own parser names (parse_log_*) are told by swebench_harness.runs_pytest.
PYTEST_PARSERS = frozenset({"pytest", "pytest_options", "pytest_v2", "matplotlib", "seaborn", "r2egym", "swesmith"})
# Where pytest finds its configuration, in the order pytest 9 tries the names in one directory, with the section
# that makes a file count (None: the file counts as it is) -- `_pytest/config/findpaths.py`.
CONFIG_FILES = (("pytest.toml", None), (".pytest.toml", None), ("pytest.ini", None), (".pytest.ini", None),
                ("pyproject.toml", re.compile(r"^\[tool\.pytest(\.ini_options)?\]", re.MULTILINE)),
                ("tox.ini", re.compile(r"^\[pytest\]", re.MULTILINE)),
                ("setup.cfg", re.compile(r"^\[tool:pytest\]", re.MULTILINE)))
# Files that run code when any Python starts (a `*.pth` in a site directory, `sitecustomize` / `usercustomize` on
# sys.path): a patch's changes to these are undone, since they would run before pytest and its report plugin.
RUNS_AT_START = re.compile(r"\.pth$|(^|/)(site|user)customize(\.|/|$)")
# A line of the script that activates the row's environment (SWE-bench: conda; a venv's activate).
_ACTIVATION = re.compile(r"^\s*(source|\.|conda activate|export)\s")
_PATCH_PATH = re.compile(r'^(?:(?:\+\+\+|---) (?:[ab]/)?|rename (?:from|to) |copy (?:from|to) )"?(.+?)"?$',
                         re.MULTILINE)
DISAGREEMENT_LIMIT = 100


def patch_paths(patch: str) -> set[str]:
    """Every path a unified diff creates, changes, deletes or renames (relative to the workspace)."""
    return {p for p in _PATCH_PATH.findall(patch) if p != "/dev/null"}


def script_for(task: Task) -> str:
    """An eval script of SWE-bench's shape for an imported row that has only a test command."""
    if not task.test_cmd:
        raise TaskError(f"task {task.instance_id}: an imported row needs an eval_script or a test_cmd")
    created = re.findall(r"^--- /dev/null\n\+\+\+ b/(.+)$", task.test_patch, re.MULTILINE)
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {shlex.quote(task.workdir)}"]
    if created:
        lines.append("rm -f -- " + " ".join(map(shlex.quote, created)))
    if task.test_patch.strip():
        lines += ["git apply -v - <<'EOF_PATCHGYM_TEST_PATCH'", task.test_patch.rstrip("\n"), "EOF_PATCHGYM_TEST_PATCH"]
    return "\n".join([*lines, f": '{START}'", task.test_cmd, "PATCHGYM_TEST_EXIT_CODE=$?", f": '{END}'",
                      'echo ">>>>> Test Exit Code: $PATCHGYM_TEST_EXIT_CODE"']) + "\n"


def check_markers(task: Task, script: str) -> None:
    if START not in script or END not in script:
        raise TaskError(f"task {task.instance_id}: its eval_script does not print {START!r} and {END!r} around its "
                        "test command, so its test output cannot be found")


def environment_prelude(script: str, workdir: str) -> str:
    """The lines of `script` before its test output that activate the row's environment (run before the patch, to
    list the pytest plugins installed there); without any, the workspace's own `.venv` (R2E-Gym's layout)."""
    head = script.split(START, 1)[0].splitlines()
    lines = [line for line in head if _ACTIVATION.match(line)]
    venv = shlex.quote(f"{workdir}/.venv/bin/activate")
    return "\n".join(lines) if lines else f"if [ -f {venv} ]; then . {venv}; fi"


def pytest_exports(report_args: list[str], plugins: list[str], config: str, workdir: str, plugin_dir: str) -> str:
    """Shell lines that make every pytest the script starts load the report plugin first, then only `plugins`,
    reading the configuration file `config` (the grader's copy) with `workdir` as its rootdir."""
    addopts = [*report_args, *(a for name in plugins for a in ("-p", name)), "-c", config, f"--rootdir={workdir}"]
    return (f"export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS={shlex.quote(shlex.join(addopts))}\n"
            f"export PYTHONPATH={plugin_dir}${{PYTHONPATH:+:$PYTHONPATH}}\nunset PYTEST_PLUGINS\n")


def prepared_script(script: str, nonce_file: str, exports: str = "") -> str:
    """`script` reading its run's nonce (and deleting the file) first, with its two markers printed with the nonce.

    Each line holding a marker is replaced by one that prints the nonce marker, whatever its quoting was.
    """
    lines = script.split("\n")
    shebang = [lines.pop(0)] if lines and lines[0].startswith("#!") else []
    read = f"read -r {NONCE_VAR} < {shlex.quote(nonce_file)}; rm -f {shlex.quote(nonce_file)}"
    body = [f'echo "{START} ${NONCE_VAR}"' if START in line else f'echo "{END} ${NONCE_VAR}"' if END in line
            else line for line in lines]
    return "\n".join([*shebang, read, exports.rstrip("\n"), *body])


def trusted_log(output: str, nonce: str) -> str | None:
    """The run's log as the row's harness would read it, from what the nonce markers enclose only: the test output,
    its own markers (any the code under test printed defused) and the test command's exit code; None when the
    script never printed both nonce markers."""
    start, end = f"{START} {nonce}", f"{END} {nonce}"
    if start not in output or end not in output.split(start, 1)[1]:
        return None
    section, tail = output.split(start, 1)[1].split(end, 1)
    section = section.replace(START, "[start marker printed by the tests]").replace(END, "[end marker printed by "
                                                                                          "the tests]")
    code = TEST_EXIT_CODE.search(tail)
    return f"{START}\n{section}\n{END}\n" + (f">>>>> Test Exit Code: {code.group(1)}\n" if code else "")


def test_exit_code(log: str) -> int | None:
    code = TEST_EXIT_CODE.search(log.rsplit(END, 1)[-1])
    return int(code.group(1)) if code else None


def harness_report(task: Task, log: str) -> tuple[dict[str, str], bool, bool]:
    """(status map, whether the log is a valid test run, resolved) for `log` (a trusted_log), as SWE-bench's
    get_logs_eval / get_eval_report read it: the marked section parsed with the row's parser; a run that exits
    non-zero while its log shows no failure is not valid (a patch printing its own PASSED lines)."""
    section = log.split(START, 1)[1].split(END, 1)[0]
    statuses = parsers.parse_log(section, task.log_parser)
    code = test_exit_code(log)
    if not statuses or (code not in (None, 0) and not any(s in (parsers.FAILED, parsers.ERROR)
                                                          for s in statuses.values())):
        return {}, False, False
    return statuses, True, harness_resolved(task, statuses)


def harness_resolved(task: Task, statuses: dict[str, str]) -> bool:
    """SWE-bench's rule: every FAIL_TO_PASS test passed (PASSED, XFAIL) and every PASS_TO_PASS one passed or was
    skipped; under eval_type fail_only a test fails only when it is reported FAILED."""
    if task.eval_type == "fail_only":
        return all(statuses.get(t) != parsers.FAILED for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS))
    passing = (parsers.PASSED, parsers.XFAIL)
    return (all(statuses.get(t) in passing for t in task.FAIL_TO_PASS)
            and all(statuses.get(t) in (*passing, parsers.SKIPPED) for t in task.PASS_TO_PASS))


def as_logged(task: Task, report: dict[str, str]) -> dict[str, str]:
    """pytest's structured report under the ids the row's log parser gives (its renaming rules and quirks): each
    result written as a short-summary line and read back by that parser."""
    if getattr(parsers.PARSERS.get(task.log_parser), "reads_verbose_lines", False):  # `pytest --verbose` lines
        lines = [f"{nodeid} {status}" for nodeid, status in report.items()]
    else:  # `pytest -rA`'s short summary, which R2E-Gym's parser reads only after its header
        lines = ["=== short test summary info ===", *(f"{status} {nodeid}" for nodeid, status in report.items())]
    return parsers.parse_log("\n".join(lines), task.log_parser)


def disagreement(logged: dict[str, str], reported: dict[str, str]) -> dict[str, list[str]]:
    """test -> [log's status, report's status] wherever they differ (MISSING where one lacks the test); at most
    DISAGREEMENT_LIMIT entries."""
    out = {}
    for test in sorted(logged.keys() | reported.keys()):
        pair = [logged.get(test, "MISSING"), reported.get(test, "MISSING")]
        if pair[0] != pair[1]:
            out[test] = pair
            if len(out) == DISAGREEMENT_LIMIT:
                break
    return out
