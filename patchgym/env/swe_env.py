"""The SWE environment behind a tiny API: reset(task) -> first observation, step(text) -> StepResult, close().

It parses the model's tool call itself (a bad call is a counted format error, answered with what to do), runs
the tool in the task's sandbox, and produces the patch: the workspace's diff against its only commit, without
the test files the grader owns. The image's hidden paths (R2E-Gym's /r2e_tests) are deleted before the first step;
grading starts a fresh sandbox from the image, where they still are.

A Harbor task is different: its state is the whole container, so its working directory is left as the image has it
(no snapshot, no patch), its sandbox gets the task's own limits and agent user, and `verify` runs its verifier in
this sandbox once the episode is over (patchgym.env.grading.families.harbor). A multi-step one is played step by
step (patchgym.env.harbor_steps): finish ends a step, whose verifier runs before the next step's instruction comes
back as the observation.
"""

import time

from patchgym.env.base import StepResult
from patchgym.env.grading.families import family_of
from patchgym.env.grading.grade import Grade
from patchgym.env.harbor_steps import StepRun
from patchgym.env.tools import COMMAND_TIMEOUT_S, FINISHED, install_tools, run_tool
from patchgym.env.tools.calls import FormatError, parse_tool_call
from patchgym.env.workspace import BASE_GIT_DIR, prepare_workspace
from patchgym.sandbox import Sandbox, SandboxConfig, SandboxError, open_sandbox
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import Task


