"""Where the work runs: in this process (`cluster.backend: local`) or on a Ray cluster (`ray`), behind one call."""

from pathlib import Path

from patchgym.cluster.config import ClusterConfig
from patchgym.rollout import RolloutEngine


def make_rollouts(config, agent, *, run_dir: str | Path, progress: bool = True):
    """The rollout engine for a run's `config` (a patchgym Config): `.run(tasks, samples, prefix=)` either way."""
    if config.cluster.backend == "local":
        return RolloutEngine(agent, config.sandbox, config.rollout, run_dir=run_dir, progress=progress)
    raise NotImplementedError(f"cluster.backend={config.cluster.backend!r} is not wired yet")


__all__ = ["ClusterConfig", "make_rollouts"]
