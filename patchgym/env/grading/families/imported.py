"""The families of imported dataset rows, graded as their own harness grades them: the candidate patch, then the row's
eval script (which resets exactly the test_patch's files and applies it), run as root as the harness runs it.

The grader undoes only the patch's changes to files that run code when Python starts (harness.RUNS_AT_START); the
script's markers are per-run nonces (harness.prepared_script); where pytest runs the tests, its doors are closed by
how it is invoked and its structured report, sent through the side channel, is the verdict, the log parser's
disagreement recorded. The three families differ in who reads the log and who judges:

    swebench          swebench 5's own get_logs_eval / get_eval_report (swebench_harness.py)
    harness           the harness's parser, ported (R2E-Gym, SWE-smith's Python profiles), and SWE-bench's rule
    swesmith-profile  the row's swesmith profile's own parser and verdict, in the harness venv (smith_harness.py)
"""

import secrets
from dataclasses import dataclass

from patchgym.env.grading import harness, report, smith_harness, steps, swebench_harness
from patchgym.env.grading.family import GradingFamily, Guarantees, Outcomes, Ungraded, register_family
from patchgym.env.workspace import apply_patch, check_out_start
from patchgym.sandbox import ExecResult, Sandbox
from patchgym.tasks.task import Task

EVAL_SCRIPT = f"{steps.GRADER_DIR}/eval.sh"
NONCE_FILE = f"{steps.GRADER_DIR}/nonce"
PYTEST_CONFIG_DIR = f"{steps.GRADER_DIR}/pytest-config"


@dataclass
class Attempt:
    """One grade's state: the eval script, the pytest exports, the files that run at start as they were."""

    script: str
    pytest_row: bool
    exports: str = ""
    startup: dict[str, bytes | None] | None = None
    nonce: str = ""


class ImportedFamily(GradingFamily):
    """An imported row's eval script; a subclass says who reads its log and who judges."""

    guarantees = Guarantees(report_channel=True, hidden_tests=True, restores_owned_files=False, tamper_checks=False,
                            fixed_plugins=True)

    def report_of(self, task: Task, log: str) -> tuple[dict[str, str], bool, bool]:
        """(status map, whether the log is a valid test run, resolved) as the row's harness reads `log`."""
        raise NotImplementedError

    def prepare(self, sandbox: Sandbox, task: Task, patch: str) -> Attempt:
        wd = task.workdir
        check_out_start(sandbox, task)
        apply_patch(sandbox, task.bug_patch, wd, "bug")  # a row carries none; a replica built on the base image may
        script = task.eval_script or harness.script_for(task)
        harness.check_markers(task, script)
        attempt = Attempt(script=script, pytest_row=self.runs_pytest(task))
        if attempt.pytest_row:  # all read before the patch can change them
            plugins = report.installed_plugins(sandbox, wd, prelude=harness.environment_prelude(script, wd))
            plugin = report.install_report_plugin(sandbox)
            attempt.exports = harness.pytest_exports(report.plugin_args(plugin.module, None), plugins,
                                                     _copy_pytest_config(sandbox, wd), wd, plugin.directory)
        attempt.startup = {p: _read(sandbox, f"{wd}/{p}") for p in harness.patch_paths(patch)
                           if harness.RUNS_AT_START.search(p)}
        return attempt

    def after_patch(self, sandbox: Sandbox, task: Task, attempt: Attempt) -> None:
        for path, original in (attempt.startup or {}).items():
            if original is None:
                sandbox.exec(["rm", "-rf", "--", path], cwd=task.workdir)
            else:
                sandbox.write_file(f"{task.workdir}/{path}", original)
        attempt.nonce = secrets.token_hex(16)
        sandbox.write_file(NONCE_FILE, attempt.nonce)
        sandbox.write_file(EVAL_SCRIPT, harness.prepared_script(attempt.script, NONCE_FILE, attempt.exports))

    def run(self, sandbox: Sandbox, task: Task, attempt: Attempt, timeout: float) -> ExecResult:
        # As root, as the row's own harness runs it (its scripts reset files and install); its pytest's report still
        # leaves through the side channel.
        return sandbox.exec(["bash", EVAL_SCRIPT], cwd=task.workdir, timeout=timeout, output_limit=steps.LOG_LIMIT,
                            side_channel=report.CHANNEL_LIMIT if attempt.pytest_row else None)

    def outcomes(self, task: Task, run: ExecResult, attempt: Attempt) -> Outcomes:
        log = harness.trusted_log(run.output, attempt.nonce)
        if log is None:
            raise Ungraded("no_tests_ran", "the eval script never printed its test output markers; log tail:\n"
                                           f"{run.output[-2000:]}")
        statuses, _, logged_resolved = self.report_of(task, log)
        code = harness.test_exit_code(log)
        exit_code = run.exit_code if code is None else code
        disagreement = None
        if attempt.pytest_row:
            try:
                reported = harness.as_logged(task, report.read_report(run))
            except report.Tampered as exc:
                raise Ungraded("tampered", str(exc), exit_code) from None
            except report.ReportMissing as exc:
                raise Ungraded("no_tests_ran", f"{exc}; log tail:\n{log[-2000:]}", exit_code) from None
            disagreement = harness.disagreement(statuses, reported)
            statuses = reported
        if not statuses:
            raise Ungraded("no_tests_ran", f"no test results in the marked output; log tail:\n{log[-2000:]}",
                           exit_code)
        return Outcomes(statuses, exit_code, self.logged_verdict(logged_resolved), disagreement)

    def logged_verdict(self, logged_resolved: bool) -> bool | None:
        """The harness's verdict on its own log where it is the verdict (None: judged from the statuses)."""
        return None


