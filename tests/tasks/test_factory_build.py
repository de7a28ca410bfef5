"""The task factory for real: two small packages, three tasks each, built in sandboxes and checked the way an
agent's workspace and the grader will use them; a rerun resumes from what is saved."""

import shlex

import pytest

from patchgym import paths
from patchgym.env.grading import report
from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.tasks import read_tasks
from patchgym.tasks.factory.build import build_tasks
from patchgym.tasks.factory.pypi.sources import load_recipes
from patchgym.tasks.factory.sources import WORKDIR

PACKAGES = ["cachetools", "isodate"]  # the CI set of tests/conftest.py
PER_PACKAGE = 3


@pytest.fixture(scope="module")
def built(backend, ci_tasks):
    """The shared CI set's directory (see tests/conftest.py); building into it again resumes, so this is cheap."""
    out = paths.store_dir() / "factory-ci" / backend
    summary = build_tasks(PACKAGES, PER_PACKAGE, seed=0, out_dir=out, backend=backend, progress=False)
    return backend, out, summary


def _run(sandbox, cmd: str) -> None:
    result = sandbox.exec(cmd, cwd=WORKDIR, timeout=120)
    assert result.ok, f"$ {cmd}\n{result.output[-3000:]}"


def _statuses(sandbox, task, tests: list[str]) -> dict[str, str]:
    recipe = load_recipes()[task.repo]
    command = report.pytest_command(f"{recipe.test_cmd(tests)} -q --tb=no", report.install_report_plugin(sandbox),
                                    plugins=None)
    return report.read_report(report.run_reported(sandbox, command, WORKDIR, recipe.timeout))


def test_build_makes_the_tasks_asked_for(built):
    _, out, summary = built
    tasks = read_tasks(out / "tasks.jsonl")
    assert summary.tasks == len(tasks) == PER_PACKAGE * len(PACKAGES)
    for name in PACKAGES:
        stats = summary.packages[name]
        assert stats["kept"] == PER_PACKAGE, stats
        assert stats["tried"] == stats["kept"] + sum(stats["dropped"].values())
    for task in tasks:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert task.instance_id.startswith(f"{task.repo}-{task.version}.{task.strategy}.")
        assert task.source == "factory" and task.log_parser == "patchgym_report"
        assert task.image.startswith(f"patchgym/pkg-{task.repo}-{task.version}:")
        assert task.test_files == sorted({t.split("::")[0] for t in task.FAIL_TO_PASS})
    assert len({t.instance_id for t in tasks}) == len(tasks)


def test_statements_name_neither_tests_nor_the_bug(built):
    _, out, _ = built
    for task in read_tasks(out / "tasks.jsonl"):
        statement = task.problem_statement
        changed_file = task.bug_patch.split("\n", 1)[0].split(" b/")[-1]
        assert changed_file not in statement and "/testbed" not in statement
        for test in task.FAIL_TO_PASS:
            path, _, rest = test.partition("::")
            assert path not in statement
            for name in rest.split("::"):
                assert name.split("[")[0] not in statement, (name, statement)


def test_bug_fails_the_tests_and_the_fix_passes_them(built):
    backend, out, _ = built
    for task in read_tasks(out / "tasks.jsonl"):
        with open_sandbox(SandboxConfig(backend=backend), image=task.image) as sandbox:
            # The agent's view: the bug in, the hidden test files gone.
            sandbox.write_file("/tmp/bug.diff", task.bug_patch)
            _run(sandbox, "git apply /tmp/bug.diff && rm -f -- " + " ".join(map(shlex.quote, task.test_files)))
            # The grader's: the tests put back from nothing by test_patch.
            sandbox.write_file("/tmp/tests.diff", task.test_patch)
            _run(sandbox, "git apply /tmp/tests.diff")
            buggy = _statuses(sandbox, task, task.FAIL_TO_PASS)
            assert all(buggy.get(t) != "PASSED" for t in task.FAIL_TO_PASS), (task.instance_id, buggy)
            sandbox.write_file("/tmp/fix.diff", task.patch)
            _run(sandbox, "git apply /tmp/fix.diff")
            fixed = _statuses(sandbox, task, [])
            assert all(fixed.get(t) == "PASSED" for t in task.FAIL_TO_PASS + task.PASS_TO_PASS), task.instance_id


def test_rerun_resumes_and_gives_the_same_tasks(built):
    backend, out, _ = built
    before = (out / "tasks.jsonl").read_text()
    summary = build_tasks(PACKAGES, PER_PACKAGE, seed=0, out_dir=out, backend=backend, progress=False)
    assert (out / "tasks.jsonl").read_text() == before
    assert all(stats["seconds"] < 30 for stats in summary.packages.values()), summary
