"""A tiny real task on the base image: the bug patch creates a small package with a bug and its tests."""

import subprocess
import textwrap
from pathlib import Path

import pytest

from patchgym.tasks import Task

CLEAN = {
    "calc/__init__.py": "from calc.ops import add, sub\n",
    "calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "tests/__init__.py": "",  # so pytest puts /testbed (not tests/) on sys.path and `import calc` works
    "tests/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n",
}
BUGGY_OPS = CLEAN["calc/ops.py"].replace("return a + b", "return a - b")


def _diff(tmp: Path, before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style diff from `before` to `after` (both {path: text}), made by git itself."""
    repo = tmp / f"diff-{len(list(tmp.iterdir()))}"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout
    run("init", "-q")
    for path, text in before.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    run("add", "-A")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "before", "--allow-empty")
    for path in before:
        (repo / path).unlink()
    for path, text in after.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    run("add", "-A")
    return run("diff", "--cached", "--binary", "HEAD")


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory) -> Task:
    tmp = tmp_path_factory.mktemp("tiny-task")
    buggy = {**CLEAN, "calc/ops.py": BUGGY_OPS}
    return Task(
        instance_id="tiny-calc.flip_op.0001",
        repo="tiny-calc",
        problem_statement=textwrap.dedent("""\
            Calling calc.add(2, 3) returns -1, but 5 was expected."""),
        FAIL_TO_PASS=["tests/test_add.py::test_add"],
        PASS_TO_PASS=["tests/test_sub.py::test_sub"],
        bug_patch=_diff(tmp, {}, buggy),
        patch=_diff(tmp, {"calc/ops.py": BUGGY_OPS}, {"calc/ops.py": CLEAN["calc/ops.py"]}),
        test_files=["tests/test_add.py"],
        test_cmd="python -m pytest -p no:cacheprovider tests",
        log_parser="patchgym_report",
        source="test",
    )


@pytest.fixture(scope="session")
def make_diff(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diffs")
    return lambda before, after: _diff(tmp, before, after)


@pytest.fixture(scope="session")
def tiny_sources() -> tuple[dict[str, str], str]:
    """The clean files of the tiny task and its buggy calc/ops.py."""
    return CLEAN, BUGGY_OPS
