"""Expert demos played on the in-memory environment, their replay, and the bash check over it: the pieces the pivot
tests build decision points from (imported by name: a module called conftest would be another folder's)."""

import torch

from memory_env import BUGGY, MemoryEnv, memory_grade, memory_task
from patchgym.agent.config import AgentConfig
from patchgym.agent.expert import ExpertEngine, plan_demo
from patchgym.agent.loop import run_agent
from patchgym.env.tools import ToolCall, render_call_xml, tool_schemas

torch.set_num_threads(1)  # two cores, shared with the sandboxes


class MemoryReplay:
    """The Replay of patchgym.pivot.states over the in-memory environment: its files are a dict under /testbed."""

    def __init__(self, files: dict[str, str] | None = None):
        self.env = MemoryEnv(files)

    def reset(self, task):
        return self.env.reset(task)

    def step(self, action_text):
        return self.env.step(action_text)

    def read(self, paths):
        return {p: self.env.files.get(p.removeprefix("/testbed/")) for p in paths}

    def close(self):
        self.env.close()


def play_demo(tokenizer, config: AgentConfig, seed: int = 0, task=None, files=None):
    """An expert demo of the memory task (or `task` on `files`), played through the agent loop and graded."""
    task, files = task or memory_task(), dict(files or BUGGY)
    plan = plan_demo(task, files, set(), seed)
    tools = tool_schemas(task.workdir, config.command_timeout_s) if config.tool_format == "native" else None
    trajectory = run_agent(task, ExpertEngine(tokenizer, plan, config.tool_format, tools), MemoryEnv(files), config)
    trajectory.grade = memory_grade(task, trajectory.patch)
    trajectory.trajectory_id = f"{task.instance_id}#{seed}"
    return trajectory


class MemoryBash:
    """The bash check of patchgym.pivot.reward over the in-memory environment: the state's earlier actions replayed
    in a fresh MemoryEnv, then the command run there (its exit status as the env's `bash` map gives it)."""

    def __init__(self, bash: dict[str, tuple[str, int]] | None = None):
        self.bash = bash

    def exit_code(self, point, command):
        env = MemoryEnv(bash=self.bash)
        env.reset(memory_task())
        for action in point.earlier_actions:
            env.step(action)
        return env.step(render_call_xml(ToolCall("execute_bash", {"command": command}))).exit_code
