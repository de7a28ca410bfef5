"""agent.max_thinking_tokens: a thought that runs past the budget is ended with the template's thought closing
(inserted, never sampled, out of the loss), sampling resumes for the action, and the token record stays exact."""

import pytest
import torch

from memory_env import FIXED, MemoryEnv, diff, memory_task
from patchgym.agent import tokens
from patchgym.agent.check_tokens import check_trajectory
from patchgym.agent.config import AgentConfig, SamplingConfig
from patchgym.agent.loop import run_agent
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.hf import HFEngine
from patchgym.inference.models import tiny_qwen3_model
from patchgym.train.metrics import rollout_stats

FIX = render_call_xml(ToolCall("file_editor", {"command": "str_replace", "path": "/testbed/calc.py",
                                               "old_str": "a - b", "new_str": "a + b"}))
FINISH = render_call_xml(ToolCall("finish", {}))
RAMBLING = "Maybe the sign, maybe the tests, maybe the sign again, or the tests " * 4


def test_a_runaway_thought_is_closed_by_the_template_and_the_action_follows(scripted, qwen3_tokenizer):
    tokenizer = qwen3_tokenizer("qwen3-thinking-2507")  # the generation prompt opens "<think>\n"
    # The scripted engine answers each call with its next text: the runaway thought, then (after the inserted
    # closing) the action, then the next turn's thought and action.
    engine = scripted([RAMBLING, FIX, f"Done.\n</think>\n\n{FINISH}"], tokenizer)
    config = AgentConfig(max_thinking_tokens=10, sampling=SamplingConfig(max_new_tokens=200))
    trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
    assert trajectory.termination == "submitted" and trajectory.patch == diff(MemoryEnv().initial, FIXED)
    cut, finish = trajectory.turns
    closing = tokenizer.encode("\n</think>\n\n", add_special_tokens=False)
    assert cut.thought_close_ids == closing == tokens.thought_closing_ids(tokenizer, trajectory.messages[:2])
    assert cut.thought_close_at == 10 and cut.thinking_tokens == 10 and cut.finish_reason == "stop"
    assert cut.action == FIX and not cut.format_error and cut.reasoning.startswith("Maybe the sign")
    assert cut.action_tokens == len(tokenizer.encode(FIX, add_special_tokens=False))
    # the second call resumed after the thought's 10 sampled ids and the inserted closing
    assert engine.prompts[1] == engine.prompts[0] + cut.completion_ids[:10] + closing
    assert not finish.thought_close_ids and finish.reasoning == "Done."  # closed within its budget
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok, check.errors
    input_ids, mask, logprobs = tokens.build_training_sequence(trajectory)
    start = len(cut.prompt_ids) + 10
    assert input_ids[start:start + len(closing)] == closing and not any(mask[start:start + len(closing)])
    assert sum(mask) == trajectory.sampled_tokens and len(logprobs) == len(input_ids)
    assert rollout_stats([trajectory])["thinking_truncated"] == 1
    cut.thought_close_ids = tokenizer.encode("</think>", add_special_tokens=False)  # not the template's closing
    errors = check_trajectory(trajectory, tokenizer).errors
    assert any("the template closes a thought with" in e for e in errors), errors


def test_without_a_thought_the_budget_only_splits_sampling(scripted, qwen3_tokenizer):
    """Qwen3 with thinking off: nothing to close, so the turn is the first call's ids (then resumed, unchanged)."""
    tokenizer = qwen3_tokenizer("qwen3", enable_thinking=False)
    engine = scripted([FINISH], tokenizer)
    trajectory = run_agent(memory_task(), engine, MemoryEnv(),
                           AgentConfig(max_steps=1, max_thinking_tokens=3, sampling=SamplingConfig(max_new_tokens=100)))
    turn = trajectory.turns[0]
    assert not turn.thought_close_ids and turn.completion_ids[:3] == engine.prompts[1][-3:]
    assert check_trajectory(trajectory, tokenizer).ok


def test_a_random_qwen3_is_cut_at_its_budget_and_its_record_is_what_it_saw(qwen3_template_path):
    """The real model, resumed after the inserted closing: every rollout logprob equals a forward pass over the
    recorded sequence, so what is trained on is exactly what the model was conditioned on."""
    torch.set_num_threads(1)
    model, tokenizer = tiny_qwen3_model()
    configure_tokenizer(tokenizer, str(qwen3_template_path("qwen3-thinking-2507")), {})
    config = AgentConfig(max_steps=2, max_format_errors=10, max_thinking_tokens=4,
                         sampling=SamplingConfig(max_new_tokens=8, seed=3))
    with HFEngine(model, tokenizer, max_batch=1) as engine:
        trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
    cut = [t for t in trajectory.turns if t.thought_close_ids]
    assert cut and all(t.thought_close_at == t.thinking_tokens == 4 for t in cut)
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok, check.errors
    input_ids, mask, rollout = tokens.build_training_sequence(trajectory)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([input_ids])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(input_ids[1:])[:, None])[:, 0]
    sampled = [i for i, m in enumerate(mask) if m]
    assert len(sampled) == trajectory.sampled_tokens
    assert logprobs[[i - 1 for i in sampled]].tolist() == pytest.approx([rollout[i] for i in sampled], abs=1e-4)


def test_an_inserted_closing_is_out_of_the_loss_in_both_history_modes():
    from patchgym.agent.trajectory import Trajectory, Turn
    from patchgym.train.batch import sequences_from_trajectories

    turn = Turn(prompt_ids=[1, 2], completion_ids=[10, 11, 12], logprobs=[-0.1, -0.2, -0.3], finish_reason="stop",
                thought_close_ids=[7, 8], thought_close_at=2, close_ids=[9], action="")
    assert (turn.output_ids, turn.output_mask) == ([10, 11, 7, 8, 12], [1, 1, 0, 0, 1])
    assert turn.output_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    for history in ("keep", "template"):
        (row,) = sequences_from_trajectories([Trajectory(task_id="t", history=history, turns=[turn])], [1.0])
        assert row.input_ids[:7] == [1, 2, 10, 11, 7, 8, 12] and row.loss_mask[:7] == [0, 0, 1, 1, 0, 0, 1]
        assert row.rollout_logprobs[:7] == [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3] and row.policy_tokens == 3
