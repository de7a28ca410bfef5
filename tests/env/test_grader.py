"""The grader on a real task in real sandboxes: the gold fix resolves, and no trick does."""

import pytest

from patchgym.env.grading.grader import grade_patch
from patchgym.env.grading.owned import CONFIG_NAMES, grader_owns
from patchgym.sandbox import SandboxConfig, open_sandbox


@pytest.fixture
def grade(backend, tiny_task):
    config = SandboxConfig(backend=backend, memory_mb=1024)
    return lambda patch, **kw: grade_patch(tiny_task, patch, config, timeout=120, **kw)


def test_gold_patch_resolves(grade, tiny_task):
    g = grade(tiny_task.patch)
    assert g.resolved and g.error is None, g
    assert g.f2p == {"tests/test_add.py::test_add": "PASSED"}
    assert g.p2p == {"tests/test_sub.py::test_sub": "PASSED"}
    assert g.exit_code == 1, "the inverse canary the grader planted fails on purpose"
    assert set(g.tests) == {"tests/test_add.py::test_add", "tests/test_sub.py::test_sub"}, "canaries are left out"


def test_empty_patch_is_an_honest_failure(grade):
    g = grade("")
    assert not g.resolved and g.error is None
    assert g.f2p == {"tests/test_add.py::test_add": "FAILED"}
    assert g.exit_code == 1


def test_patch_that_does_not_apply_is_an_apply_error(grade, make_diff):
    g = grade(make_diff({"calc/ops.py": "something else\n"}, {"calc/ops.py": "changed\n"}))
    assert not g.resolved and g.error == "apply_failed"
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

# Appended to the package's own __init__.py, which the tests import: it runs in pytest's process, after the report
# plugin loaded, and forges every failed report into a pass.
FORGE_REPORTS = '''
import _pytest.reports

_made = _pytest.reports.TestReport.from_item_and_call.__func__


def _forged(cls, item, call):
    report = _made(cls, item, call)
    if report.outcome == "failed":
        report.outcome, report.longrepr = "passed", None
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_forged)
'''
# The same forgery through a hook: the package registers a plugin of its own while the tests are collected.
REGISTER_PLUGIN = '''
import gc

import _pytest.config

for _config in [o for o in gc.get_objects() if isinstance(o, _pytest.config.Config)]:
    _config.pluginmanager.register(__import__("calc.forge").forge, "calc-forge")
'''


@pytest.mark.parametrize("trick", TRICKS)
def test_tricks_do_not_resolve(grade, make_diff, tiny_sources, trick):
    before, after = adversarial(*tiny_sources)[trick]
    g = grade(make_diff(before, after))
    assert not g.resolved, f"{trick}: {g}"
    assert g.f2p.get("tests/test_add.py::test_add") in (None, "FAILED", "ERROR"), g


@pytest.fixture
def grade_init(grade, make_diff, tiny_sources):
    """Grade a patch that appends `code` to the package's own calc/__init__.py (and adds `files`)."""
    init = tiny_sources[0]["calc/__init__.py"]
    return lambda code, files={}: grade(make_diff({"calc/__init__.py": init},
                                                  {"calc/__init__.py": init + code, **files}))


def test_code_that_forges_reports_in_process_is_tampered(grade_init):
    g = grade_init(FORGE_REPORTS)
    assert not g.resolved and g.error == "tampered", g
    assert "from_item_and_call" in g.error_detail and g.outcome == "tampered" and g.reward == 0


def test_code_that_registers_a_report_hook_is_tampered(grade_init):
    g = grade_init(REGISTER_PLUGIN, {"calc/forge.py": FORCE_PASS_CONFTEST})
    assert not g.resolved and g.error == "tampered", g
    assert "pytest_runtest_makereport" in g.error_detail


def test_a_run_cut_short_after_forged_reports_is_tampered(grade_init):
    # Leaves before pytest's end, so the closing check that would see the forgery never runs.
    leave = "import os\nimport _pytest.config\n_pytest.config.Config._ensure_unconfigure = lambda self: os._exit(0)\n"
    g = grade_init(FORGE_REPORTS + leave)
    assert not g.resolved and g.error == "tampered", g
    assert "closing check" in g.error_detail


def test_lines_written_into_the_report_by_the_code_under_test_are_tampered(grade_init):
    """The report channel is the tests' process's to write to: a copy of its descriptor, kept past pytest's end,
    adds lines after the plugin's closing one."""
    forged = '{"nodeid": "tests/test_add.py::test_add", "when": "call", "outcome": "passed"}'
    append = ("import atexit, os\n\n_fd = os.dup(3)\n\n\ndef _append():\n"
              f"    os.write(_fd, ({forged!r} + '\\n').encode())\n\n\natexit.register(_append)\n")
    g = grade_init(append)
    assert not g.resolved and g.error == "tampered", g
    assert "after its closing line" in g.error_detail


