"""The agent loop against the in-memory Env (the fast tier: no sandbox): exact tokens, every termination reason,
the call parsed once, infrastructure errors, and scripts playing through the same loop."""

import asyncio

import pytest

from memory_env import FIXED, MemoryEnv, diff, memory_task
from patchgym.agent import tokens
from patchgym.agent.config import AgentConfig
from patchgym.agent.loop import run_agent
from patchgym.agent.scripts import NullScript, ScriptEngine
from patchgym.agent.trajectory import Trajectory, reward
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.rollout import ScriptedAgent

VIEW = render_call_xml(ToolCall("file_editor", {"command": "view", "path": "/testbed/calc.py"}))
FIX = render_call_xml(ToolCall("file_editor", {"command": "str_replace", "path": "/testbed/calc.py",
                                                "old_str": "a - b", "new_str": "a + b"}))
FINISH = render_call_xml(ToolCall("finish", {}))


def episode(engine, env=None, save_path=None, **limits) -> Trajectory:
    return run_agent(memory_task(), engine, env or MemoryEnv(), AgentConfig(**limits), save_path=save_path)


def test_a_fix_is_submitted_with_exact_tokens(scripted, tokenizer, tmp_path):
    engine = scripted([VIEW, FIX, FINISH])
    trajectory = episode(engine, save_path=tmp_path / "t.json")
    assert trajectory.termination == "submitted" and trajectory.steps == 3
    assert trajectory.patch == diff(MemoryEnv().initial, FIXED) == memory_task().patch
    assert [t.tool_call["name"] for t in trajectory.turns] == ["file_editor", "file_editor", "finish"]
    assert "a - b" in trajectory.turns[0].observation and trajectory.turns[1].exit_code == 0
    input_ids, mask, _ = tokens.build_training_sequence(trajectory)
    assert input_ids == tokens.render_ids(tokenizer, trajectory.messages, add_generation_prompt=False)
    for turn, prompt in zip(trajectory.turns, engine.prompts):  # each prompt extends the previous sequence
        assert input_ids[len(prompt): len(prompt) + len(turn.completion_ids)] == turn.completion_ids
    assert sum(mask) == trajectory.sampled_tokens
    assert Trajectory.load(tmp_path / "t.json") == trajectory


@pytest.mark.parametrize("limits, actions, reason, steps", [
    ({"max_steps": 2}, [VIEW], "max_steps", 2),
    ({"max_format_errors": 2}, [VIEW, "no call", "still none"], "format_errors", 3),
    ({"max_seconds": 1e-9}, [VIEW], "timeout", 0),
])
def test_each_limit_ends_with_its_reason(scripted, limits, actions, reason, steps):
    trajectory = episode(scripted(actions), **limits)
    assert (trajectory.termination, trajectory.steps) == (reason, steps)


def test_a_format_error_is_recorded_without_a_call(scripted):
    trajectory = episode(scripted(["no call here", FINISH]))
    bad, finish = trajectory.turns
    assert bad.format_error and bad.tool_call is None and bad.exit_code is None and "<function=" in bad.observation
    assert not finish.format_error and finish.tool_call == {"name": "finish", "arguments": {}}


def test_the_context_limit_is_checked_before_each_generation(scripted):
    one = episode(scripted([VIEW]), max_steps=1).turns[0]
    prompt, turn = len(one.prompt_ids), len(one.prompt_ids + one.completion_ids + one.close_ids)
    assert one.finish_reason == "stop"
    no_room = episode(scripted([VIEW]), max_context_tokens=prompt)
    assert (no_room.termination, no_room.steps) == ("max_context", 0)
    # Room for one turn but not for the observation after it.
    one_turn = episode(scripted([VIEW]), max_context_tokens=turn + 5)
    assert (one_turn.termination, one_turn.steps) == ("max_context", 1)
    # A turn is cut to fit: the completion gets only the room left, and the closing is appended unsampled.
    cut = episode(scripted([VIEW]), max_context_tokens=prompt + 10)
    assert cut.turns[0].finish_reason == "length" and len(cut.turns[0].completion_ids) == 10
    assert cut.termination == "max_context"


def test_a_dead_env_is_an_infra_error_and_the_partial_record_is_saved(scripted, tmp_path):
    trajectory = episode(scripted([VIEW]), env=MemoryEnv(die_on_step=2), save_path=tmp_path / "t.json")
    assert trajectory.termination == "infra_error" and "died at step 2" in trajectory.error
    assert trajectory.steps == 2 and not trajectory.scored
    # The step that died has no observation, and the conversation ends with the action it was given.
    assert trajectory.turns[-1].observation == "" and trajectory.messages[-1]["role"] == "assistant"
    assert Trajectory.load(tmp_path / "t.json").termination == "infra_error"


class FixScript:
    """Views, fixes, submits; remembers what it was shown."""

    def __init__(self):
        self.seen: list[tuple[str, int]] = []

    def act(self, task, observation, turn):
        self.seen.append((observation, turn))
        return [VIEW, FIX, FINISH][min(turn, 2)]


def test_a_script_plays_through_the_same_loop():
    script = FixScript()
    trajectory = run_agent(memory_task(), ScriptEngine(script, memory_task()), MemoryEnv(), AgentConfig())
    assert trajectory.termination == "submitted" and trajectory.patch == memory_task().patch
    assert all(t.completion_ids == [] and t.prompt_ids == [] for t in trajectory.turns)
    assert [m["role"] for m in trajectory.messages] == ["system", "user"] + ["assistant", "user"] * 2 + ["assistant"]
    assert [turn for _, turn in script.seen] == [0, 1, 2]
    assert "add subtracts" in script.seen[0][0] and "a - b" in script.seen[1][0]  # the prompt, then the view


def test_a_scripted_agent_records_its_script_as_the_engine():
    agent = ScriptedAgent(NullScript())
    trajectory = asyncio.run(agent.play(memory_task(), MemoryEnv(), None, None))
    assert trajectory.termination == "submitted" and trajectory.patch == ""
    assert trajectory.engine["class"] == "NullScript"


def test_a_patch_over_the_limit_ends_as_patch_too_large_and_only_its_size_is_kept(scripted, tmp_path):
    size = len(memory_task().patch.encode())
    trajectory = episode(scripted([FIX, FINISH]), save_path=tmp_path / "t.json", max_patch_bytes=size - 1)
    assert trajectory.termination == "patch_too_large" and trajectory.scored and trajectory.patch == ""
    assert f"{size} bytes" in trajectory.error and reward(trajectory) == 0.0
    assert Trajectory.load(tmp_path / "t.json") == trajectory
    assert episode(scripted([FIX, FINISH]), max_patch_bytes=size).patch == memory_task().patch  # at the limit: kept


def test_a_harbor_tasks_instruction_is_the_first_message_as_it_is_without_a_github_issue_frame(scripted):
    from patchgym.tasks.task import HarborSpec

    instruction = "Start the status service on port 8080 and leave it running."
    task = memory_task().model_copy(update={"problem_statement": instruction, "harbor": HarborSpec(tests="eA==")})
    harbor = run_agent(task, scripted([FINISH]), MemoryEnv(), AgentConfig())
    system, first = harbor.messages[0]["content"], harbor.messages[1]["content"]
    assert first == instruction and "GitHub issue" not in system and "## execute_bash" in system
    swe = episode(scripted([FINISH])).messages
    assert "GitHub issue" in swe[0]["content"] and "<github_issue>" in swe[1]["content"]
