"""What each training iteration works on: the loop state a checkpoint keeps, the seeded task stream, and stages
(when each starts, its curriculum, and the agent and algorithm it runs with).

Everything here is a pure function of the saved state and the config, so a resumed run draws exactly the tasks
(and enters exactly the stages) the interrupted one would have.
"""

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from patchgym.agent.config import AgentConfig
from patchgym.rl.config import AlgorithmConfig
from patchgym.rl.shaping import curriculum_filter


@dataclass
class LoopState:
    """The trainer's progress; saved as state.json in every checkpoint."""

    iteration: int = 0  # iterations finished
    optimizer_steps: int = 0
    stage: int = 0  # index into algorithm.stages
    pool: list[str] = field(default_factory=list)  # task ids this stage draws from
    drawn: int = 0  # positions of the pool's task stream used so far
    solve_counts: dict[str, list[int]] = field(default_factory=dict)  # task -> [resolved, attempts], all iterations
    warm_started: bool = False  # train.warm_start has run (its checkpoint is iter-0); never again on resume

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LoopState":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def draw_tasks(state: LoopState, count: int, seed: int, shuffle: bool = True) -> list[str]:
    """The next `count` distinct task ids of the pool's stream; advances `state.drawn`.

    The stream is the pool in a seeded order per pass (a fresh order each pass), so every task is seen once per
    pass. Where a pass ends mid-batch, a task already in the batch is skipped (and used up).
    """
    pool = state.pool
    if count > len(pool):
        raise ValueError(f"cannot draw {count} distinct tasks from a pool of {len(pool)}")
    chosen: list[str] = []
    while len(chosen) < count:
        epoch, offset = divmod(state.drawn, len(pool))
        task = pass_order(pool, seed, epoch, shuffle)[offset]
        state.drawn += 1
        if task not in chosen:
            chosen.append(task)
    return chosen


def pass_order(pool: list[str], seed: int, epoch: int, shuffle: bool = True) -> list[str]:
    """The pool's order in pass `epoch`; string seeds make it the same in every process."""
    order = list(pool)
    if shuffle:
        random.Random(f"patchgym-tasks:{seed}:{epoch}").shuffle(order)
    return order


def stage_of(iteration: int, stage_iterations: list[int], num_stages: int) -> int:
    """The stage of 1-based `iteration`: stage k lasts stage_iterations[k] iterations, the last one to the end."""
    end = 0
    for stage, length in enumerate(stage_iterations[: max(num_stages - 1, 0)]):
        end += length
        if iteration <= end:
            return stage
    return max(num_stages - 1, 0)


@dataclass(frozen=True)
class StageSettings:
    """What a stage runs with: the agent that plays its rollouts, the algorithm that trains on them, and T_max of
    the turn penalty."""

    agent: AgentConfig
    algorithm: AlgorithmConfig
    max_turns: int


def stage_settings(agent: AgentConfig, algo: AlgorithmConfig, stage: int) -> StageSettings:
    """The settings of `stage`: `agent` and `algo` with the stage's limits and clip_high (as they are without
    algorithm.stages)."""
    if not algo.stages:
        return StageSettings(agent, algo, agent.max_steps)
    s = algo.stages[stage]
    agent = agent.model_copy(update={"max_steps": s.max_turns, "max_context_tokens": s.max_context_tokens})
    if s.clip_high is not None:
        algo = algo.model_copy(update={"clip_high": s.clip_high})
    return StageSettings(agent, algo, s.max_turns)


def enter_stage(state: LoopState, stage: int, algo: AlgorithmConfig) -> dict[str, int]:
    """Switch `state` to `stage`: with the stage's curriculum, shrink the pool to tasks neither too easy nor never
    solved so far; the new pool's stream starts over. Returns the curriculum's counts ({} without one)."""
    state.stage = stage
    state.drawn = 0
    if not algo.stages[stage].curriculum:
        return {}
    history = {task: tuple(state.solve_counts.get(task, (0, 0))) for task in state.pool}
    state.pool, counts = curriculum_filter(history, algo.curriculum_max_solve_rate)
    return counts


def record_outcomes(state: LoopState, outcomes: list[tuple[str, bool]]) -> None:
    """Add (task id, resolved) outcomes to the per-task tallies the curriculum reads."""
    for task, resolved in outcomes:
        tally = state.solve_counts.setdefault(task, [0, 0])
        tally[0] += int(resolved)
        tally[1] += 1

