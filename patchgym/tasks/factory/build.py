"""Build validated tasks for a list of packages: candidates in seed order, validated in parallel, each result saved
as it completes (a rerun skips what is done), then the first `per_package` distinct bugs of each become tasks."""

import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from patchgym.env.grading.grader import grade_patch
from patchgym.errors import UserError
from patchgym.sandbox import SandboxConfig, images
from patchgym.sandbox.pool import SandboxPool
from patchgym.tasks.factory.diffs import new_file_diff
from patchgym.tasks.factory.hidden import Protected, check_hidden
from patchgym.tasks.factory.mutate import find_mutations, order_mutations
from patchgym.tasks.factory.sources import WORKDIR, Recipe, fetch_source, image_recipe, load_recipes
from patchgym.tasks.factory.statements import code_leading_to, names_of_test, write_statement
from patchgym.tasks.factory.validate import Baseline, Bug, Outcome, baseline, make_bug, validate_bug
from patchgym.tasks.task import Task, write_tasks

# Candidates tried per wanted task before a package gives up (packages keep about 1 in 2; markupsafe, whose few
# tests make many bugs look alike, 1 in 3).
TRIES_PER_TASK = 25


def build_tasks(packages: list[str], per_package: int, seed: int, out_dir: Path, *, backend: str = "local",
                workers: int = 2, progress: bool = True, ecosystem: str = "pypi", recipes: dict | None = None,
                build_package=None) -> "FactoryResult":
    """Build up to `per_package` tasks for each package into `out_dir/tasks.jsonl`; return the summary. Another
    ecosystem (npm) gives its `recipes` and its `build_package`; PyPI's are the default."""
    recipes = load_recipes() if recipes is None else recipes
    build_package = build_package or _build_package
    unknown = [p for p in packages if p not in recipes]
    if unknown:
        raise UserError(f"no recipe for {', '.join(unknown)}; known: {', '.join(recipes)} ({ecosystem} packages)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = SandboxConfig(backend=backend)
    console = Console(stderr=True)
    start = time.monotonic()
    summary, tasks = {}, []
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console,
                  disable=not progress) as bar:
        for name in packages:
            row = bar.add_task(name if ecosystem == "pypi" else f"{ecosystem} {name}", total=per_package,
                               note="preparing")
            package_start = time.monotonic()
            try:
                made, stats = build_package(recipes[name], per_package, seed, out_dir, config, workers,
                                             lambda **kw: bar.update(row, **kw))
            except Exception as exc:  # one broken package must not cost the others their tasks
                made, stats = [], {"error": f"{type(exc).__name__}: {exc}"}
                bar.update(row, note=f"[red]failed: {type(exc).__name__}")
            stats["seconds"] = round(time.monotonic() - package_start, 1)
            summary[name] = stats
            tasks += made
    write_tasks(tasks, out_dir / "tasks.jsonl")
    result = FactoryResult(ecosystem, summary, len(tasks), round(time.monotonic() - start, 1),
                           str(out_dir / "tasks.jsonl"))
    (out_dir / "summary.json").write_text(json.dumps(asdict(result), indent=1) + "\n")
    if progress:
        console.print(summary_table(result))
    return result


@dataclass
class FactoryResult:
    """What a factory run made (OUT/summary.json is its asdict). `packages`: name -> its stats (version, image,
    candidates, tried, kept, dropped by reason, the clean suite's figures, seconds), or {error, seconds}."""

    ecosystem: str
    packages: dict[str, dict]
    tasks: int
    seconds: float
    tasks_file: str


def summary_table(result: FactoryResult) -> Table:
    table = Table(title=f"task factory: {result.tasks} tasks in {result.seconds / 60:.1f} min")
    for column in ("package", "tried", "kept", "dropped (by reason)", "min"):
        table.add_column(column)
    for name, stats in result.packages.items():
        dropped = ", ".join(f"{reason} {n}" for reason, n in sorted(stats.get("dropped", {}).items()))
        table.add_row(f"{name} {stats.get('version', '')}", str(stats.get("tried", 0)), str(stats.get("kept", 0)),
                      stats.get("error") or dropped, f"{stats['seconds'] / 60:.1f}")
    return table


