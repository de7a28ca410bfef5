"""A test log graded exactly as SWE-smith grades it, for rows whose repo profile parses logs its own way.

swesmith cannot be imported next to swebench 5, so its code runs in the classic harness venv
(env/grading/harness_venv.py): read_test_output slices the marked section, the row's profile's own log_parser reads it
(mocha, jest, vitest, go test, cargo, ...), and get_eval_report gives the verdict: one request per log to the
process's long-lived worker. The Python profiles' default parser is ported in family_parsers.py instead.
"""

from patchgym.env.grading import harness_venv
from patchgym.errors import UserError
from patchgym.tasks.task import Task


class SmithGradeError(UserError):
    """swesmith could not read a log of the row (its profile is unknown, or its parser failed)."""


def smith_report(task: Task, log: str) -> tuple[dict[str, str], bool, bool]:
    """(status map, tests found in the log, resolved) for `log` (a trusted log: the marked test output), by swesmith's
    read_test_output, the profile's log_parser and get_eval_report for a non-empty patch."""
    row = {"instance_id": task.instance_id, "repo": task.repo, "FAIL_TO_PASS": task.FAIL_TO_PASS,
           "PASS_TO_PASS": task.PASS_TO_PASS, "log": log}
    (answer,) = harness_venv.smith_grade([row])
    if "error" in answer:
        raise SmithGradeError(f"task {task.instance_id}: swesmith could not grade its log: {answer['error']}")
    report = answer["report"]
    return report["statuses"], report["found"], report["resolved"]
