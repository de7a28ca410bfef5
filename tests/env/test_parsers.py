"""Log parsers: agreement with SWE-bench's own parsers on real and hand-written pytest logs, and expectations
for the django, sympy, matplotlib, seaborn and unittest formats."""

import os
import subprocess
import sys
import textwrap

import pytest

from patchgym.env.grading import PARSERS, parse_log
from patchgym.env.grading.parsers import STATUSES

# Each of our parsers and the SWE-bench function it must agree with.
SWEBENCH_NAMES = {"pytest": "parse_log_pytest", "pytest_options": "parse_log_pytest_options",
                  "pytest_v2": "parse_log_pytest_v2", "matplotlib": "parse_log_matplotlib",
                  "seaborn": "parse_log_seaborn", "django": "parse_log_django", "sympy": "parse_log_sympy"}

MIXED = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("fixture boom")

@pytest.fixture
def bad_teardown():
    yield 1
    raise RuntimeError("teardown boom")

def test_pass():
    print("PASSED tests/test_other.py::test_fake")

def test_fail():
    assert 1 == 2, "one - is not two"

def test_error(broken):
    pass

def test_teardown(bad_teardown):
    pass

def test_fail_and_teardown(bad_teardown):
    assert 0

@pytest.mark.skip(reason="not today")
def test_skip():
    pass

def test_skip_inside():
    pytest.skip("inside")

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert 0

@pytest.mark.xfail(reason="fixed?", strict=True)
def test_xpass_strict():
    pass

@pytest.mark.xfail(reason="fixed?")
def test_xpass():
    pass

@pytest.mark.parametrize("x", ["a b", "c[d]", "e::f", "5m", " lead", "x - y", "-", "/tmp/abc/data.txt"])
def test_param(x):
    assert x not in ("x - y", "-")
'''
BAD_IMPORT = "import no_such_module_xyz\n\ndef test_never():\n    pass\n"
CLASSES = '''
import unittest
import pytest

class TestOuter:
    def setup_class(cls):
        pass

    class TestInner:
        def test_deep(self):
            pass

    @pytest.mark.parametrize("n", [1, 2])
    def test_n(self, n):
        assert n == 1

class TestBrokenSetup:
    def setup_method(self):
        raise ValueError("no setup")

    def test_a(self):
        pass

class TestUnit(unittest.TestCase):
    def test_ok(self):
        pass

    @unittest.expectedFailure
    def test_expected(self):
        self.fail()
'''
# Multi-line messages reach column 0 with --tb=native and in captured output: the classic spoof.
SPOOFING = '''
import logging
import sys

def test_native_message():
    raise RuntimeError("boom\\nPASSED tests/test_spoof.py::test_native_message\\nXFAIL tests/test_spoof.py::test_y")

def test_prints():
    print("FAILED tests/test_spoof.py::test_prints - fake")
    print("SKIPPED [7] tests/test_spoof.py:1: fake")
    print("ERROR tests/test_spoof.py::test_native_message")
    sys.stderr.write("PASSED tests/test_spoof.py::test_logs\\n")

def test_logs():
    logging.getLogger("app").error("ERROR    during PASSED")
    assert False
'''
FAKE_SUMMARY_CONFTEST = '''
def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line("PASSED tests/test_spoof.py::test_logs")
'''
MODULE_SKIP = '''
import pytest
pytest.skip("whole module", allow_module_level=True)

def test_never():
    pass
'''
IDS = '''
import pytest

@pytest.mark.parametrize("v", ["\\u00e9t\\u00e9", "", "tab\\there", "a/b/c", "//net/share", "*/glob", "[nested]"])
def test_ids(v):
    assert v != "*/glob"

@pytest.mark.parametrize("a,b", [(1, 2), (3, 4)], ids=["one two", "three-four"])
def test_named(a, b):
    pass

def helper():
    """
    >>> 1 + 1
    2
    >>> print("PASSED x")
    FAILED x
    """
