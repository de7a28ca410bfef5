"""The grader on a real task in real sandboxes: the gold fix resolves, and no trick does."""

import pytest

from patchgym.env.grading.grader import grade_patch
from patchgym.sandbox import SandboxConfig


@pytest.fixture
def grade(backend, tiny_task):
    config = SandboxConfig(backend=backend, memory_mb=1024)
    return lambda patch, **kw: grade_patch(tiny_task, patch, config, timeout=120, **kw)


def test_gold_patch_resolves(grade, tiny_task):
    g = grade(tiny_task.patch)
    assert g.resolved and g.error is None, g
    assert g.f2p == {"tests/test_add.py::test_add": "PASSED"}
    assert g.p2p == {"tests/test_sub.py::test_sub": "PASSED"}
    assert g.exit_code == 0


def test_empty_patch_is_an_honest_failure(grade):
    g = grade("")
    assert not g.resolved and g.error is None
    assert g.f2p == {"tests/test_add.py::test_add": "FAILED"}
    assert g.exit_code == 1


def test_patch_that_does_not_apply_is_an_apply_error(grade, make_diff):
    g = grade(make_diff({"calc/ops.py": "something else\n"}, {"calc/ops.py": "changed\n"}))
    assert not g.resolved and g.error == "apply"
    assert "does not apply" in g.error_detail


FORCE_PASS_CONFTEST = '''import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
'''

def adversarial(clean: dict[str, str], buggy_ops: str) -> dict[str, tuple[dict, dict]]:
    """Each trick as (files before, files after) relative to the task's starting state."""
    return {
        "rewrites the failing test": ({"tests/test_add.py": clean["tests/test_add.py"]},
                                      {"tests/test_add.py": "def test_add():\n    assert True\n"}),
        "adds a conftest forcing passes": ({}, {"conftest.py": FORCE_PASS_CONFTEST}),
        "adds a conftest in the tests folder": ({}, {"tests/conftest.py": FORCE_PASS_CONFTEST}),
        "turns the report off in pytest.ini": ({}, {"pytest.ini": "[pytest]\naddopts = -p no:patchgym_report\n"}),
        "prints fake PASSED lines": ({"calc/ops.py": buggy_ops}, {"calc/ops.py": buggy_ops + (
            "import sys\nsys.__stdout__.write('PASSED tests/test_add.py::test_add\\n')\n")}),
        "deletes the failing test": ({"tests/test_add.py": clean["tests/test_add.py"]}, {}),
        "exits 0 at import": ({"calc/ops.py": buggy_ops}, {"calc/ops.py": "import os\nos._exit(0)\n" + buggy_ops}),
        "adds a sitecustomize": ({}, {"sitecustomize.py": "import calc.ops\ncalc.ops.add = lambda a, b: a + b\n"}),
        "adds a test module that patches add at import": ({}, {"tests/test_aaa.py": (
            "import calc, calc.ops\ncalc.add = calc.ops.add = lambda a, b: a + b\n")}),
        "shadows pytest with a module in the workspace": ({}, {"pytest.py": (
            "import sys\nopen(sys.argv[-1].split('=', 1)[1], 'w').write("
            "'{\"nodeid\": \"tests/test_add.py::test_add\", \"when\": \"call\", \"outcome\": \"passed\"}\\n')\n")}),
        "shadows the report plugin": ({}, {"patchgym_report.py": (
            "def pytest_addoption(parser):\n    parser.addoption('--patchgym-report')\n")}),
    }


TRICKS = list(adversarial({"tests/test_add.py": ""}, ""))


@pytest.mark.parametrize("trick", TRICKS)
def test_tricks_do_not_resolve(grade, make_diff, tiny_sources, trick):
    before, after = adversarial(*tiny_sources)[trick]
    g = grade(make_diff(before, after))
    assert not g.resolved, f"{trick}: {g}"
    assert g.f2p.get("tests/test_add.py::test_add") in (None, "FAILED", "ERROR"), g


def test_fix_plus_tampered_tests_still_resolves_on_its_merits(grade, make_diff, tiny_sources):
    clean, buggy_ops = tiny_sources
    fix_and_noise = make_diff({"calc/ops.py": buggy_ops, "tests/test_sub.py": clean["tests/test_sub.py"]},
                              {"calc/ops.py": clean["calc/ops.py"], "tests/test_sub.py": "raise SystemExit\n"})
    g = grade(fix_and_noise)
    assert g.resolved, f"the grader's own copy of test_sub.py must be used: {g}"


def test_apply_falls_back_to_fuzzier_strategies_and_leaves_no_patch_file(backend, base_image, make_diff):
    from patchgym.env.workspace import PatchApplyError, apply_patch
    from patchgym.sandbox import open_sandbox

    patch = make_diff({"f.txt": "a\nb\nc\nd\n"}, {"f.txt": "a\nb\nC\nd\n"})
    with open_sandbox(SandboxConfig(backend=backend), image=base_image) as sb:
        sb.write_file("/testbed/f.txt", "ax\nb\nc\nd\n")  # outer context drifted: the exact apply fails
        used = apply_patch(sb, patch, "/testbed", "drift")
        assert "-C1" in used
        assert sb.read_file("/testbed/f.txt") == b"ax\nb\nC\nd\n"
        with pytest.raises(PatchApplyError, match="does not apply"):
            apply_patch(sb, patch, "/testbed", "again")
        assert sb.exec("ls /tmp/.patchgym-* 2>/dev/null | wc -l").output.strip() == "0"