class SWEEnv:
    """The Env of SWE tasks: a sandbox per episode, the four tools, the workspace diff as the patch."""

    def __init__(self, config: SandboxConfig | None = None, *, command_timeout: float = COMMAND_TIMEOUT_S,
                 pools: PoolSet | None = None):
        """`pools`: take sandboxes from these warm pools (and give them back on close) instead of starting one."""
        self.config = config or SandboxConfig()
        self.pools = pools
        self._pool = None
        self.command_timeout = command_timeout
        self.sandbox: Sandbox | None = None
        self.task: Task | None = None
        self.base_commit = ""
        self.format_errors = 0
        self.steps = 0
        self._deadline: float | None = None  # a Harbor task's [agent].timeout_sec, from reset
        self._steps: StepRun | None = None  # a multi-step Harbor task's progress

    def reset(self, task: Task) -> str:
        """Start the task's sandbox and workspace; returns the problem statement (the first observation)."""
        self.close()
        self.task, self.format_errors, self.steps, self._deadline, self._steps = task, 0, 0, None, None
        limits = harbor_limits(task, self.config.env, allow_network=self.config.task_network)
        if self.pools is not None:
            self._pool = self.pools.pool(task.image or None, task.workdir, **limits)
            self.sandbox = self._pool.acquire()
        else:
            self.sandbox = open_sandbox(self.config.model_copy(update={"workdir": task.workdir, **limits}),
                                        image=task.image or None)
        if task.harbor is not None:
            self._enter_harbor(task)
            if task.harbor.steps:
                self._steps = StepRun(self.sandbox, task)
                if (problem := self._steps.begin()) is not None:
                    self._steps.finish_step(problem)
                return self._steps.step.instruction
            own = task.harbor.agent_timeout_s
            self._deadline = None if own is None else time.monotonic() + own
            return task.problem_statement
        self._remove_hidden(task)  # before the base snapshot, so that their removal is not part of the agent's patch
        self.base_commit = prepare_workspace(self.sandbox, task)
        install_tools(self.sandbox)
        return task.problem_statement

    def _enter_harbor(self, task: Task) -> None:
        """A Harbor task's sandbox as its image has it: the working directory made if missing, the agent's user
        looked up by name when task.toml gives one, the tools installed."""
        user = task.harbor.agent_user
        script = 'mkdir -p "$1" && id -u "$2"' if not user.isdigit() and user != "root" else 'mkdir -p "$1"'
        result = self.sandbox.exec(["bash", "-c", script, "harbor", task.workdir, user], timeout=60)
        if not result.ok:
            raise SandboxError(f"task {task.instance_id}: could not make its working directory {task.workdir} or "
                               f"find its agent user {user!r}: {result.output[-500:]}")
        if not user.isdigit() and user != "root":
            self.sandbox.config = self.sandbox.config.model_copy(
                update={"agent_user": int(result.output.strip().splitlines()[-1])})
        install_tools(self.sandbox)

    def verify(self, threshold: float = 1.0, score: str = "auto") -> Grade | None:
        """The episode's grade where the task's family grades in place (a Harbor task's verifier, run in this
        sandbox after the episode); None where the patch is graded in a fresh sandbox."""
        if self._steps is not None:
            return self._steps.task_grade(threshold, score, self.task.harbor.multi_step_reward)
        family = family_of(self.task)
        return family.verify(self.sandbox, self.task, threshold=threshold, score=score) if family.in_place else None

    def _remove_hidden(self, task: Task) -> None:
        """Delete the paths only the grader may see, as root (not an agent command), and check they are gone."""
        if not task.hidden_paths:
            return
        paths = [p for p in task.hidden_paths if p.strip("/")]  # never "/"
        result = self.sandbox.exec(["bash", "-c", 'rm -rf -- "$@" && for p in "$@"; do [ ! -e "$p" ] || exit 1; done',
                                    "rm", *paths], timeout=300)
        if not result.ok:
            raise SandboxError(f"task {task.instance_id}: could not remove its hidden paths {paths}: {result.output}")

    def step(self, action_text: str) -> StepResult:
        """Run the one tool call in `action_text`; a SandboxError here means the episode is an infra error."""
        if self.sandbox is None:
            raise RuntimeError("SWEEnv.step before reset")
        self.steps += 1
        if self._steps is not None and self._steps.over:
            return StepResult(FINISHED, True)
        if self._steps is not None and (left := self._steps.time_left()) is not None and left <= 0:
            step = self._steps.step.name
            return self._next_step(None, f"[The time for step {step} ran out before this action; its verifier has "
                                         "run. The next step follows.]\n\n")
        try:
            call = parse_tool_call(action_text)
        except FormatError as exc:
            self.format_errors += 1
            return StepResult(str(exc), False, format_error=str(exc))
        if call.name == "finish" and self._steps is not None:
            return self._next_step(call)
        result = run_tool(self.sandbox, call, timeout=self.command_limit(), python=self.sandbox.config.python)
        return StepResult(result.observation, result.done, call=call, exit_code=result.exit_code)

    def _next_step(self, call, note: str = "") -> StepResult:
        """A multi-step task's step is over: graded, then the next one's instruction, or done when none is left."""
        instruction = self._steps.finish_step()
        if instruction is None:
            return StepResult(FINISHED, True, call=call)
        return StepResult(note + instruction, False, call=call)

    def command_limit(self) -> float:
        """How long the next command may run: the per-command limit, or on a Harbor task with an [agent].timeout_sec
        what is left of it (Harbor bounds the agent's whole run, not each command: a solve.sh may take minutes)."""
        left = self._steps.time_left() if self._steps is not None else (
            None if self._deadline is None else self._deadline - time.monotonic())
        return self.command_timeout if left is None else max(1.0, left)

    def patch(self, max_bytes: int) -> str:
        """The agent's change: git diff of the whole workspace against the starting commit (its copy outside the
        workspace, so a deleted .git changes nothing), binary-safe; over `max_bytes`, DiffTooLarge (the sandbox
        sends back no more than that). A Harbor task has none: its verifier reads the container itself."""
        if family_of(self.task).in_place:
            return ""
        return self.sandbox.diff(self.base_commit, cwd=self.task.workdir, exclude=tuple(self.task.test_files),
                                 git_dir=BASE_GIT_DIR, max_bytes=max_bytes)

    def close(self) -> None:
        """Close the sandbox (a pooled one goes back to its pool, which discards it); safe from any thread."""
        sandbox, pool, self.sandbox, self._pool = self.sandbox, self._pool, None, None
        if sandbox is None:
            return
        if pool is not None:
            pool.release(sandbox)  # closed in the pool's background thread, off the caller's path
        else:
            sandbox.close()

    def __enter__(self) -> "SWEEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def harbor_limits(task: Task, config_env: dict[str, str] | None = None, *, allow_network: bool = True) -> dict:
    """The sandbox settings of a Harbor task (none for other tasks): what its task.toml asks for (cpus, memory,
    network (never where `allow_network` is false), its environment variables over the config's `config_env`, the
    agent's user (root unless it names one)), and background processes that live on, with private directories for
    the verifier."""
    spec = task.harbor
    if spec is None:
        return {}
    config_env = config_env or {}
    # What the agent starts lives until verification, which runs with directories of its own (families/harbor.py).
    limits: dict = {"network": spec.network and allow_network, "keep_background": True, "private_mounts": True}
    if spec.env:
        limits["env"] = {**config_env, **spec.env}
    if spec.runner_python != "python3":
        limits["python"] = spec.runner_python
    if spec.services:
        limits["services"] = spec.services
    if spec.cpus is not None:
        limits["cpus"] = spec.cpus
    if spec.memory_mb is not None:
        limits["memory_mb"] = spec.memory_mb
    if spec.agent_user in ("root", "0"):
        limits["agent_user"] = 0
    elif spec.agent_user.isdigit():
        limits["agent_user"] = int(spec.agent_user)
    return limits