'''


def write_suite(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


# name -> (files under tests/, extra pytest arguments)
REAL_RUNS = {
    "mixed": ({"test_mix.py": MIXED, "test_bad.py": BAD_IMPORT}, ["--continue-on-collection-errors"]),
    "mixed_colour": ({"test_mix.py": MIXED, "test_bad.py": BAD_IMPORT}, ["--continue-on-collection-errors",
                                                                         "--color=yes"]),
    "mixed_verbose": ({"test_mix.py": MIXED}, ["-v"]),
    "mixed_quiet_line_tb": ({"test_mix.py": MIXED}, ["-q", "--tb=line"]),
    "classic_verbose_colour": ({"test_mix.py": MIXED}, ["-v", "-o", "console_output_style=classic", "--color=yes"]),
    "collection_interrupted": ({"test_mix.py": MIXED, "test_bad.py": BAD_IMPORT}, []),
    "stop_at_first_failure": ({"test_mix.py": MIXED}, ["-x"]),
    "runxfail": ({"test_mix.py": MIXED}, ["--runxfail", "--tb=short"]),
    "classes": ({"test_classes.py": CLASSES}, ["-v"]),
    "spoof_native_tb": ({"test_spoof.py": SPOOFING}, ["--tb=native"]),
    "spoof_no_capture": ({"test_spoof.py": SPOOFING}, ["-s", "--color=yes"]),
    "spoof_terminal_summary": ({"test_spoof.py": SPOOFING, "conftest.py": FAKE_SUMMARY_CONFTEST}, []),
    "module_skip": ({"test_skipmod.py": MODULE_SKIP, "test_classes.py": CLASSES}, []),
    "awkward_ids_doctests": ({"test_ids.py": IDS}, ["--doctest-modules", "-v"]),
}


def run_pytest(root, args: list[str]) -> str:
    """Real `pytest -rA` output for the suite under `root`/tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-p", "no:timeout", *args, "tests"]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120).stdout


# SWE-bench-style evaluation logs and formats a current pytest no longer prints.
HAND_LOGS = {
    "swebench_eval_log": (
        "+ git checkout 3a2f1e tests/test_io.py\nUpdated 1 path from 4b1c2d\n+ pytest -rA tests/test_io.py\n"
        "============================= test session starts ==============================\n"
        "collected 4 items\n\ntests/test_io.py ..F.                                                   [100%]\n"
        "=========================== short test summary info ============================\n"
        "PASSED tests/test_io.py::test_read[/tmp/pytest-of-root/pytest-3/test_read0/data.fits]\n"
        "PASSED tests/test_io.py::test_write[//server/share]\n"
        "PASSED tests/test_io.py::test_glob[/tmp/*.fits]\n"
        "FAILED tests/test_io.py::test_header - KeyError: 'NAXIS'\n"
        "========================= 1 failed, 3 passed in 0.52s ==========================\n"
        "+ git checkout 3a2f1e tests/test_io.py\n"),
    "old_pytest_verbose": (
        "astropy/io/tests/test_a.py::test_one PASSED\nastropy/io/tests/test_a.py::test_two FAILED\n"
        "astropy/io/tests/test_a.py::test_three[a b] SKIPPED\nastropy/io/tests/test_a.py::test_four ERROR\n"
        "astropy/io/tests/test_a.py::test_five xfail\n"),
    "crlf_and_progress": (
        "collecting ... \rcollected 2 items\r\nPASSED tests/test_a.py::test_one\r\n"
        "tests/test_a.py::test_two \rPASSED tests/test_a.py::test_two\r\nFAILED tests/test_a.py::test_3 - x\r\n"),
    "xdist": (
        "[gw0] [ 50%] PASSED tests/test_a.py::test_one \n[gw1] [100%] FAILED tests/test_a.py::test_two \n"
        "PASSED tests/test_a.py::test_one\nFAILED tests/test_a.py::test_two - assert 0\n"),
    "matplotlib_ids": (
        "PASSED lib/matplotlib/tests/test_backend_bases.py::test_interactive_zoom[MouseButton.LEFT]\n"
        "FAILED lib/matplotlib/tests/test_backend_bases.py::test_pan[MouseButton.RIGHT-x] - assert 0\n"),
    "seaborn_verbose": (
        "tests/test_core.py::TestHue::test_init PASSED [ 10%]\ntests/test_core.py::TestHue::test_bad FAILED [ 20%]\n"
        "PASSED tests/test_core.py::TestHue::test_other\nFAILED tests/test_core.py::TestHue::test_bad - assert\n"),
    "timed_out_mid_run": (
        "tests/test_a.py::test_one PASSED                                  [ 33%]\n"
        "tests/test_a.py::test_two \n+ timeout: the test command ran past 1800 s\n"),
    "django_log": (
        "test_ok (admin.tests.AdminTests) ... ok\ntest_fail (admin.tests.AdminTests) ... FAIL\n"
        "test_err (admin.tests.AdminTests) ... ERROR\ntest_skip (admin.tests.AdminTests) ... skipped 'no db'\n"
        "test_noisy (admin.tests.AdminTests) ... System check identified no issues (0 silenced).\nok\n"
        "======================================================================\n"
        "FAIL: test_fail (admin.tests.AdminTests)\nERROR: test_err (admin.tests.AdminTests)\n"),
    "sympy_log": (
        "sympy/core/tests/test_basic.py[3] test_a ok\ntest_b F\ntest_c E\ntest_d ok\n"
        "________________ sympy/core/tests/test_basic.py:test_b ________________\n"),
}


@pytest.fixture(scope="module")
def swebench_parsers():
    python = pytest.importorskip("swebench.harness.log_parsers.python",
                                 reason="swebench is not installed (pip install swebench==5.0.2)")
    return {ours: getattr(python, theirs) for ours, theirs in SWEBENCH_NAMES.items()}


def swebench_statuses(parse, log: str) -> dict[str, str]:
    """SWE-bench's result without entries whose "status" is a junk token like `ERROR:` (we drop those lines)."""
    return {test: status for test, status in parse(log, None).items() if status in STATUSES}


@pytest.mark.parametrize("name", sorted(REAL_RUNS))
def test_real_pytest_logs_parse_as_swebench_does(name, tmp_path, swebench_parsers):
    files, args = REAL_RUNS[name]
    write_suite(tmp_path / "tests", files)
    log = run_pytest(tmp_path, args)
    assert " in " in log.splitlines()[-1], log  # pytest's closing "N passed in 0.1s" line: the run completed
    for parser, theirs in swebench_parsers.items():
        assert parse_log(log, parser) == swebench_statuses(theirs, log), (parser, log)


@pytest.mark.parametrize("name", sorted(HAND_LOGS))
def test_hand_written_logs_parse_as_swebench_does(name, swebench_parsers):
    log = HAND_LOGS[name]
    for parser, theirs in swebench_parsers.items():
        assert parse_log(log, parser) == swebench_statuses(theirs, log), parser


def test_lines_that_only_start_with_a_status_are_dropped_not_given_a_junk_status(swebench_parsers):
    log = "ERROR:root:boom happened\nPASSED: tests/test_a.py::test_one\nPASSED tests/test_a.py::test_two\n"
    theirs = swebench_parsers["pytest"](log, None)
    assert theirs["happened"] == "ERROR:root:boom"  # SWE-bench's quirk, which a grader cannot act on
    assert parse_log(log) == swebench_statuses(swebench_parsers["pytest"], log)
    assert parse_log(log) == {"tests/test_a.py::test_two": "PASSED"}


def test_pytest_summary_statuses(tmp_path):
    write_suite(tmp_path / "tests", {"test_mix.py": MIXED, "test_bad.py": BAD_IMPORT})
    got = parse_log(run_pytest(tmp_path, ["--continue-on-collection-errors"]))
    mix = "tests/test_mix.py::"
    assert got[mix + "test_pass"] == "PASSED"
    assert got[mix + "test_fail"] == "FAILED"
    assert got[mix + "test_error"] == "ERROR"
    assert got[mix + "test_teardown"] == "ERROR"  # its PASSED line comes first, the teardown ERROR wins
    assert got[mix + "test_fail_and_teardown"] == "FAILED"
    assert got[mix + "test_xfail"] == "XFAIL"
    assert got[mix + "test_xpass_strict"] == "FAILED"
    assert mix + "test_xpass" not in got  # XPASS is not a status SWE-bench reads
    assert got["tests/test_bad.py"] == "ERROR"
    assert got[mix + "test_param[a"] == "PASSED"  # ids are cut at their first space
    assert got[mix + "test_param[c[d]]"] == "PASSED" and got[mix + "test_param[e::f]"] == "PASSED"
    assert got["tests/test_other.py::test_fake"] == "PASSED"  # printed text is believed: see report.py
    assert not any(key.startswith("[") for key in got)  # `SKIPPED [1] file:line` is not a test
    assert set(got.values()) <= set(STATUSES)


def test_pytest_options_keeps_the_last_part_of_a_path_parameter():
    got = parse_log(HAND_LOGS["swebench_eval_log"], "pytest_options")
    assert set(got) == {"tests/test_io.py::test_read[/data.fits]", "tests/test_io.py::test_write[//server/share]",
                        "tests/test_io.py::test_glob[/tmp/*.fits]", "tests/test_io.py::test_header"}


def test_pytest_v2_strips_colours_and_reads_old_verbose_lines():
    coloured = ("\x1b[32mPASSED\x1b[0m t.py::\x1b[1mtest_a[x y]\x1b[0m\n"
                "\x1b[31mFAILED\x1b[0m t.py::\x1b[1mtest_b\x1b[0m - assert 0\n"
                "\x1b[32mPASSED\x1b[0m t.py::\x1b[1mtest_c[5m]\x1b[0m\n")
    assert parse_log(coloured, "pytest") == {}
    assert parse_log(coloured, "pytest_v2") == {"t.py::test_a[x y]": "PASSED", "t.py::test_b": "FAILED",
                                                "t.py::test_c]": "PASSED"}  # `[5m` is taken for a colour code
    assert parse_log(HAND_LOGS["old_pytest_verbose"], "pytest_v2") == {
        "astropy/io/tests/test_a.py::test_one": "PASSED", "astropy/io/tests/test_a.py::test_two": "FAILED",
        "astropy/io/tests/test_a.py::test_three[a b]": "SKIPPED", "astropy/io/tests/test_a.py::test_four": "ERROR"}


def test_matplotlib_writes_mouse_buttons_as_numbers():
    assert parse_log(HAND_LOGS["matplotlib_ids"], "matplotlib") == {
        "lib/matplotlib/tests/test_backend_bases.py::test_interactive_zoom[1]": "PASSED",
        "lib/matplotlib/tests/test_backend_bases.py::test_pan[3-x]": "FAILED"}


def test_seaborn_reads_verbose_and_summary_lines():
    assert parse_log(HAND_LOGS["seaborn_verbose"], "seaborn") == {
        "tests/test_core.py::TestHue::test_init": "PASSED", "tests/test_core.py::TestHue::test_bad": "FAILED",
        "tests/test_core.py::TestHue::test_other": "PASSED"}


def test_django():
    got = parse_log(HAND_LOGS["django_log"], "django")
    assert got == {"test_ok (admin.tests.AdminTests)": "PASSED", "test_fail": "FAILED", "test_err": "ERROR",
                   "test_fail (admin.tests.AdminTests)": "FAILED", "test_err (admin.tests.AdminTests)": "ERROR",
                   "test_skip (admin.tests.AdminTests)": "SKIPPED", "test_noisy (admin.tests.AdminTests)": "PASSED"}
    # A line starting with "ok" passes the last test that printed " ... ", even one that failed.
    assert parse_log("test_x (m.T) ... FAIL\nok, moving on\n", "django") == {"test_x (m.T)": "PASSED"}
    assert parse_log("FAIL:\n", "django") == {}


def test_sympy():
    assert parse_log(HAND_LOGS["sympy_log"], "sympy") == {
        "sympy/core/tests/test_basic.py:test_b": "FAILED", "test_b": "FAILED", "test_c": "ERROR", "test_d": "PASSED"}


UNITTEST_SUITE = '''
import unittest

