"""The execution-based verifier: per candidate patch, (a) passes of the repository's own tests that touch the changed
modules, and (b) passes of reproduction tests generated from the issue (repro.py).

Per task, one sandbox on the unpatched workspace picks the regression test files (those importing, or named after,
a module that any candidate changes: one set per task, so counts compare across candidates; the task's hidden
test files never count) and runs every reproduction test. Then each candidate gets a fresh sandbox: its patch is
applied, the test files and test config the grader owns are put back, the regression files run under pytest with
patchgym's report plugin, and each reproduction test runs on a clean copy of that state. A reproduction test is kept
only if it fails on the unpatched repository and passes on at least one candidate. A sandbox that dies (after
`retries`) is an infra error of that candidate (or task), recorded, never a crash.
"""

import json
import re
import shlex
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from patchgym.env.grading import report
from patchgym.env.grading.families import family_of
from patchgym.env.grading.owned import grader_owns
from patchgym.env.grading.parsers import PASSING
from patchgym.env.workspace import PatchApplyError, apply_patch, prepare_workspace
from patchgym.sandbox import Sandbox, SandboxConfig, SandboxError
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import Task, TaskError
from patchgym.verify.config import VerifierConfig

FIND_SCRIPT = "/tmp/.patchgym-verify/find_tests.py"
_CHANGED = re.compile(r"^(?:\+\+\+ b|--- a)/([^\t\n]+)", re.MULTILINE)
_SOURCE_ROOTS = ("src/", "lib/")
_SEPARATOR = "--patchgym-untracked--"
_COMMIT = "git -c user.name=patchgym -c user.email=patchgym@localhost commit -q --no-verify --allow-empty -m"

# Runs inside the sandbox (stdlib only): the test files that import a changed module, or are named after it; for a
# module no test names directly, those that import its top-level package (`from pkg import name` reaches it).
_FIND_TESTS = r'''
import ast, json, os, sys
modules, excluded = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
skip = {"node_modules", "build", "dist", "site-packages", "__pycache__", "venv"}
imports = {}
for root, dirs, names in os.walk("."):
    dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("."))
    for name in sorted(names):
        if not (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))):
            continue
        path = os.path.relpath(os.path.join(root, name))
        if path in excluded:
            continue
        try:
            tree = ast.parse(open(path, "rb").read())
        except (SyntaxError, ValueError):
            continue
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(node.module + "." + a.name for a in node.names)
        imports[path] = found
chosen = set()
for module in modules:
    stem = module.rsplit(".", 1)[-1]
    direct = {p for p, names in imports.items()
              if any(n == module or n.startswith(module + ".") for n in names)
              or os.path.basename(p)[:-3] in ("test_" + stem, stem + "_test")}
    top = module.split(".")[0]
    chosen |= direct or {p for p, names in imports.items() if any(n.split(".")[0] == top for n in names)}
print(json.dumps(sorted(chosen)))
'''


@dataclass
class CandidateCheck:
    """What one candidate patch got; counts are None when its sandbox failed (error "infra")."""

    regression_passed: int | None = None
    regression_total: int | None = None
    repro: dict[int, bool] = field(default_factory=dict)  # reproduction test index -> passed
    repro_passed: int | None = None  # over the kept reproduction tests
    error: str | None = None  # apply (the patch does not apply: counts as 0 passes) | infra
    error_detail: str = ""


@dataclass
class TaskChecks:
    regression_files: list[str]
    repro_tests: list[str]
    baseline: dict[int, bool]  # reproduction test index -> passed on the unpatched repository
    kept: list[int]
    candidates: dict[str, CandidateCheck]
    error: str | None = None  # the unpatched sandbox failed: no reproduction test can be kept


def changed_modules(patch: str, task: Task) -> list[str]:
    """Dotted names of the non-test Python modules a patch touches (`src/pkg/mod.py` -> `pkg.mod`)."""
    modules = set()
    for path in _CHANGED.findall(patch):
        if not path.endswith(".py") or grader_owns(path, task):
            continue
        name = path[:-3]
        for root in _SOURCE_ROOTS:
            name = name.removeprefix(root)
        name = name.removesuffix("/__init__")
        if name and name != "__init__":
            modules.add(name.replace("/", "."))
    return sorted(modules)


