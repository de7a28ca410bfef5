"""Qwen3 through the loop: a random-weight Qwen3ForCausalLM on a tokenizer with Qwen3's special tokens and the real
templates, played through the hf engine for several turns with exact tokens (check-tokens: 0 mismatches), and a
scripted thinker whose reasoning is stored apart from its action, split at the </think> token."""

import pytest
import torch

from memory_env import FIXED, MemoryEnv, diff, memory_task
from patchgym.agent import tokens
from patchgym.agent.check_tokens import check_trajectory
from patchgym.agent.config import AgentConfig, SamplingConfig
from patchgym.agent.loop import run_agent
from patchgym.env.tools import ToolCall, render_call_json, render_call_xml
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.hf import HFEngine
from patchgym.inference.models import tiny_qwen3_model

FIX = render_call_xml(ToolCall("file_editor", {"command": "str_replace", "path": "/testbed/calc.py",
                                               "old_str": "a - b", "new_str": "a + b"}))
FINISH = render_call_xml(ToolCall("finish", {}))


@pytest.fixture(scope="module")
def qwen3():
    return tiny_qwen3_model()


@pytest.mark.parametrize("name, kwargs", [("qwen3", {}), ("qwen3-thinking-2507", {}),
                                          ("qwen3", {"enable_thinking": False})])
@pytest.mark.parametrize("tool_format, role", [("text", "user"), ("text", "tool"), ("native", "tool")])
def test_a_random_qwen3_plays_several_turns_with_exact_tokens(qwen3, qwen3_template_path, name, kwargs,
                                                              tool_format, role):
    model, tokenizer = qwen3
    configure_tokenizer(tokenizer, str(qwen3_template_path(name)), kwargs)
    config = AgentConfig(max_steps=4, max_format_errors=10, observation_role=role, tool_format=tool_format,
                         sampling=SamplingConfig(max_new_tokens=12, seed=7))
    torch.set_num_threads(1)
    with HFEngine(model, tokenizer, max_batch=2) as engine:
        trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
    assert trajectory.termination == "max_steps" and trajectory.steps == 4
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok, check.errors
    input_ids, mask, _ = tokens.build_training_sequence(trajectory)
    assert [i for i, m in zip(input_ids, mask) if m] == [i for t in trajectory.turns for i in t.completion_ids]
    # keep: every prompt the model was given extends the one before it by the turn's sample and the observation
    assert tokenizer.decode(input_ids).count("<|im_start|>assistant") == 4
    assert engine.tokenizer.chat_template.startswith("{%- set enable_thinking") == bool(kwargs)


def thought(text: str, action: str) -> str:
    return f"<think>\n{text}\n</think>\n\n{action}"


def test_thinking_is_stored_apart_from_the_action_and_kept_in_the_history(scripted, qwen3_tokenizer):
    tokenizer = qwen3_tokenizer("qwen3")
    engine = scripted([thought("The sign is wrong.", FIX), thought("Fixed; submit.", FINISH)], tokenizer)
    trajectory = run_agent(memory_task(), engine, MemoryEnv(), AgentConfig())
    assert trajectory.termination == "submitted" and trajectory.patch == diff(MemoryEnv().initial, FIXED)
    first, second = trajectory.turns
    assert (first.reasoning, first.action) == ("The sign is wrong.", FIX)
    assert second.reasoning == "Fixed; submit." and not first.format_error
    end = tokenizer.convert_tokens_to_ids("</think>")
    for turn in trajectory.turns:
        assert turn.completion_ids[turn.thinking_tokens - 1] == end  # the count ends at the </think> token
        assert turn.thinking_tokens + turn.action_tokens + 1 == len(turn.completion_ids)  # + <|im_end|>
    # The second prompt holds the first turn's thinking verbatim: it extends the first prompt and sample.
    assert engine.prompts[1][:len(engine.prompts[0]) + len(first.completion_ids)] == \
        engine.prompts[0] + first.completion_ids
    assert "The sign is wrong." in tokenizer.decode(engine.prompts[1])
    assert check_trajectory(trajectory, tokenizer).ok


