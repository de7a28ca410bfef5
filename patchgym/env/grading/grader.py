"""The reward: grade a patch in a fresh sandbox, with the grader's own tests and test configuration.

    start from the task's image -> bug_patch -> snapshot (git, outside the workspace) -> candidate patch ->
    put back every test file, test config and packaging metadata the grader owns, drop new ones -> test_patch ->
    canaries -> run (as the agent's user, the report through the side channel) -> read -> judge

Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passed (XFAIL counts as passed, as in SWE-bench, except
on a factory task; skipped or missing counts as failed). A patch that does not apply, a dead sandbox, a timeout or a
run with no sign that the suite ran is an `error`, reported as such, never a silent 0.

A factory task (pytest's report plugin, or tape's reporter) is graded as if the code under test were hostile
(docs/guides/tasks.md, "What the reward resists"): its tests run as the agent's user with autoload off and only the
plugins installed before the patch, their report leaves through a channel they cannot rewrite, and a run that shows
forgery (the plugin's closing check, records it did not write, a canary with the wrong result) is `tampered`.

An imported dataset row (`task.imported`) is graded as its own harness grades it: the candidate patch, then the row's
eval script, which resets exactly the test_patch's files and applies it; the grader undoes only the patch's changes
to files that run code when Python starts (harness.RUNS_AT_START). Its pytest doors are closed by how pytest is
invoked instead (see patchgym.env.grading.harness), and where pytest runs the tests its structured report is the
verdict, the log parser's disagreement recorded.
"""

import re
import secrets
import shlex
import time

from patchgym.env.grading import harness, parsers, report, smith_harness, swebench_harness, tape
from patchgym.env.grading.canaries import judge, without_planted
from patchgym.env.grading.canaries.plant import plant_canaries
from patchgym.env.grading.grade import Grade
from patchgym.env.workspace import PatchApplyError, apply_patch, check_out_start
from patchgym.sandbox import Sandbox, SandboxConfig, SandboxError, open_sandbox
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import Task, TaskError
from patchgym.tasks.specs import SMITH_PROFILE_PARSER

PASSING = ("PASSED", "XFAIL")
# A factory task's tests passed in both clean runs: an xfail now is a mark the patch added, not a pass.
FACTORY_PASSING = ("PASSED",)
REPORT_PARSER = "patchgym_report"
# The grader's own files, where the tests (the agent's user) can neither read nor list: under root's home, 0700.
GRADER_DIR = "/root/.grading"
EVAL_SCRIPT = f"{GRADER_DIR}/eval.sh"
NONCE_FILE = f"{GRADER_DIR}/nonce"
PYTEST_CONFIG_DIR = f"{GRADER_DIR}/pytest-config"
SNAPSHOT = f"GIT_DIR={GRADER_DIR}/snapshot.git"
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
# What Node.js and JavaScript test runners read their configuration or modules from (JavaScript tasks).
JS_CONFIG_PATH = re.compile(r"(^|/)(package\.json|\.npmrc|\.taprc|\.mocharc(\.[a-z]+)?|jest\.config\.[a-z]+|"
                            r"\.babelrc(\.[a-z]+)?|babel\.config\.[a-z]+)$|(^|/)node_modules(/|$)")


def grader_owns(path: str, task: Task) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (path in task.test_files or name in CONFIG_NAMES or bool(METADATA_PATH.search(path))
            or bool(TEST_PATH.search(path)) or bool(JS_CONFIG_PATH.search(path)))


def grade_patch(task: Task, patch: str, config: SandboxConfig | None = None, *, timeout: float = 300.0,
                retries: int = 1, pools: PoolSet | None = None) -> Grade:
    """Grade `patch` for `task` in a fresh sandbox (from `pools` when given, so warm ones skip the start).

    A dead sandbox is retried `retries` times before the grade is an `infra` error.
    """
    if task.harbor is not None:
        raise TaskError(f"task {task.instance_id} is a Harbor task: its own verifier grades the agent's sandbox as "
                        "the episode ends, not a patch (check it with `patchgym eval --policy oracle`)")
    config = config or SandboxConfig()
    start = time.monotonic()
    image = task.image or None
    for _ in range(retries + 1):
        try:
            with pools.sandbox(image) if pools else open_sandbox(config, image=image) as sandbox:
                sandbox.exec(f"mkdir -p -m 700 {GRADER_DIR} && chmod 700 /root")
                grade = (_grade_imported if task.imported else _grade_in)(sandbox, task, patch, timeout)
            break
        except SandboxError as exc:
            grade = Grade(instance_id=task.instance_id, error="infra", error_detail=str(exc))
    grade.duration = time.monotonic() - start
    grade.tests_known_to_run = not task.imported or task.validated
    return grade


