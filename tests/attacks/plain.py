"""The plain runners an attack must fool first: the task's tests run by hand with the framework's own reporting, in
a sandbox set up as for grading (bug, then the candidate patch, then the hidden tests), as root, then a second's
wait so that whatever the run left behind can finish.

- pytest: the task's own test command with `-rA --junitxml=REPORT`, `> LOG`; a FAIL_TO_PASS test passes
  when the junit XML has it without a failure, error or skip, or when the log, read as SWE-bench's harness reads a
  `-rA` log (parse_log_pytest), says PASSED or XFAIL.
- tape: every test file of the suite required by one node process, `> TAP`; a FAIL_TO_PASS test passes when the
  TAP file shows it
  with assertions, all `ok`.
An attack fools the plain runner when every FAIL_TO_PASS test passes by one of these readings.
"""

import re
import shlex
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

from patchgym.env.workspace import apply_patch
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.tasks import Task

OUT = "/tmp/plain"
_CREATED = re.compile(r"^--- /dev/null\n\+\+\+ b/(.+)$", re.MULTILINE)
TAPE_FILES = "test/*.js"  # every npm factory package's suite (npm/recipes.yaml)
_TAP_DRIVER = ("var path = require('path'); require(require('module').createRequire(path.join(process.cwd(), "
               "'index.js')).resolve('tape')); process.argv.slice(1).forEach(function (f) { require(path.resolve(f)); "
               "});")


@dataclass
class PlainRun:
    fooled: bool  # every FAIL_TO_PASS test passes by one of the runner's own readings
    passing: dict[str, bool]  # FAIL_TO_PASS test -> passes
    output: str


def prepare(sandbox, task: Task, patch: str) -> None:
    """The workspace as the grader sets it up before running: the bug, the candidate, the hidden tests."""
    apply_patch(sandbox, task.bug_patch, task.workdir, "bug")
    apply_patch(sandbox, patch, task.workdir, "candidate")
    created = _CREATED.findall(task.test_patch)
    if created:
        sandbox.exec(["rm", "-f", "--", *created], cwd=task.workdir)
    apply_patch(sandbox, task.test_patch, task.workdir, "tests")


def run_plain(task: Task, patch: str, backend: str = "docker") -> PlainRun:
    with open_sandbox(SandboxConfig(backend=backend, memory_mb=1024), image=task.image or None) as sandbox:
        prepare(sandbox, task, patch)
        sandbox.exec(["mkdir", "-p", OUT])
        if task.log_parser == "patchgym_tape":
            command = f"node -e {shlex.quote(_TAP_DRIVER)} {TAPE_FILES} > {OUT}/report.tap 2>&1"
        else:
            command = f"{task.test_cmd} -rA --junitxml={OUT}/report.xml > {OUT}/log 2>&1"
        result = sandbox.exec(f"{command}; sleep 1", cwd=task.workdir, timeout=300)
        texts = {name: _read(sandbox, f"{OUT}/{name}") for name in ("report.tap", "report.xml", "log")}
    if task.log_parser == "patchgym_tape":
        passing = tap_passing(texts["report.tap"], task.FAIL_TO_PASS)
    else:
        by_junit = junit_passing(texts["report.xml"], task.FAIL_TO_PASS)
        by_log = log_passing(texts["log"], task.FAIL_TO_PASS)
        passing = by_junit if all(by_junit.values()) else by_log
    return PlainRun(all(passing.values()), passing, result.output + "".join(texts.values())[-4000:])


def _read(sandbox, path: str) -> str:
    try:
        return sandbox.read_file(path).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def junit_passing(xml: str, tests: list[str]) -> dict[str, bool]:
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return dict.fromkeys(tests, False)
    passed = set()
    for case in root.iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            module = case.get("classname", "").replace(".", "/")
            passed.add((module.rsplit("/", 1)[-1], case.get("name")))
    return {t: (_module_of(t), t.split("::")[-1]) in passed for t in tests}


def _module_of(test: str) -> str:
    parts = test.split("::")
    return parts[-2] if len(parts) > 2 else parts[0].rsplit("/", 1)[-1].removesuffix(".py")


def log_passing(log: str, tests: list[str]) -> dict[str, bool]:
    """SWE-bench's parse_log_pytest: the last `STATUS test` line of each test wins; PASSED and XFAIL pass."""
    status = {}
    for line in log.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"):
            status[parts[1]] = parts[0]
    return {t: status.get(t) in ("PASSED", "XFAIL") for t in tests}


def tap_passing(tap: str, tests: list[str]) -> dict[str, bool]:
    results: dict[str, list[bool]] = {}
    current = None
    for line in tap.splitlines():
        if line.startswith("# "):
            current = line[2:].strip()
        elif current is not None and re.match(r"^(not )?ok \d+", line):
            results.setdefault(current, []).append(not line.startswith("not "))
    out = {}
    for test in tests:
        leaf = test.split("::", 1)[1].rsplit(" > ", 1)[-1]
        oks = results.get(leaf, [])
        out[test] = bool(oks) and all(oks)
    return out
