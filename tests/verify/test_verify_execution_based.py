"""The execution-based verifier on the real tiny task in containers: the gold patch gets more passes than an empty
one, a patch that edits the tests to pass them gets them put back, reproduction tests that pass on the unpatched
repository (or fail on every candidate) are discarded, and a dead sandbox is an infra error, not a crash."""

import pytest

from patchgym.sandbox import Sandbox, SandboxConfig, SandboxError
from patchgym.verify.config import VerifierConfig
from patchgym.verify.execution_based import changed_modules, check_candidates

REPRO = [
    "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\n",  # reproduces the issue: kept
    "from calc import sub\n\nassert sub(5, 3) == 2\n",  # passes on the unpatched repository: discarded
    "raise SystemExit('never passes')\n",  # fails on every candidate: discarded
]


class DeadSandbox(Sandbox):
    """A backend whose engine is gone: every start fails."""

    def __init__(self, config=None, *, image=None, labels=None):
        raise SandboxError("the container engine stopped answering")


def test_changed_modules(tiny_task):
    patch = ("--- a/src/pkg/mod.py\n+++ b/src/pkg/mod.py\n@@\n--- a/pkg/__init__.py\t2024-01-01\n"
             "+++ b/pkg/__init__.py\t2024-01-01\n--- a/tests/test_mod.py\n+++ b/tests/test_mod.py\n"
             "--- a/README.md\n+++ b/README.md\n--- /dev/null\n+++ b/pkg/new.py\n")
    assert changed_modules(patch, tiny_task) == ["pkg", "pkg.mod", "pkg.new"]
    assert changed_modules(tiny_task.patch, tiny_task) == ["calc.ops"]


def test_gold_beats_empty_and_useless_repro_tests_are_discarded(backend, tiny_task, tiny_sources, make_diff):
    if backend != "docker":
        pytest.skip("the checks are backend-agnostic sandbox calls; one backend is enough")
    clean, buggy = tiny_sources
    cheat = make_diff({"calc/ops.py": buggy, "tests/test_sub.py": clean["tests/test_sub.py"]},
                      {"calc/ops.py": buggy.replace("return a - b", "return a + b"),
                       "tests/test_sub.py": "def test_sub():\n    assert True\n"})
    candidates = {"run/gold": tiny_task.patch, "run/empty": "", "run/cheat": cheat, "run/garbage": "not a diff\n"}
    checks = check_candidates({tiny_task.instance_id: tiny_task}, {tiny_task.instance_id: candidates},
                              {tiny_task.instance_id: REPRO}, VerifierConfig(max_sandboxes=2),
                              SandboxConfig(backend=backend))[tiny_task.instance_id]
    assert checks.error is None
    # calc.ops is named by no test; tests reach it through `from calc import ...`. The hidden test never counts.
    assert checks.regression_files == ["tests/test_sub.py"]
    assert checks.baseline == {0: False, 1: True, 2: False}
    assert checks.kept == [0]
    gold, empty, cheat, garbage = (checks.candidates[k] for k in candidates)
    assert (gold.regression_passed, gold.regression_total, gold.repro_passed) == (1, 1, 1)
    assert (empty.regression_passed, empty.repro_passed) == (1, 0)
    assert gold.repro == {0: True, 1: True, 2: False} and empty.repro == {0: False, 1: True, 2: False}
    assert (cheat.regression_passed, cheat.regression_total, cheat.repro_passed) == (0, 1, 0)  # its test edit undone
    assert garbage.error == "apply" and (garbage.regression_passed, garbage.repro_passed) == (0, 0)
    assert gold.regression_passed + gold.repro_passed > empty.regression_passed + empty.repro_passed


def test_a_dead_sandbox_is_an_infra_error_per_candidate(tiny_task):
    config = SandboxConfig(backend=f"{__name__}:DeadSandbox")
    checks = check_candidates({tiny_task.instance_id: tiny_task},
                              {tiny_task.instance_id: {"run/a": tiny_task.patch, "run/b": ""}},
                              {tiny_task.instance_id: REPRO}, VerifierConfig(retries=1), config)[tiny_task.instance_id]
    assert "stopped answering" in checks.error and checks.kept == []
    for check in checks.candidates.values():
        assert check.error == "infra" and "stopped answering" in check.error_detail
        assert check.regression_passed is None and check.repro_passed is None