def _build_package(recipe: Recipe, per_package: int, seed: int, out_dir: Path, config: SandboxConfig,
                   workers: int, update) -> tuple[list[Task], dict]:
    tree = fetch_source(recipe)
    image = image_recipe(recipe, tree)
    update(note="building image")
    images.ensure_image(image, config.backend, progress=False)
    home = out_dir / recipe.key
    sources = recipe.source_files(tree)
    found = [m for path, text in sources.items() for m in find_mutations(path, text)]
    update(note="looking for copies")
    check_hidden(image if config.backend != "docker" else image.tag, protected(recipe, tree, found), WORKDIR,
                 recipe.key, config, cache=home / "hidden.json")
    candidates = order_mutations(found, seed)[: per_package * TRIES_PER_TASK]
    with SandboxPool(config, image if config.backend != "docker" else image.tag, size=workers,
                     max_concurrency=workers) as pool:
        update(note="clean runs")
        base = _cached_baseline(home, image.tag, lambda: baseline(pool, recipe))
        order, outcomes = _validate_in_order(pool, recipe, base, candidates, sources, seed, per_package, workers,
                                             home, image.tag, update)
    return kept_tasks(order, outcomes, per_package, base, recipe, image.tag, len(found),
                      lambda bug: _task(recipe, image.tag, tree, bug, outcomes[bug.id], base), config, home)


def protected(recipe: Recipe, tree: Path, mutations) -> Protected:
    """What a package's image must not hold twice: its test files, its source files that a bug may change, its
    import names, its archives."""
    files = {p.relative_to(tree).as_posix(): p for p in tree.rglob("*.py") if p.is_file()}
    mutated = {m.path for m in mutations}
    kept = {rel: path.read_text(encoding="utf-8", errors="replace") for rel, path in files.items()
            if recipe.is_test_file(rel) or rel in mutated}
    src = tree / recipe.src
    names = sorted(p.name for p in src.iterdir() if (p / "__init__.py").is_file() and not recipe.is_test_file(
        p.name + "/")) + sorted(p.name for p in src.glob("*.py") if p.stem not in ("setup", "conftest")
                                and not recipe.is_test_file(p.name))
    dist = recipe.name.replace("-", "_")
    return Protected(kept, names, sorted({f"{recipe.name}-", f"{dist}-"}))


def kept_tasks(order, outcomes, per_package, base: Baseline, recipe, tag: str, found: int, make_task,
               config: SandboxConfig | None = None, home: Path | None = None):
    """The tasks of the first `per_package` kept bugs (`make_task` writes one), and the package's stats. With
    `config`, each task's gold patch is graded once as an agent's patch is (canaries included; the verdict kept under
    `home`), and a task it does not resolve is dropped ("gold_not_resolved")."""
    considered, selected, dropped = _select(order, outcomes, per_package)
    tasks = [make_task(bug) for bug in selected]
    if config is not None:
        resolves = [_gold_resolves(task, config, recipe.timeout * 3, home) for task in tasks]
        if not all(resolves):
            dropped["gold_not_resolved"] = resolves.count(False)
        tasks = [task for task, ok in zip(tasks, resolves) if ok]
    stats = {"version": recipe.version, "image": tag, "candidates": found, "tried": considered,
             "kept": len(tasks), "dropped": dropped, "clean_tests": base.tests, "clean_passed": len(base.passed),
             "flaky": len(base.flaky), "clean_run_s": base.seconds}
    return tasks, stats


def _validate_in_order(pool, recipe, base, candidates, sources, seed, per_package, workers, home, tag, update, *,
                       make=make_bug, validate=validate_bug):
    """Validate candidates in order, `workers` at a time, until the completed prefix holds `per_package` bugs
    (`make` and `validate`: a language's bug maker and validator, Python's by default)."""
    saved = _load_outcomes(home / "mutants", tag)
    order: list[Bug] = []
    outcomes: dict[str, Outcome] = {}
    pending = {}
    queue = iter(candidates)
    with ThreadPoolExecutor(workers) as threads:
        while True:
            while len(pending) < workers and _prefix_kept(order, outcomes) < per_package:
                mutation = next(queue, None)
                if mutation is None:
                    break
                bug = make(mutation, sources[mutation.path])
                if any(b.id == bug.id for b in order):
                    continue  # two sites that make the same patch
                order.append(bug)
                if bug.id in saved:
                    outcomes[bug.id] = saved[bug.id]
                else:
                    pending[threads.submit(validate, pool, recipe, base, bug, seed)] = bug
            update(completed=min(_prefix_kept(order, outcomes), per_package),
                   note=f"{len(outcomes)} tried, {len(pending)} running")
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                outcome = future.result()
                outcomes[pending.pop(future).id] = outcome
                if outcome.status != "sandbox_error":  # an infrastructure failure is retried by a rerun
                    _save(home / "mutants" / f"{outcome.id}.json", {"image": tag, **outcome.to_dict()})
    return order, outcomes


