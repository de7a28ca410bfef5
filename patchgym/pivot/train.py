"""The pivot stage's training loop: `run_pivot` runs N iterations of RL on decision points on a policy, each
written as one metrics line (stage "pivot") and shown on a progress line (iteration, reward, time left).

One iteration (`pivot_iteration`), n counted from 0:
1. Which states are sampled. On a measuring iteration (the first, and every pivot.refresh_every-th) the whole pool:
   G actions per state under the current policy, whose rewards rebuild the kept set (patchgym.pivot.selection:
   states whose G rewards are not all equal); then pivot.states_per_iteration kept states are drawn, and their
   samples (already taken, by this policy) are the ones trained. Between measurements the states are drawn from
   the kept set and only they are sampled.
2. Sampling: G actions per state through the engine the agent loop uses, with the agent's sampling settings
   (patchgym.pivot.sampling), from the state's exact prompt ids.
3. Rewards: `local_reward` of each action (patchgym.pivot.reward); `bash` runs the commands of execute_bash states.
4. Advantages over the G samples of each state with algorithm.advantage (patchgym.rl.advantages, as agentic RL
   computes them, algorithm.flip_advantages and drop_zero_advantage included): a state whose G rewards are all
   equal gets 0 for each sample, and adds nothing to the gradient.
5. The update: one TrainSequence per sample (prompt, then the sampled ids under the loss mask, with the engine's
   logprobs), shuffled, through the policy's `update` (patchgym.train.update.policy_update with the run's
   AlgorithmConfig, train.mini_batches, the sampling temperature: its rollout_logprob_gap is the token-exact
   check of the engine's logprobs against the policy's), then the weights are pushed into the engine.
6. Between measurements, the trained states whose G rewards came out all equal leave the kept set.
"""

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from patchgym.agent.trajectory import Turn
from patchgym.config import Config
from patchgym.errors import UserError
from patchgym.inference import Engine
from patchgym.pivot.config import PivotConfig
from patchgym.pivot.reward import BashCheck, Verdict, local_reward
from patchgym.pivot.sampling import action_sequence, sample_actions
from patchgym.pivot.selection import Selection, draw, refresh
from patchgym.pivot.states import DecisionPoint
from patchgym.rl.advantages import compute_advantages
from patchgym.rl.config import AlgorithmConfig
from patchgym.rl.shaping import drop_zero_advantage
from patchgym.train.batch import TrainSequence
from patchgym.train.metrics import MetricsLog, advantage_stats, group_stats, reward_stats, update_metrics
from patchgym.train.policy import Policy
from patchgym.train.progress import step_bar


@dataclass
class PivotState:
    """Where the stage stands: iterations done, the kept set of states, optimizer steps taken."""

    iteration: int = 0
    selection: Selection | None = None
    optimizer_steps: int = 0


@dataclass
class Group:
    """The G sampled actions at one state, their verdicts and advantages."""

    point: DecisionPoint
    turns: list[Turn]
    verdicts: list[Verdict]
    advantages: list[float] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [v.reward for v in self.verdicts]


def run_pivot(points: Sequence[DecisionPoint], policy: Policy, engine: Engine, config: Config, pivot: PivotConfig,
              iterations: int, *, bash: BashCheck | None = None, metrics: MetricsLog | None = None,
              state: PivotState | None = None, iteration_offset: int = 0,
              progress: bool = True) -> tuple[PivotState, list[dict]]:
    """Pivot iterations on `points` until `state.iteration` reaches `iterations` (a fresh state by default); the
    engine must hold the policy's weights at the start. Each iteration's metrics line (its "iteration" is
    `iteration_offset` + the pivot iteration, from 1) goes to `metrics` when given; returns the state and the
    lines."""
    pool = state_pool(points, bash)
    state = state or PivotState()
    lines = []
    with step_bar("pivot" if progress else None, iterations - state.iteration) as bar:
        while state.iteration < iterations:
            record, _ = pivot_iteration(pool, policy, engine, config, pivot, state, bash=bash)
            record["iteration"] += iteration_offset
            lines.append(record)
            if metrics is not None:
                metrics.write(record)
            bar.update(bar.task_ids[0], advance=1, description=_short(record))
            bar.console.print(_summary(record, iterations), soft_wrap=True, highlight=False, markup=False)
    return state, lines


