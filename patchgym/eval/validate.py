"""`patchgym tasks validate`: keep only the rows whose tests tell a fix from no fix, in the row's own image.

For every row, `runs` times each: the gold patch must resolve and the empty patch must not. What each run saw is
recorded (the FAIL_TO_PASS / PASS_TO_PASS actually observed); a row is broken, with its reason, when its image is
missing, its tests did not run, the gold patch fails (which tests), the empty patch resolves, or a test's status
changed between runs of the same patch (flaky). This is the filter SWE-Gym and SWE-rebench users run before training.

OUT/ holds checks.jsonl (one line per row, appended as each finishes, so a rerun resumes: it checks again only the
rows whose image was missing or whose sandbox failed, which a pull or a retry may fix), tasks.jsonl (the valid
rows, `validated` set) and broken.md (the broken rows and why), both rewritten atomically every WRITE_EVERY_S seconds
and at the end (after every row, they would cost time quadratic in the rows of a 20K-row dataset).
"""

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from patchgym.env.grading.grade import Grade
from patchgym.env.grading.grader import grade_patch
from patchgym.env.grading.parsers import PASSING
from patchgym.files import append_line, drop_cut_line, read_jsonl, write_atomic
from patchgym.sandbox import SandboxConfig
from patchgym.tasks import Task
from patchgym.tasks.task import write_tasks

Reason = Literal["missing_image", "infra", "ungradable", "tests_did_not_run", "gold_fails", "empty_resolves", "flaky"]
REASON_TEXT = {"missing_image": "missing image", "infra": "sandbox failed", "ungradable": "grader refused the row",
               "tests_did_not_run": "tests did not run",
               "gold_fails": "gold patch fails", "empty_resolves": "empty patch resolves", "flaky": "flaky"}
Grader = Callable[[Task, str], Grade]
WRITE_EVERY_S = 30.0
CHECK_AGAIN: frozenset[str] = frozenset({"missing_image", "infra"})  # the machine's faults, not the row's


class Check(BaseModel):
    """What validating one row found."""

    instance_id: str
    valid: bool
    reason: Reason | None = None
    detail: str = ""
    observed_f2p: list[str] = Field(default_factory=list, description="passed with gold, failed unpatched, every run")
    observed_p2p: list[str] = Field(default_factory=list, description="passed with gold and unpatched, every run")
    gold: list[str] = Field(default_factory=list, description="each gold run's outcome")
    empty: list[str] = Field(default_factory=list, description="each empty-patch run's outcome")


def check_task(task: Task, grade: Grader, runs: int = 2) -> Check:
    """Grade `task`'s gold and empty patches `runs` times each and say whether the row can be trusted, and why not.

    The first grading that did not reach a verdict ends the check: the row is broken whatever the others would say.
    """
    gold, empty = [], []
    for _ in range(runs):
        for name, patch, grades in (("gold", task.patch, gold), ("empty patch", "", empty)):
            try:
                grades.append(grade(task, patch))
            except Exception as exc:  # a row the grader cannot handle (an unknown log parser) must not end the run
                return _broken(task, gold, empty, "ungradable", f"{name}: {type(exc).__name__}: {exc}")
            last = grades[-1]
            if _missing_image(last):
                return _broken(task, gold, empty, "missing_image",
                               f"{task.image or 'the base image'}: {last.error_detail}")
            if last.error is not None:
                reason = "infra" if last.error == "infra" else "tests_did_not_run"
                return _broken(task, gold, empty, reason, f"{name}: {last.error}: {last.error_detail[:300]}")
    changed = sorted({t for grades in (gold, empty) for g in grades[1:] for t, s in _graded(g).items()
                      if s != _graded(grades[0]).get(t)})
    if changed:
        def statuses(grades: list[Grade], t: str) -> list[str | None]:
            return [_graded(g).get(t) for g in grades]

        runs_seen = "; ".join(f"{t}: gold {statuses(gold, t)}, empty {statuses(empty, t)}" for t in changed[:5])
        return _broken(task, gold, empty, "flaky", f"status changed between runs: {runs_seen}")
    if not gold[0].resolved:
        failing = {t: s for t, s in _graded(gold[0]).items() if s not in PASSING}
        return _broken(task, gold, empty, "gold_fails", ", ".join(f"{t} {s}" for t, s in failing.items()))
    if empty[0].resolved:
        return _broken(task, gold, empty, "empty_resolves", "every FAIL_TO_PASS test passes unpatched")
    return Check(instance_id=task.instance_id, valid=True, detail=_mislabelled(task, gold, empty),
                 **_observed(gold, empty), gold=[g.outcome for g in gold], empty=[g.outcome for g in empty])


