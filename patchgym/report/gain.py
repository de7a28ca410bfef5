"""A train run's gain on the tasks it attempted in every iteration: each iteration's mean of per-task resolve rates
over those tasks, with its standard error over tasks, and the paired gain from the first iteration's rollouts to the
last's (patchgym.eval.metrics.paired_gain), with a verdict a reader can take as it is: above noise when the paired
t-test says so (Student's t at T - 1 degrees of freedom over T tasks), within noise otherwise. The 2-standard-error
rule's verdict is given beside it, labelled, because with a handful of tasks it calls noise a gain.

Rollouts of iteration N are sampled by the policy after N - 1 updates, so first -> last measures N - 1 updates.
A run that draws other tasks each iteration (train.tasks_per_iteration below the task count) has no task in every
iteration, and so no such gain: epochs over a fixed set (tasks_per_iteration = the number of tasks) have one."""

from collections import defaultdict
from dataclasses import dataclass

from patchgym.eval.metrics import MeanTaskRate, PairedGain, mean_task_resolve_rate, paired_gain


class NoIterationGain(ValueError):
    """A train run with no gain to compute; the message says why."""


@dataclass(frozen=True)
class IterationGain:
    """The rate curve and the paired gain of a train run over the tasks it attempted in every iteration."""

    curve: dict[int, MeanTaskRate]  # iteration -> its rate over those tasks, in iteration order
    gain: PairedGain  # first iteration -> last

    @property
    def first(self) -> int:
        return min(self.curve)

    @property
    def last(self) -> int:
        return max(self.curve)

    @property
    def verdict(self) -> str:
        """One sentence: the gain in percentage points with its standard error, and the paired t-test's verdict."""
        g = self.gain
        if g.tasks < 2:
            return self._one_task()
        if g.se == 0:
            side = "within noise by Student's t (every task changed by the same amount: no spread to judge noise by)"
        else:
            side = (f"{'above' if g.t_significant else 'within'} noise by Student's t at 95 % (gain "
                    f"{'>' if g.t_significant else '<='} {g.t_critical:.2f} standard errors = {100 * g.t_threshold:.1f}"
                    f" pts at {g.tasks - 1} degrees of freedom)")
        return (f"iteration {self.first} -> {self.last}: {100 * g.mean:+.1f} pts over {g.tasks} tasks (standard "
                f"error {100 * g.se:.1f}), {side}")

    @property
    def two_se_verdict(self) -> str:
        """The same gain judged by the 2-standard-error rule, which only many tasks justify."""
        g = self.gain
        if g.tasks < 2:
            return self._one_task()
        side = ("above noise by the 2-standard-error rule (gain > 2 standard errors)" if g.two_se_significant
                else "within noise by the 2-standard-error rule (gain <= 2 standard errors)")
        return (f"iteration {self.first} -> {self.last}: {100 * g.mean:+.1f} ± {100 * g.two_se_threshold:.1f} pts "
                f"(2 standard errors) over {g.tasks} tasks, {side}")

    def _one_task(self) -> str:
        return (f"iteration {self.first} -> {self.last}: {100 * self.gain.mean:+.1f} pts on 1 task; one task has no "
                "spread to judge noise by")


def iteration_gain(trajectories: list[dict]) -> IterationGain:
    """From report rows (patchgym.report.runs.trajectory_facts) of a train run: the gain over the tasks attempted in
    every iteration. Raises NoIterationGain when there is none: fewer than two iterations, or no such task."""
    outcomes: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for row in trajectories:
        if row.get("iteration") is not None and row.get("scored", True):
            outcomes[row["iteration"]][row["task_id"]].append(bool(row["resolved"]))
    iterations = sorted(outcomes)
    if len(iterations) < 2:
        raise NoIterationGain(f"{len(iterations)} iteration with scored rollouts: a gain needs the first and a "
                              "later one")
    common = sorted(set.intersection(*(set(outcomes[i]) for i in iterations)))
    if not common:
        raise NoIterationGain("no task was attempted in every iteration (each drew other tasks): set "
                              "train.tasks_per_iteration to the number of tasks for epochs over a fixed set")
    curve = {i: mean_task_resolve_rate({t: outcomes[i][t] for t in common}) for i in iterations}
    first, last = outcomes[iterations[0]], outcomes[iterations[-1]]
    return IterationGain(curve, paired_gain({t: first[t] for t in common}, {t: last[t] for t in common}))