def check_candidates(tasks: Mapping[str, Task], patches: Mapping[str, Mapping[str, str]],
                     repro_tests: Mapping[str, list[str]], config: VerifierConfig, sandbox: SandboxConfig,
                     advance: Callable[[], None] = lambda: None) -> dict[str, TaskChecks]:
    """{task id: TaskChecks} for `patches` ({task id: {candidate id: patch}}); `advance` is called per sandbox."""
    with PoolSet(sandbox, size=max(sandbox.pool_size, 1), max_concurrency=config.max_sandboxes) as pools, \
            ThreadPoolExecutor(max_workers=config.max_sandboxes, thread_name_prefix="verify-eb") as pool:
        def job(fn, *args):
            def run():
                try:
                    return fn(*args)
                finally:
                    advance()
            return pool.submit(run)

        baselines = {}
        for task_id, candidates in patches.items():
            task = tasks[task_id]
            modules = sorted({m for patch in candidates.values() for m in changed_modules(patch, task)})
            baselines[task_id] = job(_baseline, task, modules, repro_tests.get(task_id, []), config, pools)
        found = {task_id: future.result() for task_id, future in baselines.items()}
        checks = {task_id: {cid: job(_candidate, tasks[task_id], patch, found[task_id][0],
                                     repro_tests.get(task_id, []), config, pools)
                            for cid, patch in candidates.items()}
                  for task_id, candidates in patches.items()}
        return {task_id: _tally(found[task_id], repro_tests.get(task_id, []),
                                {cid: f.result() for cid, f in futures.items()})
                for task_id, futures in checks.items()}


def _tally(baseline: tuple[list[str], dict[int, bool], str | None], tests: list[str],
           candidates: dict[str, CandidateCheck]) -> TaskChecks:
    files, passed_unpatched, error = baseline
    measured = [c for c in candidates.values() if c.error is None]
    kept = [] if error else [i for i in range(len(tests)) if passed_unpatched.get(i) is False
                             and any(c.repro.get(i) for c in measured)]
    for check in candidates.values():
        if check.error != "infra":
            check.repro_passed = sum(bool(check.repro.get(i)) for i in kept)
    return TaskChecks(files, list(tests), passed_unpatched, kept, candidates, error)


def _with_retries(task: Task, config: VerifierConfig, pools: PoolSet, work: Callable[[Sandbox], object]):
    """work(sandbox) in a fresh sandbox of the task's workspace; a SandboxError is retried, then returned."""
    error: Exception | None = None
    for _ in range(config.retries + 1):
        try:
            with pools.sandbox(task.image or None, workdir=task.workdir) as sandbox:
                prepare_workspace(sandbox, task)
                return work(sandbox)
        except (SandboxError, TaskError) as exc:
            error = exc
    return error


def _baseline(task: Task, modules: list[str], tests: list[str], config: VerifierConfig,
              pools: PoolSet) -> tuple[list[str], dict[int, bool], str | None]:
    """(regression files, reproduction results on the unpatched repository, error)."""
    def work(sandbox: Sandbox):
        return _find_regression_files(sandbox, task, modules), _run_repro(sandbox, task, tests, config)

    result = _with_retries(task, config, pools, work)
    if isinstance(result, Exception):
        return [], {}, f"{type(result).__name__}: {result}"
    return (*result, None)


def _candidate(task: Task, patch: str, files: list[str], tests: list[str], config: VerifierConfig,
               pools: PoolSet) -> CandidateCheck:
    def work(sandbox: Sandbox) -> CandidateCheck:
        wd = task.workdir
        # Factory tasks run as the grader runs them: autoload off, only the plugins installed before the patch.
        # Imported rows keep autoload on, as their own harness runs their (possibly old) pytest.
        plugins = family_of(task).plugins_before_patch(sandbox, task)
        _commit_hidden_owned(sandbox, task)
        try:
            apply_patch(sandbox, patch, wd, "candidate")
        except PatchApplyError as exc:
            return CandidateCheck(0, 0, error="apply", error_detail=str(exc)[-2000:])
        _restore_owned(sandbox, task)
        _exec(sandbox, f"git add -A && {_COMMIT} candidate", wd)
        passed, total = _run_regression(sandbox, task, files, plugins, config)
        return CandidateCheck(passed, total, _run_repro(sandbox, task, tests, config))

    result = _with_retries(task, config, pools, work)
    if isinstance(result, Exception):
        return CandidateCheck(error="infra", error_detail=f"{type(result).__name__}: {result}")
    return result


