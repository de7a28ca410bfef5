"""`patchgym grade` on a real task: one JSON object with the verdict per test."""

import json

from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.tasks import write_tasks


def test_grade_command_prints_the_verdict_as_json(backend, tiny_task, tmp_path):
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    (tmp_path / "fix.diff").write_text(tiny_task.patch)
    (tmp_path / "none.diff").write_text("")
    args = ["grade", "--tasks", str(tmp_path / "tasks.jsonl"), "--instance", tiny_task.instance_id, "--json",
            f"sandbox.backend={backend}"]
    fixed = CliRunner().invoke(app, [*args, "--patch", str(tmp_path / "fix.diff")])
    assert fixed.exit_code == 0, fixed.stdout
    verdict = json.loads(fixed.stdout.strip().splitlines()[-1])
    assert verdict["resolved"] is True and verdict["error"] is None
    assert set(verdict) >= {"instance_id", "resolved", "tests", "f2p", "p2p", "error"}
    unfixed = json.loads(CliRunner().invoke(app, [*args, "--patch", str(tmp_path / "none.diff")]).stdout.splitlines()[-1])
    assert unfixed["resolved"] is False and unfixed["f2p"] == {"tests/test_add.py::test_add": "FAILED"}


def test_grade_command_names_a_missing_instance(tiny_task, tmp_path):
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    result = CliRunner().invoke(app, ["grade", "--tasks", str(tmp_path / "tasks.jsonl"), "--instance", "nope",
                                      "--patch", "-"], input="")
    assert result.exit_code == 2 and "no task 'nope'" in result.stdout
