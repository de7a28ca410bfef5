"""agent.on_context_full: an output too big for the context is cut in its middle (head, marker, tail) and the
episode goes on with exact tokens; with `end` the same output ends it as max_context."""

from memory_env import MemoryEnv, memory_task
from patchgym.agent.check_tokens import check_trajectory
from patchgym.agent.config import AgentConfig, SamplingConfig
from patchgym.agent.context import cut_to_fit
from patchgym.agent.loop import run_agent
from patchgym.env.tools import ToolCall, render_call_xml

LOG = render_call_xml(ToolCall("execute_bash", {"command": "cat log"}))
FINISH = render_call_xml(ToolCall("finish", {}))
BIG = "FIRST LINE\n" + "".join(f"middle line {i}\n" for i in range(400)) + "LAST LINE"


def play(scripted, on_context_full: str):
    config = AgentConfig(max_context_tokens=1500, on_context_full=on_context_full,
                         sampling=SamplingConfig(max_new_tokens=64))
    return run_agent(memory_task(), scripted([LOG, FINISH]), MemoryEnv(bash={"cat log": (BIG, 0)}), config)


def test_an_output_too_big_is_cut_to_its_head_and_tail_and_the_episode_goes_on(scripted, tokenizer):
    trajectory = play(scripted, "truncate_observation")
    assert trajectory.termination == "submitted"
    first = trajectory.turns[0]
    assert "middle line 200\n" in first.observation  # the record keeps the whole output
    assert first.observation_cut_tokens > 0
    shown = trajectory.messages[3]["content"]
    assert "FIRST LINE" in shown and "LAST LINE" in shown and "middle line 200\n" not in shown
    assert f"[... {first.observation_cut_tokens} tokens of this output were cut to fit the context ...]" in shown
    sequence = sum(len(t.prompt_ids) + len(t.completion_ids) + len(t.close_ids) for t in trajectory.turns)
    assert sequence <= 1500
    assert check_trajectory(trajectory, tokenizer).ok


def test_with_end_the_same_output_ends_the_episode(scripted):
    trajectory = play(scripted, "end")
    assert trajectory.termination == "max_context" and trajectory.turns[0].observation_cut_tokens == 0


def test_what_fits_is_not_cut(tokenizer):
    text, segment, cut = cut_to_fit(tokenizer, "short", lambda t: tokenizer.encode(t), limit=10)
    assert (text, cut) == ("short", 0) and segment == tokenizer.encode("short")
