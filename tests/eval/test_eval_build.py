"""Eval's setup: its defaults come from patchgym/eval/defaults.yaml (and yield to files and overrides), and
`patchgym eval` hands the config to run_eval, which builds the agent and the run directory."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from patchgym.agent.config import AgentConfig
from patchgym.cli import app
from patchgym.eval import build
from patchgym.eval.build import EVAL_DEFAULTS, load_eval_config
from patchgym.rollout import ScriptedAgent
from patchgym.tasks import write_tasks


def test_eval_defaults_are_in_the_file_and_yield_to_files_and_overrides(tmp_path):
    assert yaml.safe_load(EVAL_DEFAULTS.read_text()) == {"agent": {"max_steps": 100}}
    assert AgentConfig().max_steps == 50  # training's, from configs/default.yaml
    assert load_eval_config().agent.max_steps == 100
    assert load_eval_config(overrides=["agent.max_steps=7"]).agent.max_steps == 7
    mine = tmp_path / "mine.yaml"
    mine.write_text("agent:\n  max_steps: 50\n  max_format_errors: 2\n")
    config = load_eval_config([mine])
    assert config.agent.max_steps == 50 and config.agent.max_format_errors == 2


@pytest.fixture
def evaluated(monkeypatch):
    """Stands in for the rollouts: records what run_eval built and returns a summary."""
    seen = {}

    def evaluate(tasks, agent, sandbox, out, **kwargs):
        seen.update(tasks=tasks, agent=agent, out=out, **kwargs)
        return {"model": kwargs["model_name"], "pass@1": 1.0}

    monkeypatch.setattr(build, "evaluate", evaluate)
    return seen


def test_the_eval_command_runs_with_eval_defaults_unless_overridden(evaluated, tiny_task, tmp_path):
    write_tasks([tiny_task], tmp_path / "tasks.jsonl")
    command = ["eval", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "oracle", "--json"]
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout.splitlines()[-1]) == {"model": "oracle", "pass@1": 1.0}
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["agent"]["max_steps"] == 100
    assert isinstance(evaluated["agent"], ScriptedAgent) and evaluated["tasks"] == [tiny_task]
    assert evaluated["tasks_file"] == (tmp_path / "tasks.jsonl").resolve()

    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "b"), "agent.max_steps=7"])
    assert result.exit_code == 0, result.stdout
    assert yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["agent"]["max_steps"] == 7
    assert evaluated["agent"].config.max_steps == 7  # the agent plays with the config it wrote


def test_an_unknown_policy_is_refused_before_anything_runs(evaluated, tmp_path):
    result = CliRunner().invoke(app, ["eval", "--tasks", str(tmp_path / "none.jsonl"), "--policy", "gold",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "unknown policy 'gold'; choose one of oracle, null" in result.stdout
    assert not evaluated and not (tmp_path / "run").exists()