@register_family
class Swebench(ImportedFamily):
    name = "swebench"

    def report_of(self, task: Task, log: str) -> tuple[dict[str, str], bool, bool]:
        return swebench_harness.official_report(task, log)

    def resolved(self, task: Task, statuses: dict[str, str]) -> bool:
        return swebench_harness.official_resolved(task, statuses)

    def runs_pytest(self, task: Task) -> bool:
        return swebench_harness.runs_pytest(task.log_parser)


@register_family
class PortedHarness(ImportedFamily):
    name = "harness"

    def report_of(self, task: Task, log: str) -> tuple[dict[str, str], bool, bool]:
        return harness.harness_report(task, log)

    def resolved(self, task: Task, statuses: dict[str, str]) -> bool:
        return harness.harness_resolved(task, statuses)

    def runs_pytest(self, task: Task) -> bool:
        return task.log_parser in harness.PYTEST_PARSERS


@register_family
class SmithProfile(ImportedFamily):
    name = "swesmith-profile"

    def report_of(self, task: Task, log: str) -> tuple[dict[str, str], bool, bool]:
        return smith_harness.smith_report(task, log)

    def logged_verdict(self, logged_resolved: bool) -> bool | None:
        return logged_resolved  # swesmith's verdict is on its own log parse


def _copy_pytest_config(sandbox: Sandbox, wd: str) -> str:
    """Copy the file pytest takes its configuration from in `wd` (before the patch) into the grader's directory;
    return the copy's path, or an empty `pytest.ini` where there is none (so that one the patch adds is not read)."""
    for name, section in harness.CONFIG_FILES:
        text = _read(sandbox, f"{wd}/{name}")
        if text is not None and (section is None or section.search(text.decode("utf-8", "replace"))):
            sandbox.write_file(f"{PYTEST_CONFIG_DIR}/{name}", text)
            return f"{PYTEST_CONFIG_DIR}/{name}"
    sandbox.write_file(f"{PYTEST_CONFIG_DIR}/pytest.ini", "")
    return f"{PYTEST_CONFIG_DIR}/pytest.ini"


def _read(sandbox: Sandbox, path: str) -> bytes | None:
    try:
        return sandbox.read_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None