def validate(tasks: list[Task], out: str | Path, config: SandboxConfig | None = None, *, runs: int = 2,
             timeout: float = 600.0, workers: int = 1, progress: bool = True, grade: Grader | None = None
             ) -> list[Check]:
    """Check every task, `workers` rows at a time (resuming what `out` already holds), writing OUT/ as it goes;
    return every row's Check, in the order of `tasks`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    grade = grade or (lambda task, patch: grade_patch(task, patch, config, timeout=timeout))
    done = _done(out / "checks.jsonl")
    checks = {t.instance_id: done[t.instance_id] for t in tasks
              if t.instance_id in done and done[t.instance_id].reason not in CHECK_AGAIN}
    todo = list({t.instance_id: t for t in tasks if t.instance_id not in checks}.values())
    written = time.monotonic()
    pool = ThreadPoolExecutor(max(1, workers))
    try:
        with _progress(progress) as bar:
            job = bar.add_task("validate", total=len(checks) + len(todo), completed=len(checks))
            for future in as_completed([pool.submit(check_task, task, grade, runs) for task in todo]):
                check = future.result()
                append_line(out / "checks.jsonl", check.model_dump_json())
                checks[check.instance_id] = check
                if time.monotonic() - written > WRITE_EVERY_S:
                    _write(out, tasks, checks)
                    written = time.monotonic()
                bar.advance(job)
    finally:  # on Ctrl-C too: rows not started are dropped, and what was found so far is written
        pool.shutdown(wait=False, cancel_futures=True)
        _write(out, tasks, checks)
    return [checks[t.instance_id] for t in tasks]


def broken_table(checks: list[Check]) -> Table:
    """The terminal view of broken.md."""
    table = Table(title=f"tasks validate: {sum(c.valid for c in checks)} valid, "
                        f"{sum(not c.valid for c in checks)} broken")
    for column in ("instance_id", "reason", "detail"):
        table.add_column(column, overflow="fold")
    for check in checks:
        if not check.valid:
            table.add_row(check.instance_id, REASON_TEXT[check.reason], check.detail[:200])
    return table


def _graded(grade: Grade) -> dict[str, str]:
    return {**grade.f2p, **grade.p2p}


def _missing_image(grade: Grade) -> bool:
    # An image the engine lacks and its registry cannot give (ImagePullError: "cannot pull image ..."), whatever why.
    return grade.error == "infra" and ("not found" in grade.error_detail or "cannot pull image" in grade.error_detail)


def _broken(task: Task, gold: list[Grade], empty: list[Grade], reason: Reason, detail: str) -> Check:
    return Check(instance_id=task.instance_id, valid=False, reason=reason, detail=detail,
                 gold=[g.outcome for g in gold], empty=[g.outcome for g in empty])


def _observed(gold: list[Grade], empty: list[Grade]) -> dict[str, list[str]]:
    """The tests every gold run passed, split by whether every unpatched run failed them or passed them."""
    def passed(grades: list[Grade]) -> set[str]:
        return set.intersection(*({t for t, s in g.tests.items() if s in PASSING} for g in grades))

    failed = set.intersection(*({t for t, s in g.tests.items() if s not in PASSING} for g in empty))
    gold_passed = passed(gold)
    return {"observed_f2p": sorted(gold_passed & failed), "observed_p2p": sorted(gold_passed & passed(empty))}


def _mislabelled(task: Task, gold: list[Grade], empty: list[Grade]) -> str:
    """A note on a valid row whose lists say more than its runs showed: a FAIL_TO_PASS test that passes unpatched."""
    passing = sorted(t for t in task.FAIL_TO_PASS if empty[0].f2p.get(t) in PASSING)
    return f"FAIL_TO_PASS tests that pass unpatched: {', '.join(passing)}" if passing else ""


def _done(path: Path) -> dict[str, Check]:
    """The checks a previous run appended, the last of each row winning; a line cut short by a crash is dropped and
    its row checked again."""
    read = read_jsonl(path, Check.model_validate, what="checks file")
    drop_cut_line(path, read.cut_at)
    return {check.instance_id: check for check in read.records}


def _write(out: Path, tasks: list[Task], checks: dict[str, Check]) -> None:
    valid = [t.model_copy(update={"validated": True}) for t in tasks
             if t.instance_id in checks and checks[t.instance_id].valid]
    write_tasks(valid, out / "tasks.jsonl")
    rows = [f"| {c.instance_id} | {REASON_TEXT[c.reason]} | {_cell(c.detail)} |\n"
            for c in checks.values() if not c.valid]
    summary = f"{len(valid)} valid, {len(rows)} broken, {len(tasks) - len(checks)} not checked yet\n"
    table = "| instance_id | reason | detail |\n|---|---|---|\n" + "".join(rows)
    write_atomic(out / "broken.md", f"# Broken rows\n\n{summary}\n{table}")


def _cell(text: str) -> str:
    return json.dumps(text)[1:-1].replace("|", "\\|")[:500]


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled)