def pivot_iteration(pool: dict[str, DecisionPoint], policy: Policy, engine: Engine, config: Config,
                    pivot: PivotConfig, state: PivotState, *,
                    bash: BashCheck | None = None) -> tuple[dict, dict[str, Group]]:
    """One iteration (see the module docstring) over `pool` (state_pool's); advances `state` and returns its
    metrics line and the groups it sampled, by state."""
    n, began = state.iteration, time.monotonic()
    measuring = state.selection is None or n % pivot.refresh_every == 0
    keys = list(pool) if measuring else draw(state.selection, pivot.states_per_iteration, n, config.seed)

    t = time.monotonic()
    turns = sample_actions(engine, [pool[k] for k in keys], config.agent, pivot.group_size, salt=n)
    sampling_s = time.monotonic() - t
    t = time.monotonic()
    groups = {k: Group(pool[k], turns[k], [local_reward(pool[k], x.action, pivot.credit, bash) for x in turns[k]])
              for k in keys}
    reward_s = time.monotonic() - t

    if measuring:
        state.selection = refresh(state.selection, {k: g.rewards for k, g in groups.items()}, n, pivot.refresh_every)
        trained = [groups[k] for k in draw(state.selection, pivot.states_per_iteration, n, config.seed)]
    else:
        trained = [groups[k] for k in keys]
    advantages = group_advantages(trained, config.algorithm)
    sequences = training_sequences(trained, config.algorithm)
    random.Random(f"{config.seed}/pivot/{n}").shuffle(sequences)

    update, training_s, sync_s = {}, 0.0, 0.0
    if sequences:
        t = time.monotonic()
        update = policy.update(sequences, config.algorithm)
        training_s = time.monotonic() - t
        state.optimizer_steps += config.train.mini_batches
        t = time.monotonic()
        policy.sync(engine)
        sync_s = time.monotonic() - t
    if not measuring:
        state.selection = refresh(state.selection, {g.point.key: g.rewards for g in trained}, n, pivot.refresh_every)
    state.iteration = n + 1

    every = [v for g in groups.values() for v in g.verdicts]
    sampled_tokens = sum(len(x.completion_ids) for g in groups.values() for x in g.turns)
    record = {
        "iteration": n + 1, "stage": "pivot", "pivot_iteration": n + 1, "optimizer_steps": state.optimizer_steps,
        "lr": policy.lr(), "states_measured": len(keys) if measuring else 0,
        "states_kept": len(state.selection.kept), "kept_fraction": state.selection.fraction_kept,
        "states_trained": len(trained), "samples": len(every), **reward_stats([v.reward for v in every]),
        "trained_reward_mean": _mean([r for g in trained for r in g.rewards]),
        "parsable_fraction": _mean([float(v.reason != "format_error") for v in every]),
        "reasons": dict(sorted(Counter(v.reason for v in every).items())),
        **advantage_stats(advantages), **group_stats([g.point.key for g in trained for _ in g.verdicts], advantages),
        "trained_sequences": len(sequences), "sampled_tokens": sampled_tokens,
        "sample_tokens_per_s": sampled_tokens / max(sampling_s, 1e-9), **update_metrics(update),
        "time_sampling_s": sampling_s, "time_reward_s": reward_s, "time_training_s": training_s,
        "time_weight_sync_s": sync_s, "time_iteration_s": time.monotonic() - began,
    }
    return record, groups


def group_advantages(groups: Sequence[Group], algo: AlgorithmConfig) -> torch.Tensor:
    """One advantage per sample, over the samples of each state, with the algorithm's estimator (set on each
    group too); algorithm.flip_advantages negates them, as in agentic RL."""
    rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float64)
    ids = [g.point.key for g in groups for _ in g.verdicts]
    advantages = compute_advantages(algo.advantage, rewards, ids, eps=algo.advantage_eps,
                                    invalid_as_zero=algo.invalid_as_zero)
    if algo.flip_advantages:
        advantages = -advantages
    values = iter(advantages.tolist())
    for g in groups:
        g.advantages = [next(values) for _ in g.verdicts]
    return advantages


def training_sequences(groups: Sequence[Group], algo: AlgorithmConfig) -> list[TrainSequence]:
    """One sequence per sampled action of `groups` (their advantages set); with algorithm.drop_zero_advantage,
    none for an action whose advantage is 0."""
    sequences = [action_sequence(turn, a, f"{g.point.key}#{i}") for g in groups
                 for i, (turn, a) in enumerate(zip(g.turns, g.advantages))]
    if algo.drop_zero_advantage:
        kept, _ = drop_zero_advantage(torch.tensor([s.advantage for s in sequences], dtype=torch.float64))
        sequences = [sequences[i] for i in kept]
    return sequences


def state_pool(points: Sequence[DecisionPoint], bash: BashCheck | None) -> dict[str, DecisionPoint]:
    """The states by key; refused when empty, when a key repeats, or when a state needs the bash check and none
    was given."""
    if not points:
        raise UserError("the pivot stage was given no states")
    pool: dict[str, DecisionPoint] = {}
    for point in points:
        if point.key in pool:
            raise UserError(f"state {point.key} is given twice")
        if bash is None and point.call["name"] == "execute_bash":
            raise UserError(f"state {point.key}: the expert runs a command there, and no bash check was given")
        pool[point.key] = point
    return pool


def _short(record: dict) -> str:
    return (f"reward {record['reward_mean']:.3f}, parsable {record['parsable_fraction']:.0%}, "
            f"kept {record['states_kept']} states")


def _summary(record: dict, iterations: int) -> str:
    loss = "no update" if record["loss"] is None else f"loss {record['loss']:.4f}"
    return (f"pivot iteration {record['pivot_iteration']}/{iterations}: {_short(record)} "
            f"({record['kept_fraction']:.0%} of those measured), trained {record['states_trained']} states, {loss}; "
            f"sampling {record['time_sampling_s']:.0f} s ({record['sample_tokens_per_s']:.0f} tokens/s), rewards "
            f"{record['time_reward_s']:.0f} s, training {record['time_training_s']:.0f} s")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
