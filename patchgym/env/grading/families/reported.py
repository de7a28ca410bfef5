"""What the factory's two families share: a test runner whose per-test report leaves through the side channel,
written by patchgym's reporter inside the tests' process, with canaries planted beside the hidden tests; the tests
run as the agent's user, as if the code under test were hostile (docs/guides/tasks.md, "What the reward resists").

A run that shows forgery (the reporter's closing check, records it did not write, a canary with the wrong result) is
`tampered`. A factory task's tests passed in both clean runs, so only PASSED passes: an xfail now is a mark the
patch added."""

from dataclasses import dataclass, field

from patchgym.env.grading import report, steps
from patchgym.env.grading.canaries import Canary, judge, without_planted
from patchgym.env.grading.canaries.plant import plant_canaries
from patchgym.env.grading.family import GradingFamily, Guarantees, Outcomes, Ungraded
from patchgym.env.grading.parsers import PASSED
from patchgym.sandbox import ExecResult, Sandbox
from patchgym.tasks.task import Task


@dataclass
class Attempt:
    """One grade's state: the pytest plugins installed before the patch (Python), the canaries planted."""

    plugins: list[str] | None = None
    canaries: list[Canary] = field(default_factory=list)


class ReportedFamily(GradingFamily):
    """A factory family; a subclass says which tests are JavaScript and how its runner runs with the reporter."""

    guarantees = Guarantees(report_channel=True, hidden_tests=True, restores_owned_files=True, tamper_checks=True,
                            fixed_plugins=True)
    javascript_tests = False
    log_parser: str  # what the family's rows carry as their log_parser (rows that name no family are told by it)

    def prepare(self, sandbox: Sandbox, task: Task, patch: str) -> Attempt:
        steps.start_from_bug(sandbox, task)
        return Attempt()

    def after_patch(self, sandbox: Sandbox, task: Task, attempt: Attempt) -> None:
        steps.restore_owned_and_write_tests(sandbox, task)

    def command(self, sandbox: Sandbox, task: Task, attempt: Attempt) -> str:
        """The test command, its reporter installed (after the canaries are planted)."""
        raise NotImplementedError

    def run(self, sandbox: Sandbox, task: Task, attempt: Attempt, timeout: float) -> ExecResult:
        attempt.canaries = plant_canaries(sandbox, task, javascript_tests=self.javascript_tests)
        command = self.command(sandbox, task, attempt)
        return report.run_reported(sandbox, command, task.workdir, timeout, steps.LOG_LIMIT)

    def outcomes(self, task: Task, run: ExecResult, attempt: Attempt) -> Outcomes:
        try:
            statuses = report.read_report(run)
        except report.Tampered as exc:
            raise Ungraded("tampered", str(exc)) from None
        except report.ReportMissing as exc:
            raise Ungraded("no_tests_ran", steps.no_results_detail(str(exc), run.exit_code, run.output)) from None
        problems = judge(attempt.canaries, statuses)
        if problems:
            raise Ungraded("tampered", "; ".join(problems[:5]))
        statuses = without_planted(statuses, attempt.canaries)
        if not statuses:
            raise Ungraded("no_tests_ran", steps.no_results_detail("no test results", run.exit_code, run.output))
        return Outcomes(statuses, run.exit_code)

    def resolved(self, task: Task, statuses: dict[str, str]) -> bool:
        return all(statuses.get(t, "MISSING") == PASSED for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS))
