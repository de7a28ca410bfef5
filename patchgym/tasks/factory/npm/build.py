"""Build validated JavaScript tasks for npm packages, as the Python factory does (patchgym.tasks.factory.build):
candidates in seed order, validated in parallel and saved as they complete (a rerun resumes), the first
`per_package` distinct bugs of each package kept."""

from pathlib import Path

from patchgym.env.grading.tape import TAPE_PARSER
from patchgym.sandbox import SandboxConfig, images
from patchgym.sandbox.pool import SandboxPool
from patchgym.tasks.factory.build import (
    TRIES_PER_TASK,
    FactoryResult,
    _cached_baseline,
    _validate_in_order,
    build_tasks,
    graded_seconds,
    kept_tasks,
)
from patchgym.tasks.factory.diffs import new_file_diff
from patchgym.tasks.factory.hidden import Protected, check_hidden
from patchgym.tasks.factory.mutate import order_mutations
from patchgym.tasks.factory.npm.mutate import STRATEGIES, find_mutations
from patchgym.tasks.factory.npm.sources import NpmRecipe, fetch_package, image_recipe, load_npm_recipes
from patchgym.tasks.factory.npm.statements import write_statement
from patchgym.tasks.factory.npm.validate import baseline, make_bug, validate_bug
from patchgym.tasks.factory.sources import WORKDIR
from patchgym.tasks.factory.validate import Baseline, Bug, Outcome
from patchgym.tasks.task import Task


def build_npm_tasks(packages: list[str], per_package: int, seed: int, out_dir: Path, *, backend: str = "docker",
                    workers: int = 2, progress: bool = True) -> FactoryResult:
    """Build up to `per_package` tasks for each npm package into `out_dir/tasks.jsonl`; return the summary."""
    return build_tasks(packages, per_package, seed, out_dir, backend=backend, workers=workers, progress=progress,
                       ecosystem="npm", recipes=load_npm_recipes(), build_package=_build_package)


def _build_package(recipe: NpmRecipe, per_package: int, seed: int, out_dir: Path, config: SandboxConfig,
                   workers: int, update) -> tuple[list[Task], dict]:
    tree, modules = fetch_package(recipe)
    image = image_recipe(recipe, tree, modules)
    update(note="building image")
    images.ensure_image(image, config.backend, progress=False)
    home = out_dir / recipe.key
    sources = recipe.source_files(tree)
    found = [m for path, text in sources.items() for m in find_mutations(path, text)]
    update(note="looking for copies")
    check_hidden(image if config.backend != "docker" else image.tag, protected(recipe, tree, found), WORKDIR,
                 recipe.key, config, cache=home / "hidden.json")
    candidates = order_mutations(found, seed, STRATEGIES)[: per_package * TRIES_PER_TASK]
    with SandboxPool(config, image if config.backend != "docker" else image.tag, size=workers,
                     max_concurrency=workers) as pool:
        update(note="clean runs")
        base = _cached_baseline(home, image.tag, lambda: baseline(pool, recipe))
        order, outcomes = _validate_in_order(pool, recipe, base, candidates, sources, seed, per_package, workers,
                                             home, image.tag, update, make=make_bug, validate=validate_bug)
    return kept_tasks(order, outcomes, per_package, base, recipe, image.tag, len(found),
                      lambda bug: _task(recipe, image.tag, tree, bug, outcomes[bug.id], base), config, home)


def protected(recipe: NpmRecipe, tree: Path, mutations) -> Protected:
    """What a package's image must not hold twice: its test files, its source files that a bug may change, any
    node_modules/NAME of it, its tarballs."""
    mutated = {m.path for m in mutations}
    files = {p.relative_to(tree).as_posix(): p for p in tree.rglob("*") if p.is_file() and p.suffix in (".js", ".cjs",
                                                                                                      ".mjs", ".json")}
    kept = {rel: path.read_text(encoding="utf-8", errors="replace") for rel, path in files.items()
            if recipe.is_test_file(rel) or rel in mutated}
    return Protected(kept, [recipe.name], [f"{recipe.name}-"], kind="npm")


def _task(recipe: NpmRecipe, tag: str, tree: Path, bug: Bug, outcome: Outcome, base: Baseline) -> Task:
    """A kept bug as a task: the test files of its failing tests are hidden (the grader writes them back)."""
    instance_id = f"{recipe.key}.{outcome.strategy}.{outcome.id}"
    test_files = sorted({t.split("::", 1)[0] for t in outcome.fail_to_pass})
    test_patch = "".join(new_file_diff(p, (tree / p).read_text(encoding="utf-8")) for p in test_files)
    return Task(
        instance_id=instance_id, repo=recipe.name, version=recipe.version, image=tag,
        problem_statement=write_statement(recipe.name, recipe.version, outcome.evidence, outcome.evidence["code"],
                                          instance_id),
        FAIL_TO_PASS=outcome.fail_to_pass, PASS_TO_PASS=outcome.pass_to_pass, bug_patch=bug.bug_patch,
        patch=bug.patch, test_files=test_files, test_patch=test_patch, test_cmd=recipe.test_cmd(),
        test_seconds=graded_seconds(base, test_files), log_parser=TAPE_PARSER, source="factory",
        strategy=outcome.strategy, created_at=outcome.created_at,
    )
