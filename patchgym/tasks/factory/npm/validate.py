"""Run an npm package's tape suite in sandboxes under patchgym's tape reporter: twice clean (tests whose status
differs are flaky), then once per candidate bug; kept with >= 1 FAIL_TO_PASS and >= 1 PASS_TO_PASS test."""

import functools
import hashlib
from pathlib import Path

from patchgym.env.grading import report, tape
from patchgym.sandbox import Sandbox
from patchgym.sandbox.pool import SandboxPool
from patchgym.tasks.factory import validate as factory_validate
from patchgym.tasks.factory.mutate import Mutation
from patchgym.tasks.factory.npm.mutate import parses
from patchgym.tasks.factory.npm.sources import NpmRecipe
from patchgym.tasks.factory.npm.statements import code_leading_to, failure_in_tap
from patchgym.tasks.factory.sources import WORKDIR
from patchgym.tasks.factory.validate import Baseline, Bug, Outcome, SuiteRun, SuiteTimeout

STATEMENT_TRIES = 3


def make_bug(mutation: Mutation, text: str) -> Bug:
    return factory_validate.make_bug(mutation, text, parses)


def run_suite(sandbox: Sandbox, recipe: NpmRecipe) -> SuiteRun:
    """The whole suite by test id, run as the grader runs it (the agent's user, the reporter's records through the
    side channel); SuiteTimeout, or report.ReportMissing when it did not run."""
    command = tape.tape_command(recipe.test_cmd(), tape.install_tape_reporter(sandbox))
    result = report.run_reported(sandbox, command, WORKDIR, recipe.timeout, 65536)
    if result.timed_out:
        raise SuiteTimeout(f"the suite ran over {recipe.timeout:g} s")
    return SuiteRun(report.read_report(result), report.read_durations(result))


def baseline(pool: SandboxPool, recipe: NpmRecipe) -> Baseline:
    """The clean suite, twice at once (the Python factory's procedure, with tape's suite)."""
    return factory_validate.baseline(pool, recipe, run_suite)


def validate_bug(pool: SandboxPool, recipe: NpmRecipe, base: Baseline, bug: Bug, seed: int) -> Outcome:
    """The suite with `bug` applied, classified as the Python factory classifies it."""
    check = functools.partial(factory_validate._check, suite=run_suite, evidence=_evidence)
    return factory_validate.validate_bug(pool, recipe, base, bug, seed, check)


def _evidence(sandbox: Sandbox, recipe: NpmRecipe, failing: list[str], seed: int, bug_path: str = "") -> dict:
    """Run a failing test's file alone (tape's own TAP output) until one assertion shows what went wrong; the code
    it shows comes from the test file, at the failing line."""
    order = sorted(failing, key=lambda t: hashlib.sha1(f"{seed}:{t}".encode()).hexdigest())
    for test in order[:STATEMENT_TRIES]:
        file, _, name = test.partition("::")
        result = sandbox.exec(["node", file], cwd=WORKDIR, timeout=recipe.timeout, output_limit=262144)
        failure = failure_in_tap(result.output, name)
        if failure is None or Path(failure["at"][0]).name != Path(file).name:
            continue
        source = sandbox.read_file(f"{WORKDIR}/{file}").decode("utf-8", errors="replace")
        code = code_leading_to(source, failure["at"][1])
        if code:
            return {"test": test, "code": code, **{k: failure.get(k, "") for k in ("operator", "expected", "actual")}}
    return {}


