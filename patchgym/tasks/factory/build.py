"""The task factory's procedure, one for every ecosystem: for each package, its candidates in seed order, validated
in parallel, each result saved as it completes (a rerun skips what is done); then the first `per_package` distinct
bugs of each become tasks, and a task whose gold patch the grader does not resolve is dropped.

    build_tasks(["toolz", "boltons"], per_package=20, seed=0, out_dir=Path("runs/factory"))
    build_tasks(["minimist"], per_package=3, seed=0, out_dir=Path("runs/npm"), ecosystem="npm", backend="docker")
"""

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from patchgym.env.grading.grader import grade_patch
from patchgym.errors import UserError
from patchgym.sandbox import SandboxConfig, images
from patchgym.sandbox.pool import SandboxPool
from patchgym.tasks.factory.ecosystem import Ecosystem, Recipe, ecosystem_named
from patchgym.tasks.factory.hidden import check_hidden
from patchgym.tasks.factory.mutate import order_mutations
from patchgym.tasks.factory.records import Baseline
from patchgym.tasks.factory.sources import WORKDIR
from patchgym.tasks.factory.validate import Validation, baseline, save_json, select, validate_in_order
from patchgym.tasks.task import Task, write_tasks

# Candidates tried per wanted task before a package gives up (packages keep about 1 in 2; markupsafe, whose few
# tests make many bugs look alike, 1 in 3).
TRIES_PER_TASK = 25
DEFAULT_ECOSYSTEM = "pypi"  # its packages are shown by their name alone


@dataclass
class FactoryResult:
    """What a factory run made (OUT/summary.json is its asdict). `packages`: name -> its stats (version, image,
    candidates, tried, kept, dropped by reason, the clean suite's figures, seconds), or {error, seconds}."""

    ecosystem: str
    packages: dict[str, dict]
    tasks: int
    seconds: float
    tasks_file: str


@dataclass(frozen=True)
class _Run:
    """One factory run's settings, the same for each of its packages."""

    ecosystem: Ecosystem
    per_package: int
    seed: int
    out_dir: Path
    config: SandboxConfig
    workers: int


def build_tasks(packages: list[str], per_package: int, seed: int, out_dir: Path, *, ecosystem: str = DEFAULT_ECOSYSTEM,
                backend: str = "local", workers: int = 2, progress: bool = True) -> FactoryResult:
    """Build up to `per_package` tasks for each of `packages` (names in the recipes of the registered `ecosystem`)
    into `out_dir/tasks.jsonl`; return the summary."""
    run = _Run(ecosystem_named(ecosystem), per_package, seed, Path(out_dir), SandboxConfig(backend=backend), workers)
    recipes = run.ecosystem.recipes()
    unknown = [p for p in packages if p not in recipes]
    if unknown:
        raise UserError(f"no recipe for {', '.join(unknown)}; known: {', '.join(recipes)} ({ecosystem} packages)")
    out_dir = run.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    start = time.monotonic()
    summary, tasks = {}, []
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console,
                  disable=not progress) as bar:
        for name in packages:
            row = bar.add_task(name if ecosystem == DEFAULT_ECOSYSTEM else f"{ecosystem} {name}", total=per_package,
                               note="preparing")
            package_start = time.monotonic()
            try:
                made, stats = _build_package(run, recipes[name], lambda **kw: bar.update(row, **kw))
            except Exception as exc:  # one broken package must not cost the others their tasks
                made, stats = [], {"error": f"{type(exc).__name__}: {exc}"}
                bar.update(row, note=f"[red]failed: {type(exc).__name__}")
            stats["seconds"] = round(time.monotonic() - package_start, 1)
            summary[name] = stats
            tasks += made
    write_tasks(tasks, out_dir / "tasks.jsonl")
    result = FactoryResult(ecosystem, summary, len(tasks), round(time.monotonic() - start, 1),
                           str(out_dir / "tasks.jsonl"))
    save_json(out_dir / "summary.json", asdict(result))
    if progress:
        console.print(summary_table(result))
    return result