def _git(sandbox: Sandbox, args: str, cwd: str) -> str:
    result = sandbox.exec(f"{SNAPSHOT} GIT_WORK_TREE=. git -c core.quotepath=off {args}", cwd=cwd, timeout=600,
                          output_limit=LOG_LIMIT)
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
        return Grade(instance_id=task.instance_id, error="apply_failed", error_detail=str(exc))
    _restore_owned(sandbox, task, wd)
    created = _CREATED.findall(task.test_patch)
    if created:  # files the test_patch makes from nothing (a factory task's hidden tests) go first
        sandbox.exec(["rm", "-f", "--", *created], cwd=wd)
    try:
        apply_patch(sandbox, task.test_patch, wd, "tests")
    except PatchApplyError as exc:
        raise SandboxError(f"task {task.instance_id}: its test_patch does not apply: {exc}") from exc
    if task.log_parser not in (REPORT_PARSER, tape.TAPE_PARSER):  # a row graded from its printed log
        run = sandbox.exec(task.test_cmd or task.eval_script, cwd=wd, timeout=timeout, output_limit=LOG_LIMIT)
        if run.timed_out:
            return _timed_out(task, run, timeout)
        return _verdict(task, parsers.parse_log(run.output, task.log_parser), run, "no test results in the log",
                        PASSING)

    canaries = plant_canaries(sandbox, task, javascript_tests=task.log_parser == tape.TAPE_PARSER)
    if task.log_parser == REPORT_PARSER:
        _clear_bytecode(sandbox, wd)
        command = report.pytest_command(f"{task.test_cmd} {report.FACTORY_ARGS}",
                                        report.install_report_plugin(sandbox, strict=True), plugins)
    else:
        command = tape.tape_command(task.test_cmd, tape.install_tape_reporter(sandbox))
    run = report.run_reported(sandbox, command, wd, timeout, LOG_LIMIT)
    if run.timed_out:
        return _timed_out(task, run, timeout)
    try:
        statuses = report.read_report(run)
    except report.Tampered as exc:
        return Grade(instance_id=task.instance_id, error="tampered", error_detail=str(exc), exit_code=run.exit_code)
    except report.ReportMissing as exc:
        return _verdict(task, {}, run, str(exc), FACTORY_PASSING)
    problems = judge(canaries, statuses)
    if problems:
        return Grade(instance_id=task.instance_id, error="tampered", error_detail="; ".join(problems[:5]),
                     exit_code=run.exit_code)
    return _verdict(task, without_planted(statuses, canaries), run, "no test results", FACTORY_PASSING)


def _timed_out(task: Task, run, timeout: float) -> Grade:
    return Grade(instance_id=task.instance_id, error="timeout", error_detail=f"tests ran over {timeout:g} s",
                 exit_code=run.exit_code)


def _verdict(task: Task, statuses: dict[str, str], run, detail: str, passing: tuple[str, ...]) -> Grade:
    """Resolved iff every FAIL_TO_PASS and PASS_TO_PASS test has a `passing` status; no_tests_ran without any."""
    if not statuses:
        return Grade(instance_id=task.instance_id, error="no_tests_ran", exit_code=run.exit_code,
                     error_detail=f"{detail}; exit code {run.exit_code}; log tail:\n{run.output[-2000:]}")
    f2p = {t: statuses.get(t, "MISSING") for t in task.FAIL_TO_PASS}
    p2p = {t: statuses.get(t, "MISSING") for t in task.PASS_TO_PASS}
    resolved = all(s in passing for s in (*f2p.values(), *p2p.values()))
    return Grade(instance_id=task.instance_id, resolved=resolved, tests=statuses, f2p=f2p, p2p=p2p,
                 exit_code=run.exit_code)


def _clear_bytecode(sandbox: Sandbox, wd: str) -> None:
    """Remove every compiled module in the workspace: a cache the patch planted would be run in place of its source
    (pytest reads its assertion-rewrite caches even where it may not write them)."""
    sandbox.exec("find . -name __pycache__ -type d -prune -exec rm -rf {} + ; find . -name '*.py[co]' -delete",
                 cwd=wd, timeout=300)