def _exec(sandbox: Sandbox, command: str, cwd: str) -> str:
    result = sandbox.exec(command, cwd=cwd, timeout=300)
    if not result.ok:
        raise SandboxError(f"verifier: `{command[:60]}` failed ({result.exit_code}): {result.output[-1000:]}")
    return result.output


def _find_regression_files(sandbox: Sandbox, task: Task, modules: list[str]) -> list[str]:
    if not modules:
        return []
    sandbox.write_file(FIND_SCRIPT, _FIND_TESTS)
    args = shlex.join([sandbox.config.python, FIND_SCRIPT, json.dumps(modules), json.dumps(task.test_files)])
    return json.loads(_exec(sandbox, args, task.workdir).strip().splitlines()[-1])


def _commit_hidden_owned(sandbox: Sandbox, task: Task) -> None:
    """Commit the owned files .gitignore hides (an editable install's `*.egg-info`), as the grader's snapshot does:
    _restore_owned then puts them back instead of taking them for the patch's new files."""
    listing = _exec(sandbox, "git -c core.quotepath=off ls-files --others", task.workdir)
    hidden = [p for p in listing.splitlines() if grader_owns(p, task)]
    if hidden:
        _exec(sandbox, f"git add -f -- {shlex.join(hidden)} && {_COMMIT} 'ignored metadata'", task.workdir)


def _restore_owned(sandbox: Sandbox, task: Task) -> None:
    """Undo what the patch did to files the grader owns (tests, test config): restore changed ones, drop new ones."""
    listing = _exec(sandbox, f"git -c core.quotepath=off diff --name-only --no-renames HEAD && echo {_SEPARATOR} && "
                             "git -c core.quotepath=off ls-files --others", task.workdir)
    changed, _, new = (part.splitlines() for part in listing.partition(f"{_SEPARATOR}\n"))
    restore = [p for p in changed if grader_owns(p, task)]
    remove = [p for p in new if grader_owns(p, task)]
    if restore:
        _exec(sandbox, "git checkout HEAD -- " + shlex.join(restore), task.workdir)
    if remove:
        _exec(sandbox, "rm -f -- " + shlex.join(remove), task.workdir)


def _run_regression(sandbox: Sandbox, task: Task, files: list[str], plugins: list[str] | None,
                    config: VerifierConfig) -> tuple[int, int]:
    """(passed, total) over the tests of `files`, from the report plugin (never from printed output), run as the
    grader runs it: as the agent's user, the report through the side channel, autoload off, only `plugins` (those
    installed before the patch); None: autoload on."""
    if not files:
        return 0, 0
    command = report.pytest_command(config.regression_cmd.format(files=shlex.join(files), workdir=task.workdir),
                                    report.install_report_plugin(sandbox), plugins)
    run = report.run_reported(sandbox, command, task.workdir, config.regression_timeout_s)
    try:
        statuses = report.read_report(run)
    except report.ReportMissing:  # Tampered too: a forged run counts as no regression test passing
        return 0, 0
    return sum(s in PASSING for s in statuses.values()), len(statuses)


def _run_repro(sandbox: Sandbox, task: Task, tests: list[str], config: VerifierConfig) -> dict[int, bool]:
    """{index: passed} of each reproduction test, each run on a clean copy of the committed workspace."""
    results = {}
    for i, source in enumerate(tests):
        _exec(sandbox, "git reset -q --hard && git clean -fdq", task.workdir)
        name = f"patchgym_repro_{i}.py"
        sandbox.write_file(f"{task.workdir}/{name}", source)
        run = sandbox.exec(config.repro_cmd.format(file=name, workdir=task.workdir), cwd=task.workdir,
                           timeout=config.repro_timeout_s)
        results[i] = run.ok
    return results
