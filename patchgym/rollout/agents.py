"""What plays an episode inside the rollout engine: the model agent (the ReAct loop over an engine), or a script
(the oracle and null reference scripts, or any zero-latency script for benchmarks)."""

from pathlib import Path
from typing import Protocol

from patchgym.agent.config import AgentConfig
from patchgym.agent.loop import Generate, arun_agent, describe_engine
from patchgym.agent.scripts import Script, ScriptEngine
from patchgym.agent.template_check import check_history
from patchgym.agent.trajectory import Trajectory
from patchgym.env.base import Env
from patchgym.inference import Engine
from patchgym.tasks import Task


class Agent(Protocol):
    """Plays one episode of `task` in `env` (reset by the agent, closed by the caller)."""

    config: AgentConfig

    async def play(self, task: Task, env: Env, generate: Generate, save_path: Path | None) -> Trajectory: ...

    def describe(self) -> dict: ...


class ModelAgent:
    """The ReAct agent over an inference engine; `generate` is the rollout engine's bounded, counted sampler."""

    def __init__(self, engine: Engine, config: AgentConfig, model: str = ""):
        self.engine, self.config, self.model = engine, config, model
        if engine.tokenizer is not None and not engine.needs_messages:  # before any rollout, not during them
            check_history(engine.tokenizer, config)

    async def play(self, task: Task, env: Env, generate: Generate, save_path: Path | None) -> Trajectory:
        return await arun_agent(task, self.engine, env, self.config, save_path=save_path, generate=generate)

    def describe(self) -> dict:
        return {**describe_engine(self.engine), "spec": self.model}


class ScriptedAgent:
    """A script (no tokens, no model): each turn's action comes from `script.act` at once.

    It plays through the same ReAct loop as a model (the script behind a ScriptEngine), so its trajectories have
    messages and turns like a model's, with empty token ids, and the rest of the pipeline (grading, summaries, preds)
    treats them the same way.
    """

    def __init__(self, script: Script, config: AgentConfig | None = None):
        self.script, self.config = script, config or AgentConfig()

    def describe(self) -> dict:
        return {"class": type(self.script).__name__, "model": "", "spec": type(self.script).__name__}

    async def play(self, task: Task, env: Env, generate: Generate, save_path: Path | None) -> Trajectory:
        return await arun_agent(task, ScriptEngine(self.script, task), env, self.config, save_path=save_path,
                                engine_info=self.describe())
