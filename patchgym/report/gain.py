"""A train run's gain on the tasks it attempted in every iteration: each iteration's resolve rate over those tasks
(mean of per-task rates, with its standard error over tasks) and the paired gain from the first iteration's
rollouts to the last's (patchgym.eval.metrics.paired_gain), with a verdict a reader can take as it is: above noise
when the mean per-task gain exceeds twice its standard error, within noise otherwise.

Rollouts of iteration N are sampled by the policy after N - 1 updates, so first -> last measures N - 1 updates.
A run that draws other tasks each iteration (train.tasks_per_iteration below the task count) has no task in every
iteration, and so no such gain: epochs over a fixed set (tasks_per_iteration = the number of tasks) have one."""

from collections import defaultdict

from patchgym.eval.metrics import paired_gain, resolve_rate


def iteration_gain(trajectories: list[dict]) -> dict | str:
    """From report rows (patchgym.report.runs.trajectory_facts) of a train run: {"tasks": the tasks attempted in
    every iteration, "curve": [{iteration, rate, se}], "gain": paired_gain of first -> last, "verdict": text}, or
    a string saying why there is none."""
    outcomes: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for row in trajectories:
        if row.get("iteration") is not None and row.get("scored", True):
            outcomes[row["iteration"]][row["task_id"]].append(bool(row["resolved"]))
    iterations = sorted(outcomes)
    if len(iterations) < 2:
        return f"{len(iterations)} iteration with scored rollouts: a gain needs the first and a later one"
    common = sorted(set.intersection(*(set(outcomes[i]) for i in iterations)))
    if not common:
        return ("no task was attempted in every iteration (each drew other tasks): set train.tasks_per_iteration "
                "to the number of tasks for epochs over a fixed set")
    curve = [{"iteration": i, **resolve_rate({t: outcomes[i][t] for t in common})} for i in iterations]
    first, last = outcomes[iterations[0]], outcomes[iterations[-1]]
    gain = paired_gain({t: first[t] for t in common}, {t: last[t] for t in common})
    return {"tasks": common, "curve": curve, "gain": gain, "verdict": verdict(gain, iterations[0], iterations[-1])}


def verdict(gain: dict, first: int, last: int) -> str:
    """One sentence: the paired gain in percentage points, ± 2 standard errors, and whether that is above noise."""
    mean, band, n = 100 * gain["mean"], 200 * gain["se"], gain["tasks"]
    if n < 2:
        return (f"iteration {first} -> {last}: {mean:+.1f} pts on 1 task; one task has no spread to judge noise by")
    side = ("above noise (gain > 2 standard errors)" if gain["significant"]
            else "within noise (gain <= 2 standard errors)")
    return f"iteration {first} -> {last}: {mean:+.1f} ± {band:.1f} pts (2 standard errors) over {n} tasks, {side}"
