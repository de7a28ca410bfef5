"""The `pytest-report` family: a factory task of Python. Its tests run under pytest with plugin autoload off, only
the plugins installed before the patch, and patchgym's report plugin (strict: it checks each test's code against its
file) writing to the side channel; compiled caches are cleared first, so no planted cache runs in place of a source."""

from patchgym.env.grading import report, steps
from patchgym.env.grading.families.reported import Attempt, ReportedFamily
from patchgym.env.grading.family import PYTEST_REPORT_PARSER, register_family
from patchgym.sandbox import Sandbox
from patchgym.tasks.task import Task


@register_family
class PytestReport(ReportedFamily):
    name = "pytest-report"
    log_parser = PYTEST_REPORT_PARSER

    def prepare(self, sandbox: Sandbox, task: Task, patch: str) -> Attempt:
        attempt = super().prepare(sandbox, task, patch)
        attempt.plugins = self.plugins_before_patch(sandbox, task)  # before the patch can add one
        return attempt

    def plugins_before_patch(self, sandbox: Sandbox, task: Task) -> list[str]:
        return report.installed_plugins(sandbox, task.workdir)

    def command(self, sandbox: Sandbox, task: Task, attempt: Attempt) -> str:
        steps.clear_bytecode(sandbox, task.workdir)
        return report.pytest_command(f"{task.test_cmd} {report.FACTORY_ARGS}",
                                     report.install_report_plugin(sandbox, strict=True), attempt.plugins)

    def runs_pytest(self, task: Task) -> bool:
        return True
