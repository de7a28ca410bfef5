"""Qwen3 in a real sandbox: a thinking scripted fixer with native tool calls resolves the tiny task with exact tokens,
and the random Qwen3ForCausalLM plays text-format turns there through the hf engine, check-tokens clean.

On docker only: what is proven is the model's tokens and tool format, not the backend (each backend's sandbox and
environment contracts are tests/sandbox's and tests/env/test_swe_env.py's)."""

import pytest

from patchgym.agent.check_tokens import check_trajectory
from patchgym.agent.config import AgentConfig, SamplingConfig
from patchgym.agent.loop import open_env, run_agent
from patchgym.env.grading.grader import grade_patch
from patchgym.env.tools import ToolCall, render_call_json
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.hf import HFEngine
from patchgym.inference.models import tiny_qwen3_model
from patchgym.sandbox import SandboxConfig

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)


@pytest.fixture
def sandbox_config(backend):
    return SandboxConfig(backend=backend)


def test_a_thinking_native_fixer_resolves_the_task_with_exact_tokens(scripted, qwen3_tokenizer, tiny_task,
                                                                     sandbox_config):
    tokenizer = qwen3_tokenizer("qwen3")
    apply = ToolCall("execute_bash", {"command": f"git apply - <<'EOF'\n{tiny_task.patch.rstrip()}\nEOF"})
    actions = [f"<think>\nApply the fix.\n</think>\n\n{render_call_json(apply)}",
               f"<think>\nCheck it.\n</think>\n\n{render_call_json(ToolCall('execute_bash', {'command': 'git diff'}))}",
               f"<think>\nDone.\n</think>\n\n{render_call_json(ToolCall('finish', {}))}"]
    engine = scripted(actions, tokenizer)
    config = AgentConfig(tool_format="native")
    with open_env(sandbox_config, config) as env:
        trajectory = run_agent(tiny_task, engine, env, config)
    assert trajectory.termination == "submitted" and trajectory.turns[0].exit_code == 0
    assert [t.reasoning for t in trajectory.turns] == ["Apply the fix.", "Check it.", "Done."]
    assert "calc/ops.py" in trajectory.turns[1].observation
    assert check_trajectory(trajectory, tokenizer).ok
    assert grade_patch(tiny_task, trajectory.patch, sandbox_config).resolved


def test_a_random_qwen3_plays_in_a_sandbox_with_exact_tokens(qwen3_template_path, tiny, tiny_task, sandbox_config):
    model, tokenizer = tiny_qwen3_model()
    configure_tokenizer(tokenizer, str(qwen3_template_path("qwen3")), {})
    config = AgentConfig(max_steps=3, max_format_errors=10, sampling=SamplingConfig(max_new_tokens=16, seed=3))
    with HFEngine(model, tokenizer, max_batch=1) as engine, open_env(sandbox_config, config) as env:
        trajectory = run_agent(tiny_task, engine, env, config)
    assert trajectory.termination == "max_steps" and trajectory.steps == 3
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok, check.errors
