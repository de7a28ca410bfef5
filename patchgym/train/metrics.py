"""Per-iteration training metrics: one JSON line each in RUN/metrics.jsonl, and the same numbers as TensorBoard
scalars in RUN/tensorboard/ and as a Weights & Biases run (in RUN/wandb/) when train.loggers names them. A warm
start (train.warm_start) is the line of iteration 0.

A line is appended with one write() on an O_APPEND descriptor and fsync'd, and read back by patchgym.files.read_jsonl
(a last line cut by a crash is left out). Opening the log for a run resumed after iteration N drops lines of later
iterations (whose checkpoint was never written, so they will be redone) and a cut line: every iteration appears
exactly once. The keys of a line, and the reader, are in patchgym.train.metrics_schema (no torch there).
"""

import json
import math
import os
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

from torch import Tensor

from patchgym.agent.trajectory import Trajectory, reward
from patchgym.errors import UserError
from patchgym.files import append_line, read_jsonl, write_atomic
from patchgym.termination import Termination
from patchgym.train.batch import stepwise_extra_tokens
from patchgym.train.metrics_schema import METRICS_FILE, UPDATE_KEYS, UPDATE_NAMES


class LoggerError(UserError, RuntimeError):
    """A logger named in train.loggers that cannot start (not installed, or no way to reach its service)."""


