"""Evaluation metrics over graded trajectories: Pass@1 as the mean over runs with its standard error, the unbiased
Pass@k estimator, and resolve rates per termination reason (docs/algorithms.md §7).

Excluded trajectories (infrastructure errors; unvalidated rows whose tests did not run) say nothing about the model:
they are left out of every rate but one and listed with their reason. That one is the official figure, resolved / all
instances as SWE-bench counts it, where an instance that could not be graded counts as unresolved.
"""

import math
from collections import Counter, defaultdict

from patchgym.agent.trajectory import Trajectory, reward
from patchgym.env.grading.grade import GRADING_ERRORS


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) for one task with n samples of which c are correct, computed as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def resolve_rate(per_task: dict[str, list[bool]]) -> dict:
    """The mean of the tasks' resolve rates and its standard error over tasks (attempts of one task are not
    independent): p = mean_t r_t, se = sqrt(sum_t (r_t - p)^2 / (T (T - 1))), 0 with fewer than two tasks."""
    rates = [sum(x) / len(x) for x in per_task.values() if x]
    n = len(rates)
    p = sum(rates) / n if n else 0.0
    se = math.sqrt(sum((r - p) ** 2 for r in rates) / (n * (n - 1))) if n > 1 else 0.0
    return {"rate": p, "se": se, "tasks": n, "attempts": sum(len(x) for x in per_task.values() if x),
            "resolved": sum(sum(x) for x in per_task.values())}


def paired_gain(before: dict[str, list[bool]], after: dict[str, list[bool]]) -> dict:
    """The gain from `before` to `after` on the same tasks (task id -> attempts' outcomes), as per-task paired
    differences d_t = r_after(t) - r_before(t) over the T tasks attempted in both: mean d, its standard error
    sd(d) / sqrt(T) with sd's T - 1 denominator, and `significant` when mean d > 2 se (T >= 2). Pairing removes
    the tasks' own difficulty from the noise, which two separate rates with their own errors keep."""
    tasks = sorted(t for t in before if before[t] and after.get(t))
    diffs = [sum(after[t]) / len(after[t]) - sum(before[t]) / len(before[t]) for t in tasks]
    n = len(diffs)
    mean = sum(diffs) / n if n else 0.0
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    t_crit = T_975[min(n - 1, len(T_975)) - 1] if n > 1 else math.inf
    return {"tasks": n, "mean": mean, "se": se, "threshold": 2 * se, "significant": n > 1 and mean > 2 * se,
            "t_threshold": t_crit * se, "t_significant": n > 1 and se > 0 and mean > t_crit * se,
            "per_task": dict(zip(tasks, diffs))}


# Student's t, two-sided 95 % (the 0.975 quantile), for 1..30 degrees of freedom; beyond 30, 2.04 stands for them.
# With few tasks "2 standard errors" is far too lenient (t = 12.7 at 1 degree of freedom, 3.18 at 3), hence the
# second verdict of paired_gain, `t_significant`, which also refuses a zero spread (se 0) as evidence.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


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