def summary_table(result: FactoryResult) -> Table:
    table = Table(title=f"task factory: {result.tasks} tasks in {result.seconds / 60:.1f} min")
    for column in ("package", "tried", "kept", "dropped (by reason)", "min"):
        table.add_column(column)
    for name, stats in result.packages.items():
        dropped = ", ".join(f"{reason} {n}" for reason, n in sorted(stats.get("dropped", {}).items()))
        table.add_row(f"{name} {stats.get('version', '')}", str(stats.get("tried", 0)), str(stats.get("kept", 0)),
                      stats.get("error") or dropped, f"{stats['seconds'] / 60:.1f}")
    return table


def _build_package(run: _Run, recipe: Recipe, update: Callable[..., None]) -> tuple[list[Task], dict]:
    """One package's tasks and stats: its image (refused where it holds a readable copy of what a task hides), its
    clean suite, its candidates validated in order, and the first `per_package` distinct kept bugs as tasks."""
    ecosystem, config = run.ecosystem, run.config
    fetched = ecosystem.fetch(recipe)
    update(note="building image")
    images.ensure_image(fetched.image, config.backend, progress=False)
    tag = fetched.image.tag
    image = fetched.image if config.backend != "docker" else tag
    home = run.out_dir / recipe.key
    sources = recipe.source_files(fetched.tree)
    found = [m for path, text in sources.items() for m in ecosystem.find_mutations(path, text)]
    update(note="looking for copies")
    check_hidden(image, ecosystem.protected(recipe, fetched.tree, found), WORKDIR, recipe.key, config,
                 cache=home / "hidden.json")
    candidates = order_mutations(found, run.seed, ecosystem.strategies)[: run.per_package * TRIES_PER_TASK]
    with SandboxPool(config, image, size=run.workers, max_concurrency=run.workers) as pool:
        update(note="clean runs")
        base = _cached_baseline(home, tag, lambda: baseline(pool, recipe, ecosystem.run_suite))
        job = Validation(ecosystem, recipe, pool, base, sources, run.seed, home, tag)
        order, outcomes = validate_in_order(job, candidates, run.per_package, run.workers, update)
    considered, selected, dropped = select(order, outcomes, run.per_package)
    made = [ecosystem.task_row(recipe, tag, fetched.tree, bug, outcomes[bug.id], base) for bug in selected]
    resolves = [_gold_resolves(task, config, recipe.timeout * 3, home) for task in made]
    if not all(resolves):
        dropped["gold_not_resolved"] = resolves.count(False)
    tasks = [task for task, ok in zip(made, resolves) if ok]
    stats = {"version": recipe.version, "image": tag, "candidates": len(found), "tried": considered,
             "kept": len(tasks), "dropped": dropped, "clean_tests": base.tests, "clean_passed": len(base.passed),
             "flaky": len(base.flaky), "clean_run_s": base.seconds}
    return tasks, stats


def _gold_resolves(task: Task, config: SandboxConfig, timeout: float, home: Path) -> bool:
    """Whether the grader, canaries and all, resolves `task`'s gold patch as it would an agent's; the answer is kept
    (by image) under `home`/gold/."""
    path = home / "gold" / f"{task.instance_id}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["image"] == task.image:
            return saved["resolved"]
    grade = grade_patch(task, task.patch, config, timeout=timeout)
    if grade.excluded:  # the sandbox failed, not the task: keep it, and ask again at the next build
        return True
    save_json(path, {"image": task.image, "resolved": grade.resolved, "outcome": grade.outcome})
    return grade.resolved


def _cached_baseline(home: Path, tag: str, compute: Callable[[], Baseline]) -> Baseline:
    path = home / "baseline.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.pop("image") == tag:
            return Baseline(**saved)
    base = compute()
    save_json(path, {"image": tag, **base.__dict__})
    return base
