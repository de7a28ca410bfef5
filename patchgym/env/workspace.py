"""A task's starting state in a sandbox, and applying patches to it.

The agent's workspace is a git repository whose only commit is the buggy state with the hidden test files
removed, so neither history nor disk reveals the fix or the tests it will be graded with.
"""

import shlex

from patchgym.sandbox import Sandbox, SandboxError
from patchgym.tasks.task import Task, TaskError

# The starting commit, copied out of the workspace where the agent's commands (another user) can neither read nor
# write: an agent that deletes or rewrites the workspace's .git still has its change diffed against the state it
# started from.
BASE_GIT_DIR = "/var/lib/patchgym/base.git"
PATCH_FILE = "/tmp/.patchgym-{name}.diff"  # removed right after: a bug patch left on disk would reveal the fix
# Tried in order, as SWE-bench does: exact first, then tolerant of whitespace and shifted context.
APPLY_COMMANDS = (
    "git apply --whitespace=nowarn {file}",
    "git apply --whitespace=nowarn --ignore-whitespace --recount -C1 {file}",
    "command -v patch >/dev/null && patch --batch --fuzz=5 -p1 -i {file}",
)


class PatchApplyError(RuntimeError):
    """A patch that none of the apply strategies could apply; the message has git's complaint."""


def apply_patch(sandbox: Sandbox, patch: str, cwd: str, name: str = "patch") -> str:
    """Apply a unified diff in `cwd`; returns the command that worked. Empty patches are a no-op."""
    if not patch.strip():
        return ""
    path = PATCH_FILE.format(name=name)
    sandbox.write_file(path, patch if patch.endswith("\n") else patch + "\n")
    errors = []
    for i, command in enumerate(APPLY_COMMANDS):
        cmd = command.format(file=shlex.quote(path))
        last = i == len(APPLY_COMMANDS) - 1
        # The file goes once it has been applied, or after the last try, in the same round trip.
        cleanup = "true" if last else '[ "$rc" = 0 ]'
        result = sandbox.exec(f"{cmd}; rc=$?; if {cleanup}; then rm -f {shlex.quote(path)}; fi; exit $rc",
                              cwd=cwd, timeout=120)
        if result.ok:
            return cmd
        errors.append(f"$ {cmd}\n{result.output.strip()}")
    raise PatchApplyError(f"{name} does not apply in {cwd}:\n" + "\n".join(errors)[-3000:])


def check_out_start(sandbox: Sandbox, task: Task) -> None:
    """Check out the task's start_ref in its image's repository (SWE-smith's instance branch); nothing without one."""
    if not task.start_ref:
        return
    result = sandbox.exec(["git", "checkout", "-q", "-f", task.start_ref], cwd=task.workdir, timeout=300)
    if not result.ok:
        # The image's fault, not the agent's: an infra outcome (and `tasks validate` lists the row as broken).
        raise SandboxError(f"task {task.instance_id}: its image has no git ref {task.start_ref!r} to start from in "
                        f"{task.workdir}: {result.output[-500:]}")


def prepare_workspace(sandbox: Sandbox, task: Task) -> str:
    """Turn a sandbox started from the task's image into the agent's workspace; returns the base commit."""
    wd = task.workdir
    check_out_start(sandbox, task)
    try:
        apply_patch(sandbox, task.bug_patch, wd, "bug")
    except PatchApplyError as exc:
        raise TaskError(f"task {task.instance_id}: its bug_patch does not apply to its image: {exc}") from exc
    hidden = " ".join(shlex.quote(p) for p in task.test_files)
    script = (
        (f"rm -f -- {hidden} && " if hidden else "")
        + "rm -rf .git && git init -q . && git add -A && "
        "git -c user.name=patchgym -c user.email=patchgym@localhost commit -q --no-verify -m 'Initial state' && "
        f"rm -rf {BASE_GIT_DIR} && mkdir -p -m 700 {BASE_GIT_DIR.rsplit('/', 1)[0]} && cp -a .git {BASE_GIT_DIR} && "
        "git rev-parse HEAD"
    )
    result = sandbox.exec(script, cwd=wd, timeout=600)
    if not result.ok:
        raise SandboxError(f"task {task.instance_id}: could not prepare the workspace in {wd}: {result.output}")
    sandbox.give_to_agent(wd)  # after the snapshot, which stays root's: the agent edits the workspace, not it
    return result.output.strip().splitlines()[-1]
