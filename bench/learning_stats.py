"""The arithmetic of bench/learning.py, apart so that its test imports no model stack: resolve rates with their
standard error over tasks (the gain itself is paired: patchgym.eval.metrics.paired_gain)."""

import math


def resolve_rate(per_task: dict[str, list[bool]]) -> dict:
    """The mean of the tasks' resolve rates and its standard error over tasks (attempts of one task are not
    independent): p = mean_t r_t, se = sqrt(sum_t (r_t - p)^2 / (T (T - 1))), 0 with fewer than two tasks."""
    rates = [sum(x) / len(x) for x in per_task.values() if x]
    n = len(rates)
    p = sum(rates) / n if n else 0.0
    se = math.sqrt(sum((r - p) ** 2 for r in rates) / (n * (n - 1))) if n > 1 else 0.0
    return {"rate": p, "se": se, "tasks": n, "attempts": sum(len(x) for x in per_task.values() if x),
            "resolved": sum(sum(x) for x in per_task.values())}

