"""The reward: grade a patch in a fresh sandbox, with the grader's own tests and test configuration.

    start from the task's image -> bug_patch -> snapshot (git, outside the workspace) -> candidate patch ->
    put back every test file, test config and packaging metadata the grader owns, drop new ones -> test_patch ->
    run -> parse

Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passed (XFAIL counts as passed, as in SWE-bench;
skipped or missing counts as failed). A patch that does not apply, a dead sandbox, a timeout or a run with no
sign that the suite ran is an `error`, reported as such, never a silent 0.

With the report plugin (the factory's tasks) pytest runs with plugin autoload off and only the plugins installed
before the patch, and a run whose code changed how pytest reports is `tampered`. An imported dataset row runs its
own command and parser, as its harness does; it shares only the ownership of config and metadata files.
"""

import re
import shlex
import time

from patchgym.env.grading import parsers, report
from patchgym.env.grading.grade import Grade
from patchgym.env.workspace import PatchApplyError, apply_patch
from patchgym.sandbox import Sandbox, SandboxConfig, SandboxError, open_sandbox
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import Task

PASSING = ("PASSED", "XFAIL")
REPORT_PARSER = "patchgym_report"
REPORT_PATH = "/opt/patchgym/grader/report.jsonl"
SNAPSHOT = "GIT_DIR=/opt/patchgym/grader/snapshot.git"
LOG_LIMIT = 16 << 20
_SEPARATOR = "--patchgym-untracked--"
_CREATED = re.compile(r"^--- /dev/null\n\+\+\+ b/(.+)$", re.MULTILINE)
# Files that decide how tests run or what they check: the grader's copies always win over the patch's.
TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$")
# Every file pytest 9 reads its configuration from (`_pytest/config/findpaths.py`: CONFIG_LOADERS_BY_NAME), and the
# modules Python or pytest import on their own at start.
CONFIG_NAMES = {"pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg",
                "conftest.py", "sitecustomize.py", "usercustomize.py"}
# Packaging metadata, which can register a pytest plugin (entry_points.txt) or run code at start (*.pth); the
# workspace is on sys.path, so importlib.metadata finds distributions there.
METADATA_PATH = re.compile(r"\.(dist-info|egg-info)(/|$)|\.(pth|egg-link)$", re.IGNORECASE)


def grader_owns(path: str, task: Task) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (path in task.test_files or name in CONFIG_NAMES or bool(METADATA_PATH.search(path))
            or bool(TEST_PATH.search(path)))


def grade_patch(task: Task, patch: str, config: SandboxConfig | None = None, *, timeout: float = 300.0,
                retries: int = 1, pools: PoolSet | None = None) -> Grade:
    """Grade `patch` for `task` in a fresh sandbox (from `pools` when given, so warm ones skip the start).

    A dead sandbox is retried `retries` times before the grade is an `infra` error.
    """
    config = config or SandboxConfig()
    start = time.monotonic()
    image = task.image or None
    for _ in range(retries + 1):
        try:
            with pools.sandbox(image) if pools else open_sandbox(config, image=image) as sandbox:
                grade = _grade_in(sandbox, task, patch, timeout)
            break
        except SandboxError as exc:
            grade = Grade(instance_id=task.instance_id, error="infra", error_detail=str(exc))
    grade.duration = time.monotonic() - start
    return grade


def _git(sandbox: Sandbox, args: str, cwd: str) -> str:
    result = sandbox.exec(f"mkdir -p /opt/patchgym/grader && {SNAPSHOT} GIT_WORK_TREE=. git -c core.quotepath=off {args}", cwd=cwd,
                          timeout=600, output_limit=LOG_LIMIT)
    if not result.ok:
        raise SandboxError(f"grader: git {args.split()[0]} failed: {result.output[-2000:]}")
    return result.output


