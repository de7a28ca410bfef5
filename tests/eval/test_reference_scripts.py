"""End to end through the rollout engine, tools and grader: the oracle resolves every task, the null script none.

On docker only: nothing here depends on the backend (the grader's contract on each backend is
tests/env/test_grader.py's, the environment's tests/env/test_swe_env.py's)."""

import json

import pytest
from typer.testing import CliRunner

from patchgym.agent.scripts import NullScript, OracleScript
from patchgym.cli import app
from patchgym.eval.run import evaluate
from patchgym.rollout import RolloutConfig, ScriptedAgent
from patchgym.sandbox import SandboxConfig
from patchgym.tasks import write_tasks

GRADE_ALL = RolloutConfig(grade_empty_patches=True)  # so null's unchanged repo really runs the tests and fails

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)


def test_oracle_resolves_and_null_does_not(backend, tiny_task, tmp_path):
    config = SandboxConfig(backend=backend)
    oracle = evaluate([tiny_task], ScriptedAgent(OracleScript()), config, tmp_path / "oracle", progress=False)
    null = evaluate([tiny_task], ScriptedAgent(NullScript()), config, tmp_path / "null", rollout=GRADE_ALL,
                    progress=False)
    assert oracle["resolve_rate"] == 1.0 and oracle["by_termination"]["submitted"]["count"] == 1
    assert null["resolve_rate"] == 0.0 and null["infra_errors"] == 0 and null["grading_errors"] == 0
    record = json.loads((tmp_path / "oracle" / "trajectories.jsonl").read_text())
    assert record["grade"]["resolved"] and "+    return left_operand + right_operand" in record["patch"]
    assert record["trajectory_id"] == f"{tiny_task.instance_id}#0" and len(record["turns"]) == 2
    null_record = json.loads((tmp_path / "null" / "trajectories.jsonl").read_text())
    assert null_record["grade"]["f2p"] == {"tests/test_add.py::test_add": "FAILED"}


def test_eval_command_ends_with_a_json_summary(backend, tiny_task, tmp_path):
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    result = CliRunner().invoke(app, ["eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "oracle",
                                      "--out", str(tmp_path / "run"), "--json", f"sandbox.backend={backend}"])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout.strip().splitlines()[-1])["pass@1"] == 1.0
    assert (tmp_path / "run" / "config.yaml").exists()
    preds = [json.loads(line) for line in (tmp_path / "run" / "preds.jsonl").read_text().splitlines()]
    assert preds == [{"instance_id": tiny_task.instance_id, "model_name_or_path": "patchgym/oracle",
                      "model_patch": preds[0]["model_patch"]}] and "left_operand +" in preds[0]["model_patch"]
