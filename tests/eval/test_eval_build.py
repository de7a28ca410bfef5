"""Eval's setup: `patchgym eval` hands the config to run_eval, which builds the agent and the run directory."""

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.eval import build


@pytest.fixture
def evaluated(monkeypatch):
    """Stands in for the rollouts: records what run_eval built and returns a summary."""
    seen = {}

    def evaluate(tasks, agent, sandbox, out, **kwargs):
        seen.update(tasks=tasks, agent=agent, out=out, **kwargs)
        return {"model": kwargs["model_name"], "pass@1": 1.0}

    monkeypatch.setattr(build, "evaluate", evaluate)
    return seen


def test_an_unknown_policy_is_refused_before_anything_runs(evaluated, tmp_path):
    result = CliRunner().invoke(app, ["eval", "--tasks", str(tmp_path / "none.jsonl"), "--policy", "gold",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "unknown policy 'gold'; choose one of oracle, null" in result.stdout
    assert not evaluated and not (tmp_path / "run").exists()
