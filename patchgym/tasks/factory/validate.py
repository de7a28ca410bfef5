"""Validate a package's candidate bugs in sandboxes, the same way for every ecosystem: the clean suite twice (tests
whose status differs are flaky), then the suite once per bug, in order and a few at a time; a bug is kept with >= 1
FAIL_TO_PASS and >= 1 PASS_TO_PASS test and a failure the statement can show, otherwise the outcome says why not.
Each outcome is saved as it completes, so a rerun resumes."""

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from patchgym.env.grading import report
from patchgym.files import write_atomic
from patchgym.sandbox import Sandbox, SandboxError
from patchgym.sandbox.pool import SandboxPool
from patchgym.tasks.factory.diffs import file_diff
from patchgym.tasks.factory.ecosystem import Ecosystem, Recipe, SuiteTimeout
from patchgym.tasks.factory.mutate import Mutation
from patchgym.tasks.factory.records import Baseline, Bug, Outcome, SuiteRun
from patchgym.tasks.factory.sources import WORKDIR

BUG_PATCH_PATH = "/tmp/.patchgym-bug.diff"
STATEMENT_TRIES = 3  # failing tests run one by one until one shows a usable failure


class BaselineError(RuntimeError):
    """The clean suite itself does not run: the package cannot make tasks."""


@dataclass(frozen=True)
class Validation:
    """What validating one package's bugs needs: its ecosystem and recipe, sandboxes of its image, its clean suite,
    the clean text of each file a bug may change, the seed (it picks which failing test a statement shows), and the
    folder where each outcome is saved (kept only while the image's tag is the same)."""

    ecosystem: Ecosystem
    recipe: Recipe
    pool: SandboxPool
    base: Baseline
    sources: dict[str, str]
    seed: int
    home: Path
    image_tag: str


def make_bug(mutation: Mutation, text: str, parses: Callable[[str, str], bool]) -> Bug:
    """The mutation of the file whose clean text is `text` as a bug and its fix; `parses(text, path)` says whether
    the buggy file still parses."""
    buggy = mutation.apply(text)
    return Bug(mutation, file_diff(mutation.path, text, buggy), file_diff(mutation.path, buggy, text),
               parses(buggy, mutation.path))


def baseline(pool: SandboxPool, recipe: Recipe, suite: Callable[[Sandbox, Recipe], SuiteRun]) -> Baseline:
    """The clean suite (`suite`: how it runs), run twice at once in two sandboxes."""
    start = time.monotonic()

    def clean_run(_) -> SuiteRun:
        with pool.sandbox() as sandbox:
            try:
                return suite(sandbox, recipe)
            except (SuiteTimeout, report.ReportMissing) as exc:
                raise BaselineError(f"{recipe.key}: the clean suite does not run: {exc}") from exc

    with ThreadPoolExecutor(2) as threads:
        runs = list(threads.map(clean_run, range(2)))
    first, second = (run.statuses for run in runs)
    flaky = sorted(t for t in first.keys() | second.keys() if first.get(t) != second.get(t))
    passed = sorted(t for t in first if first[t] == "PASSED" and second.get(t) == "PASSED")
    if not passed:
        raise BaselineError(f"{recipe.key}: no test passes in the clean suite")
    seconds = {t: round(max(run.seconds.get(t, 0.0) for run in runs), 4) for t in passed}
    return Baseline(passed, flaky, len(first), round(time.monotonic() - start, 1), seconds)


def validate_in_order(job: Validation, candidates: list[Mutation], per_package: int, workers: int,
                      update: Callable[..., None]) -> tuple[list[Bug], dict[str, Outcome]]:
    """Validate `candidates` in order, `workers` at a time, until the completed prefix holds `per_package` kept
    bugs (`update(completed=, note=)` reports progress); the bugs tried, in order, and their outcomes by id."""
    saved = _load_outcomes(job.home / "mutants", job.image_tag)
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
                bug = make_bug(mutation, job.sources[mutation.path], job.ecosystem.parses)
                if any(b.id == bug.id for b in order):
                    continue  # two sites that make the same patch
                order.append(bug)
                if bug.id in saved:
                    outcomes[bug.id] = saved[bug.id]
                else:
                    pending[threads.submit(validate_bug, job, bug)] = bug
            update(completed=min(_prefix_kept(order, outcomes), per_package),
                   note=f"{len(outcomes)} tried, {len(pending)} running")
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                outcome = future.result()
                outcomes[pending.pop(future).id] = outcome
                if outcome.status != "sandbox_error":  # an infrastructure failure is retried by a rerun
                    save_json(job.home / "mutants" / f"{outcome.id}.json",
                              {"image": job.image_tag, **outcome.to_dict()})
    return order, outcomes


