"""Rollouts: many trajectories at once (N tasks x G samples) over warm sandbox pools and one batching engine,
each graded as soon as it ends and appended to RUN/trajectories.jsonl."""

from patchgym.rollout.agents import Agent, ModelAgent, ScriptedAgent
from patchgym.rollout.config import RolloutConfig
from patchgym.rollout.engine import RolloutEngine
from patchgym.rollout.store import TrajectoryStore

__all__ = ["Agent", "ModelAgent", "RolloutConfig", "RolloutEngine", "ScriptedAgent", "TrajectoryStore"]
