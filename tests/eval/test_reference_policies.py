"""End to end through tools and grader: the oracle resolves every task, the null policy none."""

import json

from typer.testing import CliRunner

from patchgym.agent.reference import NullPolicy, OraclePolicy
from patchgym.cli import app
from patchgym.eval.run import evaluate
from patchgym.sandbox import SandboxConfig
from patchgym.tasks import write_tasks


def test_oracle_resolves_and_null_does_not(backend, tiny_task, tmp_path):
    config = SandboxConfig(backend=backend)
    oracle = evaluate([tiny_task], OraclePolicy(), config, tmp_path / "oracle", progress=False)
    null = evaluate([tiny_task], NullPolicy(), config, tmp_path / "null", progress=False)
    assert oracle["resolve_rate"] == 1.0 and oracle["by_termination"] == {"submitted": 1}
    assert null["resolve_rate"] == 0.0 and null["infra_errors"] == 0 and null["grading_errors"] == 0
    result = json.loads((tmp_path / "oracle" / "results.jsonl").read_text())
    assert result["resolved"] and "+    return left_operand + right_operand" in result["patch"] and result["steps"] == 2


def test_eval_command_ends_with_a_json_summary(backend, tiny_task, tmp_path):
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    result = CliRunner().invoke(app, ["eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "oracle",
                                      "--out", str(tmp_path / "run"), "--json", f"sandbox.backend={backend}"])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout.strip().splitlines()[-1])["resolve_rate"] == 1.0
    assert (tmp_path / "run" / "config.yaml").exists()
