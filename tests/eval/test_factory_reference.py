"""On the CI factory set, through the rollout engine, tools and grader: oracle resolves every task, null none.

On docker only: nothing here depends on the backend. The factory tasks on each backend are proven by
tests/tasks/test_factory_build.py (bug fails, fix passes) and tests/env/test_grader.py (gold patch resolves, tricks
do not), the agent's environment on each backend by tests/env/test_swe_env.py and tests/agent/test_loop.py."""

import pytest

from patchgym.agent.scripts import NullScript, OracleScript
from patchgym.eval.run import evaluate
from patchgym.rollout import RolloutConfig, ScriptedAgent
from patchgym.sandbox import SandboxConfig


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_oracle_resolves_all_and_null_none_of_the_factory_tasks(backend, ci_tasks, tmp_path):
    assert len(ci_tasks) == 6
    config = SandboxConfig(backend=backend)
    rollout = RolloutConfig(grade_timeout_s=300, grade_empty_patches=True, max_sandboxes=4)
    oracle = evaluate(ci_tasks, ScriptedAgent(OracleScript()), config, tmp_path / "oracle", rollout=rollout,
                      progress=False)
    assert oracle["resolve_rate"] == 1.0, oracle
    null = evaluate(ci_tasks, ScriptedAgent(NullScript()), config, tmp_path / "null", rollout=rollout,
                    progress=False)
    assert null["resolve_rate"] == 0.0 and null["grading_errors"] == 0 and null["infra_errors"] == 0, null
