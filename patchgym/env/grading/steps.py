"""The steps the fresh-sandbox families of patchgym's own rows share, around the candidate patch:

    before: the bug applied -> the workspace committed to the grader's snapshot (git, outside the workspace)
    after:  every owned file the patch changed put back, new ones dropped (owned.py) -> the hidden tests written

and the grader's private directory, where the tests (the agent's user) can neither read nor list.
"""

import re
import shlex

from patchgym.env.grading.owned import grader_owns
from patchgym.env.workspace import PatchApplyError, apply_patch
from patchgym.sandbox import Sandbox, SandboxError
from patchgym.tasks.task import Task

# The grader's own files, where the tests (the agent's user) can neither read nor list: under root's home, 0700.
GRADER_DIR = "/root/.grading"
SNAPSHOT = f"GIT_DIR={GRADER_DIR}/snapshot.git"
LOG_LIMIT = 16 << 20
UNTRACKED_SEPARATOR = "--patchgym-untracked--"
CREATED_FILE = re.compile(r"^--- /dev/null\n\+\+\+ b/(.+)$", re.MULTILINE)


def make_grader_dir(sandbox: Sandbox) -> None:
    sandbox.exec(f"mkdir -p -m 700 {GRADER_DIR} && chmod 700 /root")


def start_from_bug(sandbox: Sandbox, task: Task) -> None:
    """Apply the task's bug and commit the workspace to the grader's snapshot, with the owned files .gitignore hides
    (an editable install's `*.egg-info`): the patch's changes to those are undone too, and they are never taken for
    new ones."""
    wd = task.workdir
    apply_patch(sandbox, task.bug_patch, wd, "bug")
    _git(sandbox, "init -q", wd)
    _git(sandbox, "add -A", wd)
    hidden = [p for p in _git(sandbox, "ls-files --others", wd).splitlines() if grader_owns(p, task)]
    if hidden:
        _git(sandbox, "add -f -- " + " ".join(shlex.quote(p) for p in hidden), wd)
    _git(sandbox, "-c user.name=g -c user.email=g@g commit -qm snapshot", wd)


def restore_owned_and_write_tests(sandbox: Sandbox, task: Task) -> None:
    """Undo whatever the patch did to files the grader owns (restore changed or deleted ones, remove new ones), then
    apply the test_patch, the files it makes from nothing (a factory task's hidden tests) removed first."""
    wd = task.workdir
    listing = _git(sandbox, f"diff --name-only --no-renames && echo {UNTRACKED_SEPARATOR} && "
                            f"{SNAPSHOT} GIT_WORK_TREE=. git -c core.quotepath=off ls-files --others", wd)
    changed, _, new = (part.splitlines() for part in listing.partition(f"{UNTRACKED_SEPARATOR}\n"))
    restore = [p for p in changed if grader_owns(p, task)]
    remove = [p for p in new if grader_owns(p, task)]
    if restore:
        _git(sandbox, "checkout -- " + " ".join(shlex.quote(p) for p in restore), wd)
    if remove:
        sandbox.exec(["rm", "-f", "--", *remove], cwd=wd)
    created = CREATED_FILE.findall(task.test_patch)
    if created:
        sandbox.exec(["rm", "-f", "--", *created], cwd=wd)
    try:
        apply_patch(sandbox, task.test_patch, wd, "tests")
    except PatchApplyError as exc:
        raise SandboxError(f"task {task.instance_id}: its test_patch does not apply: {exc}") from exc


def clear_bytecode(sandbox: Sandbox, wd: str) -> None:
    """Remove every compiled module in the workspace: a cache the patch planted would be run in place of its source
    (pytest reads its assertion-rewrite caches even where it may not write them)."""
    sandbox.exec("find . -name __pycache__ -type d -prune -exec rm -rf {} + ; find . -name '*.py[co]' -delete",
                 cwd=wd, timeout=300)


def no_results_detail(detail: str, exit_code: int | None, output: str) -> str:
    return f"{detail}; exit code {exit_code}; log tail:\n{output[-2000:]}"


def _git(sandbox: Sandbox, args: str, cwd: str) -> str:
    result = sandbox.exec(f"{SNAPSHOT} GIT_WORK_TREE=. git -c core.quotepath=off {args}", cwd=cwd, timeout=600,
                          output_limit=LOG_LIMIT)
    if not result.ok:
        raise SandboxError(f"grader: git {args.split()[0]} failed: {result.output[-2000:]}")
    return result.output
