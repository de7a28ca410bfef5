"""Reference scripts that bound what a reward can be: `oracle` applies the gold fix through the tools, `null` gives up.

They check the whole environment and grader end to end: on a valid task set oracle must resolve 100%, null 0%.
A script plays through the agent loop like a model does, behind `ScriptEngine`, a text-only engine. (A script is
not a policy: in patchgym that word names the model being trained, patchgym.train.policy.)
"""

import shlex
from typing import Protocol

from patchgym.env.tools.calls import ToolCall, render_call_xml
from patchgym.inference.base import Generation, SamplingParams
from patchgym.tasks import Task


class Script(Protocol):
    """A scripted player: each turn's action text, without a model."""

    def act(self, task: Task, observation: str, turn: int) -> str:
        """The next action text (one tool call) after `observation` (the last message the agent was shown: the task
        prompt on turn 0, then each tool's answer); turn counts from 0."""


class ScriptEngine:
    """A script as an engine of one episode of `task`: it takes the chat and answers with the script's action as
    text, at once; no token is sampled (its tokenizer is None)."""

    tokenizer = None
    needs_messages = True

    def __init__(self, script: Script, task: Task):
        self.script, self.task = script, task

    def generate_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Generation:
        turn = sum(m["role"] == "assistant" for m in messages)
        return Generation([], [], "stop", text=self.script.act(self.task, messages[-1]["content"], turn))

    async def agenerate_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Generation:
        return self.generate_chat(messages, params)

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        raise TypeError("a script engine takes the chat (generate_chat), not token ids")

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        return self.generate(prompt_ids, params)

    def load_weights(self, state_dict) -> None:
        raise TypeError(f"{type(self.script).__name__} is a script: it has no weights to load")

    def close(self) -> None:
        pass


def _finish() -> str:
    return render_call_xml(ToolCall("finish", {}))


class OracleScript:
    """Applies the task's gold patch with one bash command, then submits; on a Harbor task, its solution/ unpacked
    to /solution and `bash /solution/solve.sh` run from the working directory, as Harbor's oracle does (on a
    multi-step task, each step's, then finish, which moves on to the next step)."""

    def act(self, task: Task, observation: str, turn: int) -> str:
        if task.harbor is not None and task.harbor.steps:  # each step's solve.sh, then finish, in order
            plays = [call for step in task.harbor.steps for call in (
                *([harbor_solve_command(task, step.solution)] if step.solution else []), None)]
            command = plays[turn] if turn < len(plays) else None
            return render_call_xml(ToolCall("execute_bash", {"command": command})) if command else _finish()
        if turn == 0 and task.harbor is not None:
            return render_call_xml(ToolCall("execute_bash", {"command": harbor_solve_command(task)})) \
                if task.harbor.solution else _finish()
        if turn == 0 and task.patch.strip():
            delimiter = "PATCHGYM_GOLD_PATCH_END"
            command = f"git apply --whitespace=nowarn - <<'{delimiter}'\n{task.patch.rstrip(chr(10))}\n{delimiter}"
            return render_call_xml(ToolCall("execute_bash", {"command": command}))
        return _finish()


def has_solution(task: Task) -> bool:
    """Whether the oracle has anything to play on `task`: a gold patch, or a Harbor task's solution/ (every step's,
    on a multi-step task)."""
    if task.harbor is not None and task.harbor.steps:
        return all(step.solution for step in task.harbor.steps)
    return bool(task.harbor.solution) if task.harbor is not None else bool(task.patch.strip())


def harbor_solve_command(task: Task, solution: str | None = None) -> str:
    """One shell command that unpacks a Harbor task's solution/ (or a step's, `solution`) to /solution and runs
    solve.sh with its env."""
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in task.harbor.solution_env.items())
    return ("rm -rf /solution && mkdir -p /solution && "
            f"echo {solution or task.harbor.solution} | base64 -d | tar -xz -C /solution --no-same-owner && "
            f"cd {shlex.quote(task.workdir)} && export DEBIAN_FRONTEND=noninteractive; {exports}"
            "bash /solution/solve.sh")


class NullScript:
    """Submits at once, changing nothing."""

    def act(self, task: Task, observation: str, turn: int) -> str:
        return _finish()


SCRIPTS = {"oracle": OracleScript, "null": NullScript}
