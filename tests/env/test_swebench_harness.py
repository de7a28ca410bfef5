"""official_report grades a log exactly as a direct call of swebench 5's get_logs_eval / get_eval_report does."""

import sys

import pytest

from patchgym.env.grading.swebench_harness import SwebenchMissing, official_report
from patchgym.tasks.task import Task

grading = pytest.importorskip("swebench.harness.grading")
make_test_spec = pytest.importorskip("swebench.harness.utils").make_test_spec

SCRIPT = ("#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\npytest -rA t.py\n"
          ": '>>>>> End Test Output'\n")
TASK = Task(instance_id="psf__requests-1", repo="psf/requests", problem_statement="p", version="2.0",
            FAIL_TO_PASS=["t.py::test_fix", "t.py::test_fix2"], PASS_TO_PASS=["t.py::test_old"], image="img",
            eval_script=make_test_spec({"instance_id": "psf__requests-1", "image": "img", "repo": "psf/requests",
                                        "version": "2.0", "FAIL_TO_PASS": [], "PASS_TO_PASS": [],
                                        "log_parser": "parse_log_pytest_options", "eval_type": "pass_and_fail",
                                        "eval_script": SCRIPT}).eval_script,
            log_parser="parse_log_pytest_options", eval_type="pass_and_fail", source="swebench")


def log(lines: list[str], exit_code: int) -> str:
    return ("+ : '>>>>> Start Test Output'\n" + "\n".join(lines) + f"\n+ SWEBENCH_TEST_EXIT_CODE={exit_code}\n"
            f"+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: {exit_code}\n")


LOGS = {
    "gold": log(["PASSED t.py::test_fix", "PASSED t.py::test_fix2", "PASSED t.py::test_old"], 0),
    "empty": log(["FAILED t.py::test_fix - assert 1 == 2", "FAILED t.py::test_fix2", "PASSED t.py::test_old"], 1),
    "partial": log(["PASSED t.py::test_fix", "FAILED t.py::test_fix2", "PASSED t.py::test_old"], 1),
    "forged": log(["PASSED t.py::test_fix", "PASSED t.py::test_fix2", "PASSED t.py::test_old"], 2),
    "no markers": "PASSED t.py::test_fix\n",
}


@pytest.mark.parametrize("name", LOGS)
def test_official_report_equals_swebench_5(name, tmp_path):
    path = tmp_path / "test_output.txt"
    path.write_text(LOGS[name])
    spec = make_test_spec(TASK.model_dump())
    status_map, found = grading.get_logs_eval(spec, str(path))
    report = grading.get_eval_report(spec, {"instance_id": TASK.instance_id, "model_name_or_path": "m",
                                            "model_patch": "diff"}, str(path), include_tests_status=False)
    assert official_report(TASK, LOGS[name]) == (status_map, found, report[TASK.instance_id]["resolved"])


def test_the_verdicts_are_the_expected_ones():
    verdicts = {name: official_report(TASK, text)[1:] for name, text in LOGS.items()}
    assert verdicts == {"gold": (True, True), "empty": (True, False), "partial": (True, False),
                        "forged": (False, False), "no markers": (False, False)}


def test_without_swebench_the_error_names_the_extra(monkeypatch):
    for name in ("swebench", "swebench.harness.grading", "swebench.harness.utils"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SwebenchMissing, match=r"pip install 'patchgym\[swebench\]'"):
        official_report(TASK, LOGS["gold"])


def test_the_rows_whose_swebench_parser_reads_pytest_output_are_told_apart():
    from patchgym.env.grading.swebench_harness import runs_pytest

    assert all(runs_pytest(f"parse_log_{name}") for name in ("pytest", "marshmallow", "astropy", "requests", "sphinx"))
    assert not any(runs_pytest(name) for name in ("parse_log_django", "parse_log_sympy", "pytest", "r2egym"))
