"""Grading overhead: a whole grade (warm pool) against the bare test command in the same image, in one run.

    python bench/grading.py --tasks TASKS.jsonl [--backend local|docker] [--limit N] [--repeat K] [--json]

bare = the task's test command alone in a ready sandbox of its image (bug applied, nothing else);
grade = grade_patch of the gold fix: fresh sandbox from a warm pool, bug, snapshot, patch, restore the grader's
files, run with the structured report, parse. Target: grade / bare <= 1.3.

The pull half is bench/pull.py: a 1 GB image from a local registry through patchgym against `docker pull`.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from patchgym.env.grading.grader import grade_patch
from patchgym.env.workspace import apply_patch
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks import read_tasks

TARGET = 1.3


def bare_ms(task, config: SandboxConfig, repeat: int) -> float:
    with open_sandbox(config, image=task.image or None) as sb:
        apply_patch(sb, task.bug_patch, task.workdir, "bug")
        samples = []
        for _ in range(repeat + 1):
            start = time.perf_counter()
            sb.exec(task.test_cmd, cwd=task.workdir, timeout=1800)
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples[1:])  # the first run warms caches


def grade_ms(task, config: SandboxConfig, pools: PoolSet, repeat: int) -> float:
    samples = []
    for _ in range(repeat + 1):
        while len(pools.pool(task.image or None)._idle) < pools.size:
            time.sleep(0.01)  # measure warm-pool hits, as in a steady training loop
        start = time.perf_counter()
        grade = grade_patch(task, task.patch, config, timeout=1800, pools=pools)
        samples.append((time.perf_counter() - start) * 1000)
        if not grade.resolved:
            raise RuntimeError(f"{task.instance_id}: the gold patch did not resolve: {grade}")
    return statistics.median(samples[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = SandboxConfig(backend=args.backend)
    rows = []
    with PoolSet(config, size=2, max_concurrency=4) as pools:
        for task in read_tasks(args.tasks)[: args.limit]:
            bare = bare_ms(task, config, args.repeat)
            graded = grade_ms(task, config, pools, args.repeat)
            rows.append({"instance_id": task.instance_id, "bare_ms": bare, "grade_ms": graded, "ratio": graded / bare})
    summary = {"backend": args.backend, "tasks": len(rows),
               "median_ratio": statistics.median(r["ratio"] for r in rows),
               "median_bare_ms": statistics.median(r["bare_ms"] for r in rows),
               "median_grade_ms": statistics.median(r["grade_ms"] for r in rows)}
    summary["target_met"] = summary["median_ratio"] <= TARGET
    if args.json:
        print(json.dumps({**summary, "per_task": rows}))
    else:
        table = Table(title=f"grading overhead ({args.backend}, warm pool)")
        for column in ("task", "bare ms", "grade ms", "ratio"):
            table.add_column(column)
        for r in rows:
            table.add_row(r["instance_id"], f"{r['bare_ms']:.0f}", f"{r['grade_ms']:.0f}", f"{r['ratio']:.2f}")
        Console().print(table)
        Console().print(f"median ratio {summary['median_ratio']:.2f} (target <= {TARGET}): "
                        + ("met" if summary["target_met"] else "MISSED"))
    return 0 if summary["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
