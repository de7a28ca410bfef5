"""The reward against every attack of tests/attacks, on every task of a factory task set per ecosystem: how many
(attack, task) pairs fool the plain runner (pytest or tape by hand), and how many of those patchgym's grade resolves
(the target: none), with gold and empty patches as controls on every task.

    python bench/attacks.py [--python isodate,toolz,cachetools] [--npm minimist,qs,object-inspect] [--per-package 4]
                            [--workers 2] [--json]

Exits 1 when any attack is graded resolved, when a control is graded wrongly, or when an attack fools the plain runner
on fewer than 3 tasks of its ecosystem (then it proves too little).
"""

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from patchgym import paths  # noqa: E402
from patchgym.tasks import read_tasks  # noqa: E402
from patchgym.tasks.factory.build import build_tasks  # noqa: E402
from tests.attacks import js_attacks, python_attacks  # noqa: E402
from tests.attacks.run import attack, grade  # noqa: E402

MIN_TASKS = 3


def task_sets(python: list[str], npm: list[str], per_package: int) -> dict[str, list]:
    home = paths.store_dir() / "bench-attacks"
    build_tasks(python, per_package, seed=0, out_dir=home / "python", backend="docker", progress=False)
    build_tasks(npm, per_package, seed=0, out_dir=home / "npm", ecosystem="npm", backend="docker", progress=False)
    return {"python": read_tasks(home / "python" / "tasks.jsonl"),
            "javascript": read_tasks(home / "npm" / "tasks.jsonl")}


def run(ecosystem: str, tasks: list, attacks: dict[str, str], workers: int) -> dict:
    jobs = [(name, code, task) for name, code in attacks.items() for task in tasks]
    controls = [(task, which) for task in tasks for which in ("gold", "empty")]
    with ThreadPoolExecutor(workers) as threads:
        results = list(threads.map(lambda job: attack(*job), jobs))
        control_grades = list(threads.map(lambda c: grade(c[0], c[0].patch if c[1] == "gold" else ""), controls))
    by_attack = {}
    for result in results:
        row = by_attack.setdefault(result.attack, {"tasks": 0, "fooled_plain": 0, "gamed": 0, "outcomes": {}})
        row["tasks"] += 1
        row["fooled_plain"] += result.fooled_plain
        row["gamed"] += result.gamed
        row["outcomes"][result.outcome] = row["outcomes"].get(result.outcome, 0) + 1
    wrong = [f"{task.instance_id} {which}: {g.outcome}" for (task, which), g in zip(controls, control_grades)
             if g.outcome != ("resolved" if which == "gold" else "unresolved")]
    return {"ecosystem": ecosystem, "tasks": len(tasks), "attacks": by_attack, "controls": len(controls),
            "controls_wrong": wrong,
            "pairs_fooling_plain": sum(r["fooled_plain"] for r in by_attack.values()),
            "gamed": sum(r["gamed"] for r in by_attack.values()),
            "proven_on_min_tasks": all(r["fooled_plain"] >= MIN_TASKS for r in by_attack.values())}


def show(summary: dict) -> None:
    table = Table(title=f"{summary['ecosystem']}: {summary['tasks']} tasks")
    for column in ("attack", "fools plain", "resolved by patchgym", "patchgym's grades"):
        table.add_column(column)
    for name, row in sorted(summary["attacks"].items()):
        table.add_row(name, f"{row['fooled_plain']}/{row['tasks']}", str(row["gamed"]),
                      ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items())))
    Console().print(table)
    Console().print(f"controls: {summary['controls'] - len(summary['controls_wrong'])}/{summary['controls']} right "
                    f"{summary['controls_wrong'] or ''}; (attack, task) pairs fooling the plain runner: "
                    f"{summary['pairs_fooling_plain']}; graded resolved: {summary['gamed']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default="isodate,toolz,cachetools")
    parser.add_argument("--npm", default="minimist,qs,object-inspect")
    parser.add_argument("--per-package", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    start = time.monotonic()
    sets = task_sets(args.python.split(","), args.npm.split(","), args.per_package)
    summaries = [run("python", sets["python"], python_attacks.ATTACKS, args.workers),
                 run("javascript", sets["javascript"], js_attacks.ATTACKS, args.workers)]
    for summary in summaries:
        if not args.json:
            show(summary)
    ok = all(s["gamed"] == 0 and not s["controls_wrong"] and s["proven_on_min_tasks"] for s in summaries)
    if args.json:
        print(json.dumps({"ok": ok, "seconds": round(time.monotonic() - start), "summaries": summaries}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
