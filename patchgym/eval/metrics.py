"""Evaluation metrics over graded trajectories: Pass@1 as the mean over runs with its standard error, the unbiased
Pass@k estimator, resolve rates per termination reason, and over tasks the mean of per-task rates and the paired gain
between two sets of attempts, with Student's t (docs/algorithms.md §7).

`resolve_rate`, in summary.json as in a train run's metrics.jsonl, is resolved / scored trajectories; the mean of
per-task rates, where every task weighs the same, is a MeanTaskRate's `rate`.

Excluded trajectories (infrastructure errors; unvalidated rows whose tests did not run) say nothing about the model:
they are left out of every rate but one and listed with their reason. That one is the official figure, resolved / all
instances as SWE-bench counts it, where an instance that could not be graded counts as unresolved.
"""

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from patchgym.agent.trajectory import Trajectory, reward
from patchgym.env.grading.grade import GRADING_ERRORS


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) for one task with n samples of which c are correct, computed as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class MeanTaskRate:
    """The mean of per-task resolve rates with its standard error over tasks (mean_task_resolve_rate); unlike
    summary.json's resolve_rate, resolved / scored trajectories, every task weighs the same however often it was
    attempted."""

    rate: float
    se: float  # over tasks: the attempts of one task are not independent
    tasks: int
    attempts: int
    resolved: int

    def as_dict(self) -> dict:
        """The JSON record (learning.json's curves and held-out rates)."""
        return asdict(self)


def mean_task_resolve_rate(per_task: dict[str, list[bool]]) -> MeanTaskRate:
    """The mean of the tasks' resolve rates and its standard error over tasks: p = mean_t r_t,
    se = sqrt(sum_t (r_t - p)^2 / (T (T - 1))), 0 with fewer than two tasks."""
    rates = [sum(x) / len(x) for x in per_task.values() if x]
    n = len(rates)
    p = sum(rates) / n if n else 0.0
    se = math.sqrt(sum((r - p) ** 2 for r in rates) / (n * (n - 1))) if n > 1 else 0.0
    return MeanTaskRate(rate=p, se=se, tasks=n, attempts=sum(len(x) for x in per_task.values() if x),
                        resolved=sum(sum(x) for x in per_task.values()))


@dataclass(frozen=True)
class PairedGain:
    """The gain from `before` to `after` on the tasks attempted in both (paired_gain), with two verdicts on whether it
    is above noise (docs/algorithms.md §7.1): the paired t-test, valid at any number of tasks, and the 2-standard-error
    rule, its large-sample shortcut, far too lenient with few tasks (Student's t is 4.30 at 3 tasks, 2.57 at 6)."""

    per_task: dict[str, float]  # task id -> d_t = r_after(t) - r_before(t), in task id order
    mean: float
    se: float  # sd(d) / sqrt(T) with sd's T - 1 denominator; 0 with fewer than two tasks
    t_critical: float  # Student's t, two-sided 95 %, at T - 1 degrees of freedom; inf with fewer than two tasks

    @property
    def tasks(self) -> int:
        """T: how many tasks the gain is over."""
        return len(self.per_task)

    @property
    def t_threshold(self) -> float:
        return self.t_critical * self.se if self.tasks > 1 else math.inf

    @property
    def t_significant(self) -> bool:
        """mean > t_critical x se: the 95 % confidence interval of the mean gain lies above 0. A zero spread (se 0)
        is no evidence: with few attempts per task, every task changing by the same amount happens by chance."""
        return self.tasks > 1 and self.se > 0 and self.mean > self.t_threshold

    @property
    def two_se_threshold(self) -> float:
        return 2 * self.se

    @property
    def two_se_significant(self) -> bool:
        """mean > 2 se: the t-test with the normal's 1.96 rounded up, which only many tasks justify."""
        return self.tasks > 1 and self.mean > self.two_se_threshold

    def as_dict(self) -> dict:
        """The JSON record (learning.json): `threshold` and `significant` are the 2-standard-error rule's; the t
        values are null with fewer than two tasks."""
        judged = self.tasks > 1
        return {"tasks": self.tasks, "mean": self.mean, "se": self.se, "threshold": self.two_se_threshold,
                "significant": self.two_se_significant, "t_critical": self.t_critical if judged else None,
                "t_threshold": self.t_threshold if judged else None, "t_significant": self.t_significant,
                "per_task": self.per_task}


def paired_gain(before: dict[str, list[bool]], after: dict[str, list[bool]]) -> PairedGain:
    """The gain from `before` to `after` on the same tasks (task id -> attempts' outcomes), as per-task paired
    differences d_t = r_after(t) - r_before(t) over the T tasks attempted in both: mean d and its standard error
    sd(d) / sqrt(T). Pairing removes the tasks' own difficulty from the noise, which two separate rates with their
    own errors keep."""
    tasks = sorted(t for t in before if before[t] and after.get(t))
    diffs = [sum(after[t]) / len(after[t]) - sum(before[t]) / len(before[t]) for t in tasks]
    n = len(diffs)
    mean = sum(diffs) / n if n else 0.0
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    return PairedGain(per_task=dict(zip(tasks, diffs)), mean=mean, se=se,
                      t_critical=t_critical(n - 1) if n > 1 else math.inf)


