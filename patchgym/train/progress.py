"""The progress line of a training stage's steps (the warm start's SFT steps, the pivot stage's iterations): label,
steps done of all, what the last step measured, time elapsed and left.

On a terminal it is a live rich bar, gone when the stage ends. Where the output is not a terminal (a log file, a
pipe, `make demo > log`) a live bar draws nothing at all, so there the same facts are printed as plain lines: at
the first step, then at most one every `every_s` seconds, and at the last.
"""

import time
from datetime import timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class StepBar(Progress):
    """A rich Progress of one task, `total` steps under `label` (None: it shows nothing); advance it with
    `update(bar.task_ids[0], advance=1, description=...)`."""

    def __init__(self, label: str | None, total: int, *, every_s: float = 30.0, console: Console | None = None):
        super().__init__(TextColumn(label or ""), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                         TimeElapsedColumn(), TimeRemainingColumn(), transient=True, disable=label is None,
                         console=console)
        self.label, self.every_s = label, every_s
        self._printed_at: float | None = None
        self.add_task("", total=total)

    def start(self) -> None:
        if self.console.is_terminal:  # elsewhere a live display draws nothing, and rich ends it with a blank line
            super().start()

    def stop(self) -> None:
        if self.console.is_terminal:
            super().stop()

    def update(self, task_id: TaskID, **changes) -> None:
        super().update(task_id, **changes)
        if self.disable or self.console.is_terminal:
            return
        task = next(t for t in self.tasks if t.id == task_id)
        now = time.monotonic()
        if self._printed_at is None or now - self._printed_at >= self.every_s or task.finished:
            self._printed_at = now
            self.console.print(self.line(task), soft_wrap=True, highlight=False, markup=False)

    def line(self, task: Task) -> str:
        """The plain line of `task`: label, steps, description, elapsed and (from the mean step so far) left."""
        elapsed = task.elapsed or 0.0
        done, total = int(task.completed), int(task.total or 0)
        left = elapsed / done * (total - done) if done else None
        parts = [f"{self.label}: {done}/{total}", task.description, f"{_clock(elapsed)} elapsed",
                 f"{_clock(left)} left" if left is not None else "time left unknown"]
        return ", ".join(p for p in parts if p)


def step_bar(label: str | None, total: int) -> StepBar:
    """The progress line of `total` steps under `label`, drawing nothing when `label` is None."""
    return StepBar(label, total)


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))
