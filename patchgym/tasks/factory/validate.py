"""Run a package's suite in sandboxes: twice clean (tests whose status differs are flaky), then once per candidate
bug; a bug is kept with >= 1 FAIL_TO_PASS and >= 1 PASS_TO_PASS test, otherwise the result says why not."""

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from patchgym.env.grading import report
from patchgym.sandbox import Sandbox, SandboxError
from patchgym.sandbox.pool import SandboxPool
from patchgym.tasks.factory.diffs import file_diff
from patchgym.tasks.factory.mutate import Mutation, compiles
from patchgym.tasks.factory.sources import WORKDIR, Recipe
from patchgym.tasks.factory.statements import failure_evidence

PATCH_PATH = "/tmp/.patchgym-bug.diff"
STATEMENT_TRIES = 3  # failing tests run one by one until one shows a usable failure


class BaselineError(RuntimeError):
    """The clean suite itself does not run: the package cannot make tasks."""


@dataclass
class Baseline:
    passed: list[str]  # PASSED in both clean runs
    flaky: list[str]  # a different status in the two runs
    tests: int
    seconds: float
    test_seconds: dict[str, float] = field(default_factory=dict)  # each test's time, the longer of the two runs


@dataclass
class SuiteRun:
    """One run of a package's suite: each test's status and time (seconds)."""

    statuses: dict[str, str]
    seconds: dict[str, float]


@dataclass
class Bug:
    """A candidate: one mutation as a bug patch (clean -> buggy) and its reverse, the fix."""

    mutation: Mutation
    bug_patch: str
    patch: str
    compiles: bool

    @property
    def id(self) -> str:
        return hashlib.sha1(self.bug_patch.encode()).hexdigest()[:8]


@dataclass
class Outcome:
    """What validating one bug gave. `status` is "kept" or why not: does_not_compile, patch_does_not_apply,
    timeout, suite_did_not_run, no_failing_test, all_tests_fail, no_statement or sandbox_error (the build adds
    "duplicate": the same FAIL_TO_PASS set as a bug kept before it, and "gold_not_resolved": the grader, canaries
    and all, does not resolve its fix)."""

    id: str
    strategy: str
    path: str
    line: int
    status: str
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)  # the failing test shown in the statement and its output
    detail: str = ""
    seconds: float = 0.0
    created_at: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def make_bug(mutation: Mutation, text: str, valid=compiles) -> Bug:
    """The mutation as a bug and its fix; `valid(text, path)` says whether the buggy file still parses (Python's
    compile by default)."""
    buggy = mutation.apply(text)
    return Bug(mutation, file_diff(mutation.path, text, buggy), file_diff(mutation.path, buggy, text),
               valid(buggy, mutation.path))


class SuiteTimeout(Exception):
    pass


def run_suite(sandbox: Sandbox, recipe: Recipe) -> SuiteRun:
    """The whole suite by node id, run as the grader runs it (the agent's user, pytest's report through the side
    channel, strict); SuiteTimeout, or report.ReportMissing when it did not run."""
    plugins = report.installed_plugins(sandbox, WORKDIR)
    plugin = report.install_report_plugin(sandbox, strict=True)
    command = report.pytest_command(f"{recipe.test_cmd()} -q {report.FACTORY_ARGS}", plugin, plugins)
    result = report.run_reported(sandbox, command, WORKDIR, recipe.timeout, 65536)
    if result.timed_out:
        raise SuiteTimeout(f"the suite ran over {recipe.timeout:g} s")
    statuses = report.read_report(result)
    # Doctests in source modules are not tests the grader can hide; only test files count.
    kept = {t: s for t, s in statuses.items() if recipe.is_test_file(t.split("::", 1)[0])}
    return SuiteRun(kept, {t: s for t, s in report.read_durations(result).items() if t in kept})


def baseline(pool: SandboxPool, recipe: Recipe, suite=None) -> Baseline:
    """The clean suite (`suite`: how it runs, run_suite for a Python package), run twice at once in two sandboxes."""
    start = time.monotonic()
    suite = suite or run_suite

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


def validate_bug(pool: SandboxPool, recipe: Recipe, base: Baseline, bug: Bug, seed: int, check=None) -> Outcome:
    """Run the suite with `bug` applied and classify it (see Outcome); `check`: how (_check, for a Python package)."""
    m = bug.mutation
    outcome = Outcome(bug.id, m.strategy, m.path, m.line, "does_not_compile",
                      created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if not bug.compiles:
        return outcome
    start = time.monotonic()
    try:
        with pool.sandbox() as sandbox:
            (check or _check)(sandbox, recipe, base, bug, seed, outcome)
    except (SandboxError, OSError) as exc:  # the sandbox died or its file operations failed: not the bug's doing
        outcome.status, outcome.detail = "sandbox_error", str(exc)[-2000:]
    outcome.seconds = round(time.monotonic() - start, 1)
    return outcome


def _check(sandbox: Sandbox, recipe: Recipe, base: Baseline, bug: Bug, seed: int, outcome: Outcome, *,
           suite=None, evidence=None) -> None:
    """Apply `bug`, run the suite (`suite`, run_suite by default) and classify; `evidence` writes the statement's
    material (_evidence by default)."""
    sandbox.write_file(PATCH_PATH, bug.bug_patch)
    applied = sandbox.exec(f"git apply {PATCH_PATH} && rm {PATCH_PATH}", cwd=WORKDIR, timeout=60)
    if not applied.ok:
        outcome.status, outcome.detail = "patch_does_not_apply", applied.output[-2000:]
        return
    try:
        statuses = (suite or run_suite)(sandbox, recipe).statuses
    except SuiteTimeout as exc:
        outcome.status, outcome.detail = "timeout", str(exc)
        return
    except report.ReportMissing as exc:
        outcome.status, outcome.detail = "suite_did_not_run", str(exc)
        return
    outcome.fail_to_pass = [t for t in base.passed if statuses.get(t) not in ("PASSED", "XFAIL")]
    outcome.pass_to_pass = [t for t in base.passed if statuses.get(t) == "PASSED"]
    if not outcome.fail_to_pass:
        outcome.status = "no_failing_test"
    elif not outcome.pass_to_pass:
        outcome.status = "all_tests_fail"
    else:
        outcome.evidence = (evidence or _evidence)(sandbox, recipe, outcome.fail_to_pass, seed, bug.mutation.path)
        outcome.status = "kept" if outcome.evidence else "no_statement"


def _evidence(sandbox: Sandbox, recipe: Recipe, failing: list[str], seed: int, bug_path: str) -> dict:
    """Run failing tests alone with short tracebacks until one shows what went wrong without naming the test."""
    order = sorted(failing, key=lambda t: hashlib.sha1(f"{seed}:{t}".encode()).hexdigest())
    for test in order[:STATEMENT_TRIES]:
        command = f"{recipe.test_cmd([test])} -q --tb=short"
        result = sandbox.exec(command, cwd=WORKDIR, timeout=recipe.timeout, output_limit=65536)
        if result.timed_out:
            continue
        evidence = failure_evidence(result.output, test, recipe.is_test_file, hidden=(bug_path,))
        if evidence:
            return {"test": test, **evidence}
    return {}
