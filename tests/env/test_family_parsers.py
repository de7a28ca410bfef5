"""R2E-Gym's and SWE-smith's log parsers, and swebench 5's own parsers reached by their parse_log_* names."""

import pytest

from patchgym.env.grading import parse_log

R2E_LOG = """\
============================= test session starts ==============================
r2e_tests/test_1.py .....F                                              [100%]
PASSED r2e_tests/test_1.py::fake_before_summary
=========================== short test summary info ============================
PASSED r2e_tests/test_1.py::TestRational::test_limit_denominator
PASSED r2e_tests/test_1.py::test_plain
FAILED r2e_tests/test_1.py::test_bad - AssertionError: 1 != 2
ERROR r2e_tests/test_1.py::test_fixture - fixture 'db' not found
\x1b[32mPASSED\x1b[0m r2e_tests/test_1.py::test_coloured
========================= 1 failed, 3 passed in 0.57s =========================="""


def test_r2egym_keys_as_expected_output_json_names_them():
    assert parse_log(R2E_LOG, "r2egym") == {
        "TestRational.test_limit_denominator": "PASSED", "test_plain": "PASSED", "test_bad": "FAILED",
        "test_fixture": "ERROR"}  # a coloured status word does not start the line, so R2E-Gym skips it
    assert parse_log("PASSED r2e_tests/test_1.py::test_plain", "r2egym") == {}  # no summary, no results


SMITH_LOG = """\
tests/test_a.py::test_x PASSED                                           [ 33%]
tests/test_a.py::test_y[1-2] FAILED                                      [ 66%]
tests/test_b.py::test_z SKIPPED (no network)                             [100%]
collected 3 items
"""


def test_swesmith_reads_pytest_verbose_lines():
    assert parse_log(SMITH_LOG, "swesmith") == {
        "tests/test_a.py::test_x": "PASSED", "tests/test_a.py::test_y[1-2]": "FAILED",
        "tests/test_b.py::test_z": "SKIPPED"}


def test_swebench_names_run_swebench_5s_own_parsers():
    registry = pytest.importorskip("swebench.harness.log_parsers").PARSER_REGISTRY
    log = "test_x (a.tests.T) ... ok\ntest_y (a.tests.T) ... FAIL\nPASSED t.py::a\nFAILED t.py::b - boom\n"
    for name in ("parse_log_django", "parse_log_pytest", "parse_log_pytest_v2", "parse_log_sympy"):
        assert parse_log(log, name) == registry[name](log, None)
    assert parse_log(log, "parse_log_pytest") == {"t.py::a": "PASSED", "t.py::b": "FAILED"}
    with pytest.raises(ValueError, match="not in swebench's PARSER_REGISTRY"):
        parse_log(log, "parse_log_nothing")
