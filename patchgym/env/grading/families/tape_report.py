"""The `tape-report` family: a factory task of JavaScript (the npm factory). Its tape tests run with patchgym's tape
reporter preloaded, writing each assertion's result to the side channel."""

from patchgym.env.grading import tape
from patchgym.env.grading.families.reported import Attempt, ReportedFamily
from patchgym.env.grading.family import TAPE_REPORT_PARSER, register_family
from patchgym.sandbox import Sandbox
from patchgym.tasks.task import Task


@register_family
class TapeReport(ReportedFamily):
    name = "tape-report"
    log_parser = TAPE_REPORT_PARSER
    javascript_tests = True

    def command(self, sandbox: Sandbox, task: Task, attempt: Attempt) -> str:
        return tape.tape_command(task.test_cmd, tape.install_tape_reporter(sandbox))
