"""The grade of one patch: the record every stage reads (trajectories, eval, training, selection, the viewer).

A grade is either a verdict (the tests ran: `resolved` says whether every FAIL_TO_PASS and PASS_TO_PASS test
passed) or an error of a named kind, with its detail. Graders other than the test suite's (the synthetic
environments of the trainer's tests) may state their own score in `score`.

Which grades take a reward: a verdict always does; so does an error the patch caused (`apply_failed`, `timeout`,
`tampered`, and `no_tests_ran` on a task whose tests are known to run), scored 0. An `infra` error, and a
`no_tests_ran` on a row whose tests were never seen to run, say nothing about the patch: they are `excluded`.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# apply_failed: the patch does not apply; infra: the grading sandbox died; no_tests_ran: no sign the suite ran;
# timeout: the tests ran over the limit; empty_patch: the agent changed nothing, so nothing was run;
# tampered: the code under test changed how pytest runs or reports tests (the report plugin's closing check).
GradeError = Literal["apply_failed", "infra", "no_tests_ran", "timeout", "empty_patch", "tampered"]
Outcome = Literal["resolved", "unresolved", "apply_failed", "infra", "no_tests_ran", "timeout", "empty_patch",
                  "tampered"]
# The errors eval counts as grading errors (empty_patch is not one: nothing was graded).
GRADING_ERRORS: frozenset[str] = frozenset({"apply_failed", "infra", "no_tests_ran", "timeout", "tampered"})
# Why a grade takes no reward: the sandbox, engine or image failed; or no test ran on a row never validated, which
# may be the row's fault as much as the patch's.
Exclusion = Literal["infra", "unvalidated_no_tests"]


class StepGrade(BaseModel):
    """What one step of a multi-step Harbor task got from its verifier."""

    model_config = ConfigDict(extra="forbid")

    name: str
    score: float | None = Field(None, description="the step's reward (None: its verifier gave none)")
    rewards: dict[str, float] = Field(default_factory=dict, description="every named reward it wrote (reward.txt's "
                                      "one number is named 'reward')")
    error: GradeError | None = None
    error_detail: str = ""
    exit_code: int | None = None
    duration: float = Field(0.0, description="seconds its verifier took")
    artifacts: dict[str, str] = Field(default_factory=dict, description="artifact name -> a base64 tar.gz of it "
                                      "(or why it is not kept: missing, over the limit)")


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
    exit_code: int | None = Field(None, description="the test command's exit status (on a factory task the grader's "
                                  "canaries fail on purpose, so a resolved grade may show 1)")
    duration: float = Field(0.0, description="seconds, sandbox start included")
    score: float | None = Field(None, description="a grader's own reward (a Harbor verifier's); null: 1 if resolved, "
                                                 "else 0")
    rewards: dict[str, float] = Field(default_factory=dict, description="a Harbor verifier's named rewards "
                                                                         "(reward.json), when it wrote more than one")
    steps: list[StepGrade] = Field(default_factory=list, description="a multi-step Harbor task's steps, each with "
                                   "its own grade, in the order played (those after an early stop are absent)")
    tests_known_to_run: bool = Field(True, description="the task's tests were seen to run (a factory task, or an "
                                     "imported row with validated=True): then no_tests_ran is the patch's doing")
    parser_disagreement: dict[str, list[str]] = Field(
        default_factory=dict, description="test -> [log parser's status, structured report's status] where the "
                                          "printed log and pytest's own report differ (MISSING: absent from one)")

    @field_validator("error", mode="before")
    @classmethod
    def _old_names(cls, value):
        return "apply_failed" if value == "apply" else value  # records written before the rename still load

    @property
    def outcome(self) -> Outcome:
        """One word for the grade: resolved, unresolved (the tests ran and some failed), or the error's kind."""
        if self.error is not None:
            return self.error
        return "resolved" if self.resolved else "unresolved"

    @property
    def excluded(self) -> Exclusion | None:
        """Why this grade takes no reward (and is left out of rates, counted on its own), or None."""
        if self.error == "infra":
            return "infra"
        if self.error == "no_tests_ran" and not self.tests_known_to_run:
            return "unvalidated_no_tests"
        return None

    @property
    def reward(self) -> float:
        """The reward this grade earns, before any shaping; an excluded grade has none."""
        if self.excluded:
            raise ValueError(f"grade of {self.instance_id or 'a patch'} is excluded ({self.excluded}): no reward")
        return float(self.resolved) if self.score is None else float(self.score)