def test_a_thought_cut_short_is_all_reasoning_and_a_format_error(scripted, qwen3_tokenizer):
    tokenizer = qwen3_tokenizer("qwen3-thinking-2507")
    engine = scripted(["I keep thinking and thinking and thinking"], tokenizer)
    trajectory = run_agent(memory_task(), engine, MemoryEnv(),
                           AgentConfig(max_steps=2, sampling=SamplingConfig(max_new_tokens=4)))
    turn = trajectory.turns[0]
    assert turn.finish_reason == "length" and turn.format_error and turn.action == ""
    assert turn.thinking_tokens == 4 and turn.action_tokens == 0 and turn.reasoning.startswith("I keep")
    assert trajectory.messages[2]["content"].startswith("<think>\nI keep")  # what the generation prompt opened
    assert check_trajectory(trajectory, tokenizer).ok


NATIVE_FIX = render_call_json(ToolCall("file_editor", {"command": "str_replace", "path": "/testbed/calc.py",
                                                       "old_str": "a - b", "new_str": "a + b"}))


def test_native_tool_calls_go_through_the_template_as_schemas_and_tool_messages(scripted, qwen3_tokenizer):
    tokenizer = qwen3_tokenizer("qwen3")
    engine = scripted([thought("Fix the sign.", NATIVE_FIX), '<tool_call>\n{"name": "finish", "arguments": {}\n',
                       thought("Submit.", render_call_json(ToolCall("finish", {})))], tokenizer)
    config = AgentConfig(tool_format="native", command_timeout_s=30)
    trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
    assert trajectory.termination == "submitted" and trajectory.patch == diff(MemoryEnv().initial, FIXED)
    fix, malformed, finish = trajectory.turns
    assert fix.tool_call["arguments"]["new_str"] == "a + b" and not fix.format_error
    assert malformed.format_error and malformed.tool_call is None
    assert malformed.observation.startswith("The JSON inside <tool_call> is malformed: Expecting")  # the reason
    assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                        "assistant"]
    first_prompt = tokenizer.decode(engine.prompts[0])
    assert "<tools>" in first_prompt and '"name": "execute_bash"' in first_prompt
    assert "killed after 30 seconds" in first_prompt and "<function=TOOL_NAME>" not in first_prompt
    assert "<tool_response>\n" in tokenizer.decode(engine.prompts[1])
    assert trajectory.tools and check_trajectory(trajectory, tokenizer).ok


@pytest.mark.parametrize("tool_format, role", [("text", "user"), ("native", "tool")])
def test_template_history_renders_every_prompt_whole_as_the_published_template_does(qwen3, qwen3_template_path,
                                                                                    tool_format, role):
    model, tokenizer = qwen3
    configure_tokenizer(tokenizer, str(qwen3_template_path("qwen3")), {})
    config = AgentConfig(history="template", max_steps=3, max_format_errors=10, tool_format=tool_format,
                         observation_role=role, sampling=SamplingConfig(max_new_tokens=12, seed=5))
    with HFEngine(model, tokenizer, max_batch=1) as engine:
        trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
    assert trajectory.history == "template" and trajectory.steps == 3
    assistant_at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    for turn, at in zip(trajectory.turns, assistant_at):
        assert turn.prompt_ids == tokens.prompt_ids(tokenizer, trajectory.messages[:at], trajectory.tools, "template")
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok, check.errors


def test_template_history_drops_earlier_thinking_and_trains_each_step(scripted, qwen3_tokenizer):
    from patchgym.train.batch import sequences_from_trajectories

    tokenizer = qwen3_tokenizer("qwen3")
    engine = scripted([thought("The sign is wrong.", FIX), thought("Fixed; submit.", FINISH)], tokenizer)
    trajectory = run_agent(memory_task(), engine, MemoryEnv(), AgentConfig(history="template"))
    assert trajectory.termination == "submitted" and trajectory.turns[0].reasoning == "The sign is wrong."
    second_prompt = tokenizer.decode(engine.prompts[1])
    assert "The sign is wrong." not in second_prompt and FIX in second_prompt  # as Qwen3 renders at inference
    assert check_trajectory(trajectory, tokenizer).ok
    steps = sequences_from_trajectories([trajectory], [1.5])
    assert [s.input_ids for s in steps] == [t.prompt_ids + t.completion_ids for t in trajectory.turns]
    assert all(s.advantage == 1.5 and s.weight == 0.5 for s in steps)