def _restore_owned(sandbox: Sandbox, task: Task, cwd: str) -> None:
    """Undo whatever the patch did to files the grader owns: restore changed/deleted ones, remove new ones."""
    listing = _git(sandbox, f"diff --name-only --no-renames && echo {_SEPARATOR} && "
                            f"{SNAPSHOT} GIT_WORK_TREE=. git -c core.quotepath=off ls-files --others", cwd)
    changed, _, new = (part.splitlines() for part in listing.partition(f"{_SEPARATOR}\n"))
    restore = [p for p in changed if grader_owns(p, task)]
    remove = [p for p in new if grader_owns(p, task)]
    if restore:
        _git(sandbox, "checkout -- " + " ".join(shlex.quote(p) for p in restore), cwd)
    if remove:
        sandbox.exec(["rm", "-f", "--", *remove], cwd=cwd)


def _snapshot(sandbox: Sandbox, task: Task, cwd: str) -> None:
    """Commit the workspace to the grader's snapshot, with the owned files .gitignore hides (an editable
    install's `*.egg-info`): the patch's changes to those are undone too, and they are never taken for new ones."""
    _git(sandbox, "init -q", cwd)
    _git(sandbox, "add -A", cwd)
    hidden = [p for p in _git(sandbox, "ls-files --others", cwd).splitlines() if grader_owns(p, task)]
    if hidden:
        _git(sandbox, "add -f -- " + " ".join(shlex.quote(p) for p in hidden), cwd)
    _git(sandbox, "-c user.name=g -c user.email=g@g commit -qm snapshot", cwd)


def _grade_in(sandbox: Sandbox, task: Task, patch: str, timeout: float) -> Grade:
    wd = task.workdir
    apply_patch(sandbox, task.bug_patch, wd, "bug")
    _snapshot(sandbox, task, wd)
    if task.log_parser == REPORT_PARSER:
        plugins = report.installed_plugins(sandbox, wd)  # before the patch can add one
    try:
        apply_patch(sandbox, patch, wd, "candidate")
    except PatchApplyError as exc:
        return Grade(instance_id=task.instance_id, error="apply", error_detail=str(exc))
    _restore_owned(sandbox, task, wd)
    created = _CREATED.findall(task.test_patch)
    if created:  # files the test_patch makes from nothing (a factory task's hidden tests) go first
        sandbox.exec(["rm", "-f", "--", *created], cwd=wd)
    try:
        apply_patch(sandbox, task.test_patch, wd, "tests")
    except PatchApplyError as exc:
        raise SandboxError(f"task {task.instance_id}: its test_patch does not apply: {exc}") from exc

    command = task.test_cmd or task.eval_script
    if task.log_parser == REPORT_PARSER:
        report.install_report_plugin(sandbox)
        command = report.pytest_command(command, REPORT_PATH, plugins)
    run = sandbox.exec(command, cwd=wd, timeout=timeout, output_limit=LOG_LIMIT)
    if run.timed_out:
        return Grade(instance_id=task.instance_id, error="timeout", error_detail=f"tests ran over {timeout:g} s",
                     exit_code=run.exit_code)
    if task.log_parser == REPORT_PARSER:
        try:
            statuses = report.read_report(sandbox, REPORT_PATH)
        except report.Tampered as exc:
            return Grade(instance_id=task.instance_id, error="tampered", error_detail=str(exc), exit_code=run.exit_code)
        except report.ReportMissing as exc:
            statuses, detail = {}, str(exc)
    else:
        statuses, detail = parsers.parse_log(run.output, task.log_parser), "no test results in the log"
    if not statuses:
        return Grade(instance_id=task.instance_id, error="no_tests_ran", exit_code=run.exit_code,
                     error_detail=f"{detail}; exit code {run.exit_code}; log tail:\n{run.output[-2000:]}")
    f2p = {t: statuses.get(t, "MISSING") for t in task.FAIL_TO_PASS}
    p2p = {t: statuses.get(t, "MISSING") for t in task.PASS_TO_PASS}
    resolved = all(s in PASSING for s in (*f2p.values(), *p2p.values()))
    return Grade(instance_id=task.instance_id, resolved=resolved, tests=statuses, f2p=f2p, p2p=p2p,
                 exit_code=run.exit_code)
