"""The grade of one patch: the record every stage reads (trajectories, eval, training, selection, the viewer).

A grade is either a verdict (the tests ran: `resolved` says whether every FAIL_TO_PASS and PASS_TO_PASS test
passed) or an error of a named kind, with its detail. Graders other than the test suite's (the synthetic
environments of the trainer's tests) may state their own score in `score`.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# apply: the patch does not apply; infra: the grading sandbox died; no_tests_ran: no sign the suite ran;
# timeout: the tests ran over the limit; empty_patch: the agent changed nothing, so nothing was run;
# tampered: the code under test changed how pytest runs or reports tests (the report plugin's closing check).
GradeError = Literal["apply", "infra", "no_tests_ran", "timeout", "empty_patch", "tampered"]
Outcome = Literal["resolved", "unresolved", "apply", "infra", "no_tests_ran", "timeout", "empty_patch", "tampered"]
# The errors eval counts as grading errors (empty_patch is not one: nothing was graded).
GRADING_ERRORS: frozenset[str] = frozenset({"apply", "infra", "no_tests_ran", "timeout", "tampered"})


class Grade(BaseModel):
    """What grading one patch found."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = ""
    resolved: bool = False
    tests: dict[str, str] = Field(default_factory=dict, description="every test that ran -> its status")
    f2p: dict[str, str] = Field(default_factory=dict, description="FAIL_TO_PASS test -> status (MISSING if absent)")
    p2p: dict[str, str] = Field(default_factory=dict, description="PASS_TO_PASS test -> status (MISSING if absent)")
    error: GradeError | None = None
    error_detail: str = ""
    exit_code: int | None = None
    duration: float = Field(0.0, description="seconds, sandbox start included")
    score: float | None = Field(None, description="a grader's own reward in [0, 1]; null: 1 if resolved, else 0")

    @property
    def outcome(self) -> Outcome:
        """One word for the grade: resolved, unresolved (the tests ran and some failed), or the error's kind."""
        if self.error is not None:
            return self.error
        return "resolved" if self.resolved else "unresolved"

    @property
    def reward(self) -> float:
        """The reward this grade earns, before any shaping."""
        return float(self.resolved) if self.score is None else float(self.score)
