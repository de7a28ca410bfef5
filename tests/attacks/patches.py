"""An attack as a patch for a task: its code appended to the module the task's bug is in (which the tests import),
as a unified diff of the task's starting workspace."""

import difflib
import functools

from patchgym.env.workspace import prepare_workspace
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.tasks import Task


def bug_file(task: Task) -> str:
    """The file the task's bug patch changes."""
    return task.bug_patch.split("\n", 1)[0].split(" b/", 1)[1]


@functools.lru_cache(maxsize=64)
def _starting_text(task_json: str, backend: str) -> str:
    task = Task.model_validate_json(task_json)
    with open_sandbox(SandboxConfig(backend=backend), image=task.image or None) as sandbox:
        prepare_workspace(sandbox, task)
        return sandbox.read_file(f"{task.workdir}/{bug_file(task)}").decode()


def appended(task: Task, code: str, backend: str = "docker") -> str:
    """The patch that appends `code` to the bug's file in the task's starting workspace."""
    path = bug_file(task)
    before = _starting_text(task.model_dump_json(), backend)
    if not before.endswith("\n"):
        before += "\n"  # (the factory's files end in a newline; a diff of one that does not needs its marker)
    separator = "\n" if path.endswith(".py") else "\n;\n"
    after = before + separator + code.strip("\n") + "\n"
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)
