"""What plays an episode inside the rollout engine: the model agent (the ReAct loop over an engine), or a scripted
policy (the oracle and null reference policies, or any zero-latency script for benchmarks)."""

import asyncio
import time
from pathlib import Path
from typing import Protocol

from patchgym.agent.config import AgentConfig, render
from patchgym.agent.loop import Generate, arun_agent, describe_engine
from patchgym.agent.reference import Policy
from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.env.swe_env import SWEEnv
from patchgym.env.tools import parse_tool_call
from patchgym.inference import Engine
from patchgym.sandbox import SandboxError
from patchgym.tasks import Task


class Agent(Protocol):
    """Plays one episode of `task` in `env` (reset by the agent, closed by the caller)."""

    config: AgentConfig

    async def play(self, task: Task, env: SWEEnv, generate: Generate, save_path: Path | None) -> Trajectory: ...

    def describe(self) -> dict: ...


class ModelAgent:
    """The ReAct agent over an inference engine; `generate` is the rollout engine's bounded, counted sampler."""

    def __init__(self, engine: Engine, config: AgentConfig, model: str = ""):
        self.engine, self.config, self.model = engine, config, model

    async def play(self, task: Task, env: SWEEnv, generate: Generate, save_path: Path | None) -> Trajectory:
        return await arun_agent(task, self.engine, env, self.config, save_path=save_path, generate=generate)

    def describe(self) -> dict:
        return {**describe_engine(self.engine), "spec": self.model}


class ScriptedAgent:
    """A text policy (no tokens, no model): each turn's action comes from `policy.act` at once.

    Its trajectories have messages and turns like a model's, with empty token ids, so the rest of the pipeline
    (grading, summaries, preds) treats them the same way.
    """

    def __init__(self, policy: Policy, config: AgentConfig | None = None):
        self.policy, self.config = policy, config or AgentConfig()

    def describe(self) -> dict:
        return {"class": type(self.policy).__name__, "model": "", "spec": type(self.policy).__name__}

    async def play(self, task: Task, env: SWEEnv, generate: Generate, save_path: Path | None) -> Trajectory:
        trajectory = Trajectory(task_id=task.instance_id, engine=self.describe(), started_at=time.time())
        start = time.monotonic()
        try:
            observation = await asyncio.to_thread(env.reset, task)
            trajectory.termination = "max_steps"
            for step in range(self.config.max_steps):
                action = self.policy.act(task, observation, step)
                trajectory.messages.append({"role": "assistant", "content": action})
                began = time.monotonic()
                result = await asyncio.to_thread(env.step, action)
                turn = Turn(prompt_ids=[], completion_ids=[], logprobs=[], finish_reason="stop", close_ids=[],
                            action=action, observation=result.observation, exit_code=result.info.get("exit_code"),
                            format_error=bool(result.info.get("format_error")), step_s=time.monotonic() - began)
                if not turn.format_error:
                    call = parse_tool_call(action)
                    turn.tool_call = {"name": call.name, "arguments": call.arguments}
                trajectory.turns.append(turn)
                if result.done:
                    trajectory.termination = "submitted"
                    break
                observation = result.observation
                trajectory.messages.append({"role": self.config.observation_role, "content": render(
                    self.config.observation_template, observation=observation,
                    steps_remaining=self.config.max_steps - step - 1)})
            trajectory.patch = await asyncio.to_thread(env.patch)
        except SandboxError as exc:
            trajectory.termination, trajectory.error = "infra_error", f"{type(exc).__name__}: {exc}"
        finally:
            trajectory.seconds = time.monotonic() - start
        return trajectory