def _grade_imported(sandbox: Sandbox, task: Task, patch: str, timeout: float) -> Grade:
    wd = task.workdir
    check_out_start(sandbox, task)
    apply_patch(sandbox, task.bug_patch, wd, "bug")  # a row carries none; a replica built on the base image may
    script = task.eval_script or harness.script_for(task)
    harness.check_markers(task, script)
    exports = ""
    pytest_row = task.log_parser in harness.PYTEST_PARSERS or swebench_harness.runs_pytest(task.log_parser)
    if pytest_row:  # all read before the patch can change them
        plugins = report.installed_plugins(sandbox, wd, prelude=harness.environment_prelude(script, wd))
        plugin = report.install_report_plugin(sandbox)
        exports = harness.pytest_exports(report.plugin_args(plugin.module, None), plugins,
                                         _copy_pytest_config(sandbox, wd), wd, plugin.directory)
    startup = {p: _read(sandbox, f"{wd}/{p}") for p in harness.patch_paths(patch) if harness.RUNS_AT_START.search(p)}
    try:
        apply_patch(sandbox, patch, wd, "candidate")
    except PatchApplyError as exc:
        return Grade(instance_id=task.instance_id, error="apply_failed", error_detail=str(exc))
    for path, original in startup.items():
        if original is None:
            sandbox.exec(["rm", "-rf", "--", path], cwd=wd)
        else:
            sandbox.write_file(f"{wd}/{path}", original)
    nonce = secrets.token_hex(16)
    sandbox.write_file(NONCE_FILE, nonce)
    sandbox.write_file(EVAL_SCRIPT, harness.prepared_script(script, NONCE_FILE, exports))
    # As root, as the row's own harness runs it (its scripts reset files and install); its pytest's report still
    # leaves through the side channel.
    run = sandbox.exec(["bash", EVAL_SCRIPT], cwd=wd, timeout=timeout, output_limit=LOG_LIMIT,
                       side_channel=report.CHANNEL_LIMIT if pytest_row else None)
    grade = Grade(instance_id=task.instance_id, exit_code=run.exit_code)
    if run.timed_out:
        return grade.model_copy(update={"error": "timeout", "error_detail": f"tests ran over {timeout:g} s"})
    log = harness.trusted_log(run.output, nonce)
    if log is None:
        return grade.model_copy(update={"error": "no_tests_ran", "error_detail": "the eval script never printed "
                                        f"its test output markers; log tail:\n{run.output[-2000:]}"})
    official = swebench_harness.is_swebench_parser(task.log_parser)
    smith = task.log_parser == SMITH_PROFILE_PARSER  # the profile's own parser and verdict, in the harness venv
    report_of = smith_harness.smith_report if smith else (swebench_harness.official_report if official
                                                          else harness.harness_report)
    statuses, _, logged_resolved = report_of(task, log)
    code = harness.test_exit_code(log)
    grade.exit_code = run.exit_code if code is None else code
    if pytest_row:
        try:
            reported = harness.as_logged(task, report.read_report(run))
        except report.Tampered as exc:
            return grade.model_copy(update={"error": "tampered", "error_detail": str(exc)})
        except report.ReportMissing as exc:
            return grade.model_copy(update={"error": "no_tests_ran", "error_detail": f"{exc}; log tail:\n"
                                            f"{log[-2000:]}"})
        grade.parser_disagreement = harness.disagreement(statuses, reported)
        statuses = reported
    if not statuses:
        return grade.model_copy(update={"error": "no_tests_ran", "error_detail": "no test results in the marked "
                                        f"output; log tail:\n{log[-2000:]}"})
    return grade.model_copy(update={
        # swesmith's verdict is on its own log parse; the others judge `statuses`, pytest's report where it ran
        "resolved": logged_resolved if smith else (swebench_harness.official_resolved if official
                                                   else harness.harness_resolved)(task, statuses),
        "tests": statuses,
        "f2p": {t: statuses.get(t, "MISSING") for t in task.FAIL_TO_PASS},
        "p2p": {t: statuses.get(t, "MISSING") for t in task.PASS_TO_PASS}})


def _read(sandbox: Sandbox, path: str) -> bytes | None:
    try:
        return sandbox.read_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None


def _copy_pytest_config(sandbox: Sandbox, wd: str) -> str:
    """Copy the file pytest takes its configuration from in `wd` (before the patch) into the grader's directory;
    return the copy's path, or an empty `pytest.ini` where there is none (so that one the patch adds is not read)."""
    for name, section in harness.CONFIG_FILES:
        text = _read(sandbox, f"{wd}/{name}")
        if text is not None and (section is None or section.search(text.decode("utf-8", "replace"))):
            sandbox.write_file(f"{PYTEST_CONFIG_DIR}/{name}", text)
            return f"{PYTEST_CONFIG_DIR}/{name}"
    sandbox.write_file(f"{PYTEST_CONFIG_DIR}/pytest.ini", "")
    return f"{PYTEST_CONFIG_DIR}/pytest.ini"