def select(order: list[Bug], outcomes: dict[str, Outcome], limit: int | None) -> tuple[int, list[Bug], dict]:
    """Over the longest completed prefix of `order`: how many candidates it took to find the first `limit` kept bugs
    with distinct FAIL_TO_PASS sets, those bugs, and why the others were dropped (reason -> count)."""
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


def _prefix_kept(order: list[Bug], outcomes: dict[str, Outcome]) -> int:
    _, selected, _ = select(order, outcomes, None)
    return len(selected)


def validate_bug(job: Validation, bug: Bug) -> Outcome:
    """Run the suite with `bug` applied in a sandbox of its own and classify it (see Outcome)."""
    m = bug.mutation
    outcome = Outcome(bug.id, m.strategy, m.path, m.line, "does_not_compile",
                      created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if not bug.compiles:
        return outcome
    start = time.monotonic()
    try:
        with job.pool.sandbox() as sandbox:
            _check(sandbox, job, bug, outcome)
    except (SandboxError, OSError) as exc:  # the sandbox died or its file operations failed: not the bug's doing
        outcome.status, outcome.detail = "sandbox_error", str(exc)[-2000:]
    outcome.seconds = round(time.monotonic() - start, 1)
    return outcome


def _check(sandbox: Sandbox, job: Validation, bug: Bug, outcome: Outcome) -> None:
    """Apply `bug`, run the suite and classify, into `outcome`."""
    sandbox.write_file(BUG_PATCH_PATH, bug.bug_patch)
    applied = sandbox.exec(f"git apply {BUG_PATCH_PATH} && rm {BUG_PATCH_PATH}", cwd=WORKDIR, timeout=60)
    if not applied.ok:
        outcome.status, outcome.detail = "patch_does_not_apply", applied.output[-2000:]
        return
    try:
        statuses = job.ecosystem.run_suite(sandbox, job.recipe).statuses
    except SuiteTimeout as exc:
        outcome.status, outcome.detail = "timeout", str(exc)
        return
    except report.ReportMissing as exc:
        outcome.status, outcome.detail = "suite_did_not_run", str(exc)
        return
    passed = job.base.passed
    outcome.fail_to_pass = [t for t in passed if statuses.get(t) not in ("PASSED", "XFAIL")]
    outcome.pass_to_pass = [t for t in passed if statuses.get(t) == "PASSED"]
    if not outcome.fail_to_pass:
        outcome.status = "no_failing_test"
    elif not outcome.pass_to_pass:
        outcome.status = "all_tests_fail"
    else:
        outcome.evidence = _evidence(sandbox, job, outcome.fail_to_pass, bug.mutation.path)
        outcome.status = "kept" if outcome.evidence else "no_statement"


def _evidence(sandbox: Sandbox, job: Validation, failing: list[str], bug_path: str) -> dict:
    """The first of the failing tests (in an order the seed fixes, at most STATEMENT_TRIES) that shows what went
    wrong when run alone: what it shows, with the test under "test"; {} when none does."""
    order = sorted(failing, key=lambda t: hashlib.sha1(f"{job.seed}:{t}".encode()).hexdigest())
    for test in order[:STATEMENT_TRIES]:
        shown = job.ecosystem.show_failure(sandbox, job.recipe, test, bug_path)
        if shown:
            return {"test": test, **shown}
    return {}


def _load_outcomes(folder: Path, tag: str) -> dict[str, Outcome]:
    outcomes = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        saved = json.loads(path.read_text())
        if saved.pop("image") == tag:
            outcomes[saved["id"]] = Outcome(**saved)
    return outcomes


def save_json(path: Path, data: dict) -> None:
    """Write `data` as indented JSON, atomically: a killed build leaves whole files or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1) + "\n")
