"""The `log` family: a row of patchgym's own whose test command's printed log is read by the row's named log
parser (patchgym.env.grading.parsers), in a fresh sandbox with the owned files put back and the hidden tests written
after the patch. Nothing shields the log from the code under test: rows that need that are factory rows."""

from patchgym.env.grading import parsers, steps
from patchgym.env.grading.family import GradingFamily, Guarantees, Outcomes, Ungraded, register_family
from patchgym.sandbox import ExecResult, Sandbox
from patchgym.tasks.task import Task


@register_family
class PrintedLog(GradingFamily):
    name = "log"
    guarantees = Guarantees(report_channel=False, hidden_tests=True, restores_owned_files=True, tamper_checks=False,
                            fixed_plugins=False)

    def prepare(self, sandbox: Sandbox, task: Task, patch: str) -> None:
        steps.start_from_bug(sandbox, task)

    def after_patch(self, sandbox: Sandbox, task: Task, attempt: None) -> None:
        steps.restore_owned_and_write_tests(sandbox, task)

    def run(self, sandbox: Sandbox, task: Task, attempt: None, timeout: float) -> ExecResult:
        return sandbox.exec(task.test_cmd or task.eval_script, cwd=task.workdir, timeout=timeout,
                            output_limit=steps.LOG_LIMIT)

    def outcomes(self, task: Task, run: ExecResult, attempt: None) -> Outcomes:
        statuses = parsers.parse_log(run.output, task.log_parser)
        if not statuses:
            raise Ungraded("no_tests_ran", steps.no_results_detail("no test results in the log", run.exit_code,
                                                                   run.output))
        return Outcomes(statuses, run.exit_code)

    def resolved(self, task: Task, statuses: dict[str, str]) -> bool:
        return all(statuses.get(t, "MISSING") in parsers.PASSING for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS))
