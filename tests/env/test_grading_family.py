"""Grading families: every row is graded by one registered family, found by the name the row gives (or, for a row
written before rows named one, by the fields that told it); a family of one's own plugs in through the public seams
alone; nothing outside the families' home decides a row's grading by comparing its log parser's name."""

import re
from pathlib import Path

import pytest

from patchgym.env.grading.families import family_of
from patchgym.env.grading.family import FAMILIES, GradingFamily, Guarantees, Outcomes, Ungraded, register_family
from patchgym.env.grading.grader import grade_patch
from patchgym.sandbox import ExecResult, Sandbox, SandboxConfig
from patchgym.tasks import Task, TaskError
from patchgym.tasks.task import HarborSpec

ROOT = Path(__file__).resolve().parents[2]


def _task(**fields) -> Task:
    return Task(**{"instance_id": "t", "repo": "r", "problem_statement": "p", "FAIL_TO_PASS": ["a"], **fields})


@pytest.mark.parametrize(("fields", "family"), [
    ({"log_parser": "patchgym_report", "source": "factory"}, "pytest-report"),
    ({"log_parser": "patchgym_tape", "source": "factory"}, "tape-report"),
    ({"log_parser": "pytest"}, "log"),
    ({"log_parser": "parse_log_pytest", "source": "swebench"}, "swebench"),
    ({"log_parser": "parse_log_django", "source": "swegym"}, "swebench"),
    ({"log_parser": "r2egym", "source": "r2egym"}, "harness"),
    ({"log_parser": "swesmith", "source": "smith"}, "harness"),
    ({"log_parser": "swesmith-profile", "source": "smith"}, "swesmith-profile"),
    ({"source": "harbor", "harbor": HarborSpec(tests="eA=="), "FAIL_TO_PASS": []}, "harbor"),
])
def test_a_row_that_names_no_family_gets_the_one_its_fields_imply(fields, family):
    assert family_of(_task(**fields)).name == family


def test_a_row_that_names_its_family_gets_that_one_whatever_its_parser():
    assert family_of(_task(log_parser="pytest", grading="swebench")).name == "swebench"


def test_an_unknown_family_is_an_error_naming_the_task_and_the_known_families():
    with pytest.raises(TaskError, match=r"task t: field grading: unknown grading family 'nope'; known: harbor, "
                                        r"harness, log, pytest-report"):
        family_of(_task(grading="nope"))


def test_a_family_registered_twice_is_refused():
    with pytest.raises(ValueError, match="grading family 'log' is registered twice"):
        register_family(type("AnotherLog", (GradingFamily,), {"name": "log"}))


def test_only_harbor_grades_in_place_and_only_the_factory_families_check_for_tampering():
    assert [name for name, f in sorted(FAMILIES.items()) if f.in_place] == ["harbor"]
    assert [name for name, f in sorted(FAMILIES.items()) if f.guarantees.tamper_checks] == ["pytest-report",
                                                                                           "tape-report"]


def test_a_task_graded_in_place_has_no_patch_to_grade():
    with pytest.raises(TaskError, match="graded in place"):
        grade_patch(_task(source="harbor", harbor=HarborSpec(tests="eA==")), "")


# What decides how a row is graded is its family; these are the only modules that may read the log parser's name for
# that (the families' own modules, and the registry that infers a family for rows that name none).
FAMILY_HOME = ("patchgym/env/grading/family.py", "patchgym/env/grading/families/")
_PARSER_COMPARED = re.compile(r"log_parser\s*(==|!=|\bin\b|\bnot in\b)|(==|!=)\s*\w*\.?log_parser\b|"
                              r"log_parser\.startswith")


def test_no_module_outside_the_families_home_compares_a_log_parser_name():
    offenders = []
    for path in sorted(p for folder in ("patchgym", "bench", "scripts") for p in (ROOT / folder).rglob("*.py")):
        here = path.relative_to(ROOT).as_posix()
        if here.startswith(FAMILY_HOME):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _PARSER_COMPARED.search(line.split("#", 1)[0]):
                offenders.append(f"{here}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


class ExitCode(GradingFamily):
    """A family of one's own, through the public seams only: the test command's exit status is the verdict, every
    listed test taking it."""

    name = "toy-exit-code"
    guarantees = Guarantees(report_channel=False, hidden_tests=False, restores_owned_files=False,
                            tamper_checks=False, fixed_plugins=False)

    def prepare(self, sandbox: Sandbox, task: Task, patch: str) -> None:
        from patchgym.env.workspace import apply_patch

        apply_patch(sandbox, task.bug_patch, task.workdir, "bug")

    def after_patch(self, sandbox: Sandbox, task: Task, attempt: None) -> None:
        pass

    def run(self, sandbox: Sandbox, task: Task, attempt: None, timeout: float) -> ExecResult:
        return sandbox.exec(task.test_cmd, cwd=task.workdir, timeout=timeout)

    def outcomes(self, task: Task, run: ExecResult, attempt: None) -> Outcomes:
        if run.exit_code not in (0, 1):
            raise Ungraded("no_tests_ran", f"the tests exited {run.exit_code}")
        status = "PASSED" if run.exit_code == 0 else "FAILED"
        return Outcomes({t: status for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS)}, run.exit_code)

    def resolved(self, task: Task, statuses: dict[str, str]) -> bool:
        return all(statuses[t] == "PASSED" for t in task.FAIL_TO_PASS)


@pytest.fixture
def exit_code_family():
    register_family(ExitCode)
    yield FAMILIES[ExitCode.name]
    del FAMILIES[ExitCode.name]


@pytest.mark.sandbox
@pytest.mark.parametrize("backend", ["docker"], indirect=True)  # grading on each backend: tests/env/test_grader.py
def test_a_family_of_ones_own_grades_a_task_that_names_it(exit_code_family, backend, tiny_task):
    task = tiny_task.model_copy(update={"grading": ExitCode.name, "test_cmd": "python -m pytest -q tests"})
    config = SandboxConfig(backend=backend, memory_mb=1024)
    gold, empty = (grade_patch(task, patch, config, timeout=120) for patch in (task.patch, ""))
    assert gold.resolved and gold.exit_code == 0 and gold.f2p == {"tests/test_add.py::test_add": "PASSED"}, gold
    assert not empty.resolved and empty.error is None and empty.exit_code == 1, empty
