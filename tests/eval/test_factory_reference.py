"""On the CI factory set, through the tools and the grader: oracle resolves every task, null none."""

from patchgym.agent.reference import NullPolicy, OraclePolicy
from patchgym.eval.run import evaluate
from patchgym.sandbox import SandboxConfig


def test_oracle_resolves_all_and_null_none_of_the_factory_tasks(backend, ci_tasks, tmp_path):
    assert len(ci_tasks) == 6
    config = SandboxConfig(backend=backend)
    oracle = evaluate(ci_tasks, OraclePolicy(), config, tmp_path / "oracle", test_timeout=300, progress=False)
    assert oracle["resolve_rate"] == 1.0, oracle
    null = evaluate(ci_tasks, NullPolicy(), config, tmp_path / "null", test_timeout=300, progress=False)
    assert null["resolve_rate"] == 0.0 and null["grading_errors"] == 0 and null["infra_errors"] == 0, null