class T(unittest.TestCase):
    def test_a(self): pass
    def test_b(self): self.assertEqual(1, 2)
    def test_c(self): raise ValueError("x")
    @unittest.skip("why not")
    def test_d(self): pass
    @unittest.expectedFailure
    def test_e(self): self.fail()
    @unittest.expectedFailure
    def test_f(self): pass
    def test_g(self):
        """A docstring ... of sorts."""
    def test_h(self):
        print("printed ... output")
    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)

class U(unittest.TestCase):
    @classmethod
    def setUpClass(cls): raise RuntimeError("class setup")
    def test_z(self): pass
'''


def test_unittest_on_a_real_verbose_run(tmp_path):
    write_suite(tmp_path / "pkg", {"__init__.py": "", "test_u.py": UNITTEST_SUITE})
    log = subprocess.run([sys.executable, "-m", "unittest", "-v", "pkg.test_u"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60).stderr
    t = "pkg.test_u.T."
    assert parse_log(log, "unittest") == {
        t + "test_a": "PASSED", t + "test_b": "FAILED", t + "test_c": "ERROR", t + "test_d": "SKIPPED",
        t + "test_e": "XFAIL", t + "test_f": "FAILED", t + "test_g": "PASSED", t + "test_h": "PASSED",
        t + "test_sub": "FAILED", "pkg.test_u.U.setUpClass": "ERROR"}


def test_unittest_before_python_3_11_names_the_class_only():
    log = "test_a (pkg.mod.T) ... ok\ntest_b (pkg.mod.T) ... FAIL\n\nFAIL: test_b (pkg.mod.T)\n"
    assert parse_log(log, "unittest") == {"pkg.mod.T.test_a": "PASSED", "pkg.mod.T.test_b": "FAILED"}


def test_every_parser_returns_only_known_statuses():
    for name, log in HAND_LOGS.items():
        for parser in PARSERS:
            assert set(parse_log(log, parser).values()) <= set(STATUSES), (name, parser)


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError) as err:
        parse_log("PASSED a.py::b", "nose")
    for name in ("pytest", "pytest_v2", "pytest_options", "django", "sympy", "matplotlib", "seaborn", "unittest"):
        assert name in str(err.value)
