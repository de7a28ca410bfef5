"""The factory's records, the same for every ecosystem: a package's clean suite (Baseline), one run of its suite
(SuiteRun), a candidate bug (Bug) and what validating it gave (Outcome)."""

import hashlib
from dataclasses import asdict, dataclass, field

from patchgym.tasks.factory.mutate import Mutation


@dataclass
class Baseline:
    passed: list[str]  # PASSED in both clean runs
    flaky: list[str]  # a different status in the two runs
    tests: int
    seconds: float
    test_seconds: dict[str, float] = field(default_factory=dict)  # each test's time, the longer of the two runs

    def seconds_of(self, test_files: list[str]) -> dict[str, float]:
        """The clean runs' time of each test in `test_files` (a task's graded files)."""
        return {t: s for t, s in sorted(self.test_seconds.items()) if t.split("::", 1)[0] in test_files}


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