def t_critical(df: int, confidence: float = 0.95) -> float:
    """The two-sided critical value c of Student's t with `df` degrees of freedom, P(|T| < c) = confidence: 12.706
    at 1, 3.182 at 3, 2.042 at 30, towards the normal's 1.960 as df grows. Bisection on the exact probability."""
    if df < 1 or not 0 < confidence < 1:
        raise ValueError(f"t_critical needs df >= 1 and 0 < confidence < 1, got df={df} confidence={confidence}")
    low, high = 0.0, math.pi / 2  # theta, where t = sqrt(df) tan(theta)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central(mid, df) < confidence else (low, mid)
    return math.sqrt(df) * math.tan((low + high) / 2)


def _t_central(theta: float, df: int) -> float:
    """P(|T| < sqrt(df) tan(theta)) for an integer df, as the finite series of Abramowitz & Stegun 26.7.3 (odd df)
    and 26.7.4 (even df)."""
    c2 = math.cos(theta) ** 2
    term = total = 1.0
    if df % 2:
        if df == 1:
            return 2 * theta / math.pi
        for k in range(1, (df - 1) // 2):  # 1 + (2/3) c2 + (2 4)/(3 5) c2^2 + ... up to c2^((df-3)/2)
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    for k in range(1, df // 2):  # 1 + (1/2) c2 + (1 3)/(2 4) c2^2 + ... up to c2^((df-2)/2)
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return math.sin(theta) * total


def summarize(trajectories: list[Trajectory], runs: int, instances: int | None = None) -> dict:
    """The summary.json of an eval: `trajectories` holds sample r of every task for r < runs; `instances`: how many
    tasks were evaluated (default: those in `trajectories`), the official figure's denominator."""
    valid = [t for t in trajectories if t.scored]
    per_run = [[t for t in valid if t.sample == r] for r in range(runs)]
    rates = [sum(t.resolved for t in run) / len(run) for run in per_run if run]
    mean = sum(rates) / len(rates) if rates else 0.0
    sem = (math.sqrt(sum((r - mean) ** 2 for r in rates) / (len(rates) - 1) / len(rates)) if len(rates) > 1 else 0.0)
    by_task: dict[str, list[bool]] = defaultdict(list)
    for t in valid:
        by_task[t.task_id].append(t.resolved)
    tasks = instances if instances is not None else len({t.task_id for t in trajectories})
    official = [sum(t.resolved for t in trajectories if t.sample == r) / tasks for r in range(runs)] if tasks else []
    summary = {
        "tasks": tasks,
        "runs": runs,
        "trajectories": len(trajectories),
        "resolved": sum(t.resolved for t in valid),
        "official_resolve_rate": sum(official) / len(official) if official else 0.0,
        "graded": len(valid),
        "resolve_rate": sum(t.resolved for t in valid) / len(valid) if valid else 0.0,
        "pass@1": mean,
        "pass@1_sem": sem,
        "pass@1_per_run": rates,
        "mean_reward": _mean([reward(t) for t in valid]),
    }
    for k in range(2, runs + 1):
        scored = [pass_at_k(len(r), sum(r), k) for r in by_task.values() if len(r) >= k]
        summary[f"pass@{k}"] = sum(scored) / len(scored) if scored else None
    summary.update({
        "infra_errors": sum(t.excluded == "infra_error" for t in trajectories),
        "excluded": [_exclusion(t) for t in trajectories if not t.scored],
        "grade_outcomes": dict(sorted(Counter(t.grade.outcome for t in trajectories if t.grade is not None).items())),
        "grading_errors": sum(1 for t in valid if t.grade is not None and t.grade.error in GRADING_ERRORS),
        "by_termination": _by_termination(trajectories),
        "mean_steps": _mean([t.steps for t in valid]),
        "mean_sampled_tokens": _mean([t.sampled_tokens for t in valid]),
        "mean_tokens": _mean([sum(len(x.prompt_ids) + len(x.output_ids) + len(x.close_ids) for x in t.turns)
                              for t in valid]),
        "mean_seconds": _mean([t.seconds for t in valid]),
        "format_errors": sum(t.format_errors for t in valid),
    })
    return summary


def _exclusion(trajectory: Trajectory) -> dict:
    t = trajectory
    detail = t.error or (t.grade.error_detail if t.grade is not None else "") or ""
    return {"trajectory_id": t.trajectory_id or t.task_id, "task_id": t.task_id, "sample": t.sample,
            "reason": t.excluded, "detail": detail[:500]}


def _by_termination(trajectories: list[Trajectory]) -> dict:
    out: dict[str, dict] = {}
    for reason in sorted({t.termination or "unfinished" for t in trajectories}):
        group = [t for t in trajectories if (t.termination or "unfinished") == reason]
        resolved = sum(t.resolved for t in group)
        out[reason] = {"count": len(group), "resolved": resolved, "resolve_rate": resolved / len(group)}
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
