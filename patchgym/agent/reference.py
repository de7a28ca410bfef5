"""Reference policies that bound what a reward can be: `oracle` applies the gold fix through the tools, `null` gives up.

They check the whole environment and grader end to end: on a valid task set oracle must resolve 100%, null 0%.
"""

from typing import Protocol

from patchgym.env.tools.calls import ToolCall, render_call_xml
from patchgym.tasks import Task


class Policy(Protocol):
    def act(self, task: Task, observation: str, turn: int) -> str:
        """The next action text (one tool call) after `observation`; turn counts from 0."""


def _finish() -> str:
    return render_call_xml(ToolCall("finish", {}))


class OraclePolicy:
    """Applies the task's gold patch with one bash command, then submits."""

    def act(self, task: Task, observation: str, turn: int) -> str:
        if turn == 0 and task.patch.strip():
            delimiter = "PATCHGYM_GOLD_PATCH_END"
            command = f"git apply --whitespace=nowarn - <<'{delimiter}'\n{task.patch.rstrip(chr(10))}\n{delimiter}"
            return render_call_xml(ToolCall("execute_bash", {"command": command}))
        return _finish()


class NullPolicy:
    """Submits at once, changing nothing."""

    def act(self, task: Task, observation: str, turn: int) -> str:
        return _finish()


POLICIES = {"oracle": OraclePolicy, "null": NullPolicy}
