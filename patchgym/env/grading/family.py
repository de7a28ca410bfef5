"""A grading family: one way of grading a row, as a registered object, and the registry every row's family is found in.

A family says how it prepares the sandbox, what it runs, how it turns what ran into per-test outcomes and a verdict,
which guarantees it gives, and whether it grades the patch in a fresh sandbox or the agent's own sandbox in place as
the episode ends (Harbor). Each family is a module of patchgym/env/grading/families/, registered there by name:

    pytest-report     a factory task of Python: pytest with patchgym's report plugin (families/pytest_report.py)
    tape-report       a factory task of JavaScript: tape with patchgym's reporter (families/tape_report.py)
    log               the test command's printed log, read by the row's named log parser (families/log.py)
    swebench          an imported row of the SWE-bench family, judged by swebench 5's own code (families/imported.py)
    harness           an imported row judged by a harness's ported parser: R2E-Gym, SWE-smith's Python profiles
    swesmith-profile  an imported SWE-smith row whose repo profile parses its own log (any language)
    harbor            a Harbor task folder's verifier, in the agent's sandbox (families/harbor.py)

A row names its family in `Task.grading`; a row written before that field existed gets the family its other fields
imply (`implied_family`). `patchgym.env.grading.families.family_of(task)` finds it, the built-in families registered.
"""

from dataclasses import dataclass
from typing import ClassVar, TypeVar

from patchgym.env.grading.grade import Grade
from patchgym.env.workspace import PatchApplyError, apply_patch
from patchgym.registry import Registry
from patchgym.sandbox import ExecResult, Sandbox
from patchgym.tasks.task import Task, TaskError

# The log parser names the factory's rows carry; each one's family is told by them alone.
PYTEST_REPORT_PARSER = "patchgym_report"
TAPE_REPORT_PARSER = "patchgym_tape"
SMITH_PROFILE_PARSER = "swesmith-profile"  # the row's swesmith profile parses its log, in the harness venv


@dataclass(frozen=True)
class Guarantees:
    """What a family promises about a grade, whatever the patch does."""

    report_channel: bool  # per-test results leave the tests' process through the side channel, out of its reach
    hidden_tests: bool  # the hidden tests reach the sandbox only after the candidate patch is in place
    restores_owned_files: bool  # tests, test configuration and packaging metadata the patch changed are put back
    tamper_checks: bool  # canaries and the reporter's own checks turn forgery inside the tests' process to `tampered`
    fixed_plugins: bool  # only the test runner's plugins installed before the patch load (pytest's autoload off)


@dataclass
class Outcomes:
    """What a run's report or log says: per-test statuses, the test command's exit code, and (where the family's
    harness judges its own log) that harness's verdict."""

    statuses: dict[str, str]
    exit_code: int | None
    resolved: bool | None = None
    parser_disagreement: dict[str, list[str]] | None = None


class Ungraded(Exception):
    """A run that gives no verdict: `error` is the Grade's error kind, `detail` says why."""

    def __init__(self, error: str, detail: str, exit_code: int | None = None):
        super().__init__(detail)
        self.error, self.detail, self.exit_code = error, detail, exit_code


