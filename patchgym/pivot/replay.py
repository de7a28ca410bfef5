"""Expert trajectories played again in the task's real sandbox: `SandboxReplay` shows the files between the steps
(patchgym.pivot.states reads each state's files through it), and `SandboxBash` runs a sampled command at a state
(the bash check of patchgym.pivot.reward).

Both start the sandbox as the agent loop does (patchgym.agent.loop.open_env, SWEEnv.reset) and step the expert's
recorded actions through the same tools. SandboxBash keeps one sandbox per state (trajectory, turn), at most
`max_open` at once (the least recently used is closed first). After the expert's first k actions it commits the
whole working directory (ignored files too) to a git directory of its own outside it, where the agent cannot write;
after each sampled command it resets the working directory to that commit and removes what the command added, so
every sample starts from the same state. What a command changes outside the working directory (an installed
package, /tmp) is not undone.
"""

import shlex
from collections import OrderedDict
from collections.abc import Mapping

from patchgym.agent.config import AgentConfig
from patchgym.agent.loop import open_env
from patchgym.env.base import StepResult
from patchgym.env.swe_env import SWEEnv
from patchgym.env.tools import ToolCall, run_tool
from patchgym.errors import UserError
from patchgym.pivot.states import DecisionPoint
from patchgym.sandbox import SandboxConfig, SandboxError, SandboxKilled
from patchgym.tasks import Task

STATE_GIT_DIR = "/var/lib/patchgym/pivot-state.git"


class SandboxReplay:
    """The Replay of patchgym.pivot.states over a real SWEEnv."""

    def __init__(self, sandbox: SandboxConfig, agent: AgentConfig):
        self.env: SWEEnv = open_env(sandbox, agent)

    def reset(self, task: Task) -> str:
        return self.env.reset(task)

    def step(self, action_text: str) -> StepResult:
        return self.env.step(action_text)

    def read(self, paths: list[str]) -> dict[str, str | None]:
        return read_files(self.env, paths)

    def close(self) -> None:
        self.env.close()


def read_files(env: SWEEnv, paths: list[str]) -> dict[str, str | None]:
    """Each absolute path's text in the env's sandbox (undecodable bytes replaced); None where it is absent or not a
    regular file."""
    if not paths:
        return {}
    found = env.sandbox.exec(["bash", "-c", 'for f in "$@"; do [ -f "$f" ] && echo "$f"; done; true', "ls", *paths],
                             timeout=60).output.splitlines()
    return {p: env.sandbox.read_file(p).decode("utf-8", "replace") if p in found else None for p in paths}


class SandboxBash:
    """Runs sampled commands at decision points' states, each in a sandbox restored to the state."""

    def __init__(self, tasks: Mapping[str, Task], sandbox: SandboxConfig, agent: AgentConfig, *,
                 timeout_s: float = 30.0, max_open: int = 4):
        self.tasks, self.sandbox, self.agent = tasks, sandbox, agent
        self.timeout_s, self.max_open = timeout_s, max_open
        self._envs: OrderedDict[str, SWEEnv] = OrderedDict()

    def exit_code(self, point: DecisionPoint, command: str) -> int | None:
        """The exit status of `command` run as the agent's execute_bash at the state (124: it timed out); None when
        the command ended its own sandbox (which is then dropped)."""
        env = self._env(point)
        try:
            result = run_tool(env.sandbox, ToolCall("execute_bash", {"command": command}), timeout=self.timeout_s,
                              python=env.sandbox.config.python)
        except SandboxKilled:
            self._envs.pop(point.key).close()
            return None
        self._restore(env, point)
        return result.exit_code

    def _env(self, point: DecisionPoint) -> SWEEnv:
        if point.key in self._envs:
            self._envs.move_to_end(point.key)
            return self._envs[point.key]
        task = self.tasks.get(point.task_id)
        if task is None:
            raise UserError(f"state {point.key}: its task {point.task_id} is not among the tasks given to the bash "
                            "check")
        while len(self._envs) >= self.max_open:
            self._envs.popitem(last=False)[1].close()
        env = open_env(self.sandbox, self.agent)
        try:
            env.reset(task)
            for action in point.earlier_actions:
                env.step(action)
            git = _state_git(point.workdir)
            result = env.sandbox.exec(f"{git} init -q && {git} add -A -f && {git} -c user.name=patchgym "
                                      "-c user.email=patchgym@localhost commit -q --allow-empty --no-verify -m state",
                                      cwd=point.workdir, timeout=300)
            if not result.ok:
                raise SandboxError(f"state {point.key}: could not keep the state of {point.workdir}: "
                                   f"{result.output[-500:]}")
        except BaseException:
            env.close()
            raise
        self._envs[point.key] = env
        return env

    def _restore(self, env: SWEEnv, point: DecisionPoint) -> None:
        git = _state_git(point.workdir)
        result = env.sandbox.exec(f"{git} reset -q --hard && {git} clean -ffdxq", cwd=point.workdir, timeout=300)
        if not result.ok:
            env.close()
            self._envs.pop(point.key, None)
            raise SandboxError(f"state {point.key}: could not restore {point.workdir} after a sampled command: "
                               f"{result.output[-500:]}")
        env.sandbox.give_to_agent(point.workdir)

    def close(self) -> None:
        while self._envs:
            self._envs.popitem(last=False)[1].close()

    def __enter__(self) -> "SandboxBash":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _state_git(workdir: str) -> str:
    return f"git --git-dir={STATE_GIT_DIR} --work-tree={shlex.quote(workdir)}"