# Tricks for the factory's tasks, whose source directory is on sys.path from the start (a .pth in the image), so
# pytest finds distributions and modules in the workspace before any test runs.
def factory_tricks(src: str) -> dict[str, dict[str, str]]:
    plugin = {f"{src}/forge_passes.py": FORCE_PASS_CONFTEST}
    return {
        "registers a pytest11 entry point": {
            **plugin, f"{src}/forge_passes-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: forge-passes\n"
                                                                   "Version: 1.0\n",
            f"{src}/forge_passes-1.0.dist-info/entry_points.txt": "[pytest11]\nforge_passes = forge_passes\n"},
        "registers it through an egg-info": {
            **plugin, f"{src}/forge_passes.egg-info/PKG-INFO": "Metadata-Version: 1.1\nName: forge-passes\n"
                                                              "Version: 1.0\n",
            f"{src}/forge_passes.egg-info/entry_points.txt": "[pytest11]\nforge_passes = forge_passes\n"},
        "loads it from a pytest.toml": {**plugin, "pytest.toml": '[pytest]\naddopts = ["-p", "forge_passes"]\n'},
        "loads it from a .pytest.ini": {**plugin, ".pytest.ini": "[pytest]\naddopts = -p forge_passes\n"},
        "loads it from a .pytest.toml": {**plugin, ".pytest.toml": '[pytest]\naddopts = ["-p", "forge_passes"]\n'},
    }


@pytest.fixture(scope="module")
def factory_task(ci_tasks):
    """A factory task whose gold patch fixes a FAIL_TO_PASS test, and where its source directory is."""
    task = ci_tasks[0]
    return task, task.patch.split("\n", 1)[0].split(" b/", 1)[1].split("/", 1)[0]


def test_factory_gold_patch_resolves_with_autoload_off(backend, factory_task):
    task, _ = factory_task
    g = grade_patch(task, task.patch, SandboxConfig(backend=backend, memory_mb=1024), timeout=300)
    assert g.resolved and g.error is None, g


@pytest.mark.parametrize("trick", list(factory_tricks("src")))
def test_factory_tricks_do_not_resolve(backend, factory_task, make_diff, trick):
    task, src = factory_task
    g = grade_patch(task, make_diff({}, factory_tricks(src)[trick]), SandboxConfig(backend=backend, memory_mb=1024),
                    timeout=300)
    assert not g.resolved, f"{trick}: {g}"
    assert all(s != "PASSED" for s in g.f2p.values()), g


def test_grader_owns_test_config_and_packaging_metadata_but_not_source(tiny_task):
    owned = ["pytest.toml", "src/.pytest.toml", ".pytest.ini", "sub/setup.cfg", "conftest.py", "x.pth",
             "src/evil-1.0.dist-info/entry_points.txt", "src/Evil.EGG-INFO/entry_points.txt", "src/evil.egg-info",
             "evil.egg-link", "tests/helpers.py", "tests/test_add.py"]
    assert [p for p in owned if not grader_owns(p, tiny_task)] == []
    assert [p for p in ["calc/__init__.py", "calc/ops.py", "src/dist_info.py", "setup.py", "README.md"]
            if grader_owns(p, tiny_task)] == []


def test_an_imported_row_keeps_the_ignored_metadata_its_image_had(backend, tiny_task, tiny_sources, make_diff):
    """An editable install's `*.egg-info` is ignored by git: the grader owns it, and must neither drop it as new
    nor let the patch change it."""
    clean, buggy_ops = tiny_sources
    meta = "tests/test_meta.py"
    pkg_info = "Metadata-Version: 1.1\nName: calc\nVersion: 1.0\n"
    repo = {**clean, "calc/ops.py": buggy_ops, ".gitignore": "*.egg-info/\n",
            meta: "import importlib.metadata\n\n\ndef test_meta():\n"
                  "    assert importlib.metadata.version('calc') == '1.0'\n"}
    install = make_diff({}, {"calc.egg-info/PKG-INFO": pkg_info})  # made apart: git would leave it out of `repo`
    task = tiny_task.model_copy(update={
        "bug_patch": make_diff({}, repo) + install, "PASS_TO_PASS": [*tiny_task.PASS_TO_PASS, f"{meta}::test_meta"],
        "log_parser": "pytest", "test_cmd": "python -m pytest -rA -p no:cacheprovider tests"})
    config = SandboxConfig(backend=backend, memory_mb=1024)
    g = grade_patch(task, task.patch, config, timeout=120)
    assert g.resolved, g
    bump = make_diff({"calc.egg-info/PKG-INFO": pkg_info}, {"calc.egg-info/PKG-INFO": pkg_info.replace("1.0", "2.0")})
    g = grade_patch(task, task.patch + bump, config, timeout=120)
    assert g.resolved, f"the grader's own copy of the egg-info must be used: {g}"


def test_grader_owns_every_config_file_the_sandbox_pytest_reads(backend, base_image):
    with open_sandbox(SandboxConfig(backend=backend), image=base_image) as sb:
        names = sb.exec(["python", "-c", "from _pytest.config.findpaths import CONFIG_LOADERS_BY_NAME as n; "
                                         "print(' '.join(n))"]).output.split()
    assert names and set(names) <= CONFIG_NAMES, names


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