def _prefix_kept(order: list[Bug], outcomes: dict[str, Outcome]) -> int:
    _, selected, _ = _select(order, outcomes, None)
    return len(selected)


def _select(order: list[Bug], outcomes: dict[str, Outcome], limit: int | None):
    """Over the longest completed prefix of `order`: the first `limit` kept bugs with distinct FAIL_TO_PASS sets,
    how many candidates that took, and why the others were dropped."""
    seen, selected, dropped, considered = set(), [], {}, 0
    for bug in order:
        if bug.id not in outcomes or (limit is not None and len(selected) >= limit):
            break
        considered += 1
        outcome = outcomes[bug.id]
        reason = outcome.status
        if reason == "kept":
            signature = tuple(outcome.fail_to_pass)
            reason = "duplicate" if signature in seen else "kept"
            seen.add(signature)
        if reason == "kept":
            selected.append(bug)
        else:
            dropped[reason] = dropped.get(reason, 0) + 1
    return considered, selected, dropped


def graded_seconds(base: Baseline, test_files: list[str]) -> dict[str, float]:
    """The clean runs' time of each test in `test_files` (a task's graded files)."""
    return {t: s for t, s in sorted(base.test_seconds.items()) if t.split("::", 1)[0] in test_files}


def _task(recipe: Recipe, tag: str, tree: Path, bug: Bug, outcome: Outcome, base: Baseline) -> Task:
    instance_id = f"{recipe.key}.{outcome.strategy}.{outcome.id}"
    test_files = sorted({t.split("::", 1)[0] for t in outcome.fail_to_pass})
    test_patch = "".join(new_file_diff(p, (tree / p).read_text(encoding="utf-8")) for p in test_files)
    evidence, code = outcome.evidence, ""
    if evidence.get("where"):
        path, line = evidence["where"]
        code = code_leading_to((tree / path).read_text(encoding="utf-8"), line, names_of_test(evidence["test"]))
    return Task(
        instance_id=instance_id, repo=recipe.name, version=recipe.version, image=tag,
        problem_statement=write_statement(recipe.name, recipe.version, evidence, instance_id, code),
        FAIL_TO_PASS=outcome.fail_to_pass, PASS_TO_PASS=outcome.pass_to_pass, bug_patch=bug.bug_patch,
        patch=bug.patch, test_files=test_files, test_patch=test_patch, test_cmd=recipe.test_cmd(),
        test_seconds=graded_seconds(base, test_files), log_parser="patchgym_report", source="factory",
        strategy=outcome.strategy, created_at=outcome.created_at,
    )


def _gold_resolves(task: Task, config: SandboxConfig, timeout: float, home: Path | None) -> bool:
    """Whether the grader resolves `task`'s gold patch; the answer is kept (by image) under `home`/gold/."""
    path = home / "gold" / f"{task.instance_id}.json" if home is not None else None
    if path is not None and path.exists():
        saved = json.loads(path.read_text())
        if saved["image"] == task.image:
            return saved["resolved"]
    grade = grade_patch(task, task.patch, config, timeout=timeout)
    if grade.excluded:  # the sandbox failed, not the task: keep it, and ask again at the next build
        return True
    if path is not None:
        _save(path, {"image": task.image, "resolved": grade.resolved, "outcome": grade.outcome})
    return grade.resolved


def _cached_baseline(home: Path, tag: str, compute) -> Baseline:
    path = home / "baseline.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.pop("image") == tag:
            return Baseline(**saved)
    base = compute()
    _save(path, {"image": tag, **base.__dict__})
    return base


def _load_outcomes(folder: Path, tag: str) -> dict[str, Outcome]:
    outcomes = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        saved = json.loads(path.read_text())
        if saved.pop("image") == tag:
            outcomes[saved["id"]] = Outcome(**saved)
    return outcomes


def _save(path: Path, data: dict) -> None:
    """Write JSON atomically: a killed build leaves whole files or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