class GradingFamily:
    """How one kind of row is graded. A fresh-sandbox family's `grade` is this template:

        prepare (before the candidate patch) -> the candidate patch -> after_patch (what the patch may not change,
        put back; the hidden tests written) -> run -> outcomes -> verdict

    An in-place family (`in_place`) grades the agent's own sandbox through `verify` instead.
    """

    name: ClassVar[str]
    in_place: ClassVar[bool] = False
    guarantees: ClassVar[Guarantees]

    def grade(self, sandbox: Sandbox, task: Task, patch: str, timeout: float) -> Grade:
        """Grade `patch` for `task` in `sandbox`, a fresh one from the task's image."""
        attempt = self.prepare(sandbox, task, patch)
        try:
            apply_patch(sandbox, patch, task.workdir, "candidate")
        except PatchApplyError as exc:
            return Grade(instance_id=task.instance_id, error="apply_failed", error_detail=str(exc))
        self.after_patch(sandbox, task, attempt)
        run = self.run(sandbox, task, attempt, timeout)
        if run.timed_out:
            return Grade(instance_id=task.instance_id, error="timeout", error_detail=f"tests ran over {timeout:g} s",
                         exit_code=run.exit_code)
        try:
            found = self.outcomes(task, run, attempt)
        except Ungraded as exc:
            code = run.exit_code if exc.exit_code is None else exc.exit_code
            return Grade(instance_id=task.instance_id, error=exc.error, error_detail=exc.detail, exit_code=code)
        resolved = self.resolved(task, found.statuses) if found.resolved is None else found.resolved
        return Grade(instance_id=task.instance_id, resolved=resolved, tests=found.statuses,
                     f2p={t: found.statuses.get(t, "MISSING") for t in task.FAIL_TO_PASS},
                     p2p={t: found.statuses.get(t, "MISSING") for t in task.PASS_TO_PASS}, exit_code=found.exit_code,
                     parser_disagreement=found.parser_disagreement or {})

    def prepare(self, sandbox: Sandbox, task: Task, patch: str) -> object:
        """Everything done before the candidate `patch` touches the workspace; returns this grade's own state (the
        family object is shared by every grade, in many threads)."""
        raise NotImplementedError

    def after_patch(self, sandbox: Sandbox, task: Task, attempt: object) -> None:
        """Undo what the patch may not change, and write the hidden tests."""
        raise NotImplementedError

    def run(self, sandbox: Sandbox, task: Task, attempt: object, timeout: float) -> ExecResult:
        """Run the tests."""
        raise NotImplementedError

    def outcomes(self, task: Task, run: ExecResult, attempt: object) -> Outcomes:
        """Per-test statuses from what ran; Ungraded where the run gives none (or shows forgery)."""
        raise NotImplementedError

    def resolved(self, task: Task, statuses: dict[str, str]) -> bool:
        """The family's rule for a verdict from per-test statuses."""
        raise NotImplementedError

    def runs_pytest(self, task: Task) -> bool:
        """Whether the row's tests run under pytest (so pytest's structured report can be read)."""
        return False

    def plugins_before_patch(self, sandbox: Sandbox, task: Task) -> list[str] | None:
        """The pytest plugins that a run of the row's tests outside grading (the execution-based verifier) may load,
        listed before a patch; None where pytest's autoload stays on."""
        return None

    def verify(self, sandbox: Sandbox, task: Task, *, threshold: float = 1.0, score: str = "auto") -> Grade:
        """An in-place family's grade of the agent's sandbox as the episode ends: a score at or over `threshold`
        resolves; `score` says which of several named rewards is the score (rollout.harbor_score)."""
        raise TaskError(f"task {task.instance_id} is graded by its patch in a fresh sandbox ({self.name}), "
                        "not in the agent's own sandbox")


FAMILIES: Registry[GradingFamily] = Registry("grading family")
G = TypeVar("G", bound=type[GradingFamily])


def register_family(cls: G) -> G:
    """Class decorator: register one instance of the family under its `name`."""
    FAMILIES.register(cls.name)(cls())
    return cls


def implied_family(task: Task) -> str:
    """The family of a row that names none (rows written before `Task.grading`), from the fields that told it."""
    if task.harbor is not None:
        return "harbor"
    if task.log_parser == PYTEST_REPORT_PARSER:
        return "pytest-report"
    if task.log_parser == TAPE_REPORT_PARSER:
        return "tape-report"
    if not task.imported:
        return "log"
    if task.log_parser == SMITH_PROFILE_PARSER:
        return "swesmith-profile"
    return "swebench" if task.log_parser.startswith("parse_log_") else "harness"