class MetricsLog:
    """RUN/metrics.jsonl plus the other `loggers` (train.loggers); `resume_after` = the last iteration whose results
    are kept (-1: none, not even a warm start's line). `config`, the run's config, goes to W&B with the run."""

    def __init__(self, run_dir: str | Path, resume_after: int = 0,
                 loggers: Sequence[str] = ("jsonl", "tensorboard"), config: dict | None = None):
        run_dir = Path(run_dir)
        self.path = run_dir / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_after(self.path, resume_after)
        self.writer = _tensorboard(run_dir / "tensorboard", resume_after + 1) if "tensorboard" in loggers else None
        self.wandb = _wandb(run_dir, config) if "wandb" in loggers else None

    def write(self, record: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(record))
        scalars = flatten(record)
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, value, record["iteration"])
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=record["iteration"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            import wandb

            self.wandb.finish()
            wandb.teardown()  # until its service stops, wandb-core may still hold the run's log unwritten


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric values of a record, nested keys joined with '/' (TensorBoard groups them by that prefix)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
            out[name] = float(value)
    return out


def rollout_stats(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Outcome and length statistics of an iteration's trajectories (excluded ones left out of rates)."""
    scored = [t for t in trajectories if t.scored]
    return {
        "tasks": len({t.task_id for t in trajectories}),
        "trajectories": len(trajectories),
        "resolved": sum(t.resolved for t in scored),
        "resolve_rate": _mean([float(t.resolved) for t in scored]),
        "reward_before_shaping": _mean([reward(t) for t in scored]),
        "steps_per_trajectory": _mean([t.steps for t in scored]),
        "sampled_tokens_per_trajectory": _mean([t.sampled_tokens for t in scored]),
        "tokens_per_trajectory": _mean([sum(len(x.prompt_ids) + len(x.output_ids) + len(x.close_ids)
                                            for x in t.turns) for t in scored]),
        "stepwise_extra_tokens": stepwise_extra_tokens(scored),  # agent.history template: prefixes fed again
        "observations_cut": sum(x.observation_cut_tokens > 0 for t in scored for x in t.turns),
        "thinking_truncated": sum(bool(x.thought_close_ids) for t in scored for x in t.turns),  # max_thinking_tokens
        "terminations": dict(sorted(Counter(t.termination or "unfinished" for t in trajectories).items())),
        "termination_fractions": termination_fractions(trajectories),
        # each grading outcome under its own name: a no_tests_ran scored 0 is told apart from a failing test
        "grade_outcomes": dict(sorted(Counter(t.grade.outcome for t in trajectories if t.grade is not None).items())),
        "time_grading_s": sum(t.grade.duration for t in trajectories if t.grade is not None),
    }


def update_metrics(update: dict[str, float]) -> dict[str, float | None]:
    """The policy update's metrics under UPDATE_NAMES (its time and step count are logged elsewhere)."""
    out: dict[str, float | None] = {UPDATE_NAMES.get(k, k): v for k, v in update.items()
                                    if k not in ("seconds", "steps")}
    return {**dict.fromkeys(UPDATE_KEYS), **out}


def reward_stats(rewards: Sequence[float]) -> dict[str, float]:
    """Mean and (population) std of the shaped rewards the advantages were computed from."""
    mean = _mean(rewards)
    return {"reward_mean": mean, "reward_std": math.sqrt(_mean([(r - mean) ** 2 for r in rewards]))}


def advantage_stats(advantages: Tensor) -> dict[str, float]:
    """mean / std / min / max of the advantages, and the fraction that is exactly 0 (no gradient)."""
    if advantages.numel() == 0:
        return {f"advantage_{k}": 0.0 for k in ("mean", "std", "min", "max", "zero_fraction")}
    a = advantages.double()
    return {"advantage_mean": a.mean().item(), "advantage_std": a.std(unbiased=False).item(),
            "advantage_min": a.min().item(), "advantage_max": a.max().item(),
            "advantage_zero_fraction": (a == 0).double().mean().item()}


def termination_fractions(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The share of `trajectories` ending in each termination reason (every reason listed, 0 when none did)."""
    counts = Counter(t.termination or "unfinished" for t in trajectories)
    reasons = [*get_args(Termination), *sorted(set(counts) - set(get_args(Termination)))]
    return {reason: counts[reason] / len(trajectories) if trajectories else 0.0 for reason in reasons}


def group_stats(groups: Sequence[str], advantages: Tensor) -> dict[str, float]:
    """How many groups the advantages compare within, and the share of them with a non-zero advantage: the groups
    the policy can learn from (`groups[i]` is the group of `advantages[i]`)."""
    moving = {g for g, a in zip(groups, advantages.tolist()) if a != 0.0}
    count = len(set(groups))
    return {"groups": count, "nonzero_advantage_group_fraction": len(moving) / count if count else 0.0}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _drop_after(path: Path, iteration: int) -> None:
    """Rewrite `path` without the lines of iterations after `iteration` (and without a line cut by a crash)."""
    read = read_jsonl(path, what="metrics file")
    keep = [record for record in read.records if record.get("iteration", math.inf) <= iteration]
    if len(keep) < len(read.records) or read.cut_at is not None:
        write_atomic(path, "".join(json.dumps(record) + "\n" for record in keep))  # as MetricsLog.write wrote them


def _tensorboard(directory: Path, purge_step: int):
    """A SummaryWriter that hides events of steps >= purge_step (iterations being redone), or None without
    tensorboard installed (metrics.jsonl is then the only record)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(directory), purge_step=purge_step)


def _wandb(run_dir: Path, config: dict | None):
    """A Weights & Biases run logging into RUN/wandb/ (WANDB_MODE=offline: nothing leaves the machine; `wandb sync`
    uploads it later). Its id is kept in RUN/wandb/run-id, so a resumed run continues the same W&B run (an iteration
    redone after a crash is logged again under its step; metrics.jsonl is the record that holds each one once)."""
    try:
        import wandb
    except ImportError:
        raise LoggerError("train.loggers names wandb, but wandb is not installed: pip install 'patchgym[wandb]'") \
            from None
    directory = run_dir / "wandb"
    directory.mkdir(parents=True, exist_ok=True)
    id_file = directory / "run-id"
    if not id_file.exists():
        write_atomic(id_file, uuid.uuid4().hex[:16])
    try:
        # console="off": the run's output stays the terminal's (and pytest's), not wrapped by wandb
        return wandb.init(project=os.environ.get("WANDB_PROJECT", "patchgym"), name=run_dir.resolve().name,
                          id=id_file.read_text().strip(), resume="allow", dir=str(run_dir), config=config,
                          settings=wandb.Settings(console="off"))
    except (wandb.errors.Error, OSError) as exc:
        raise LoggerError(f"train.loggers: wandb could not start ({exc}); WANDB_MODE=offline logs into "
                          f"{directory} without a network (`wandb sync` uploads it later)") from None
