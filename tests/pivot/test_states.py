"""Decision points of expert demos: one per expert turn with the files as they were, prompts rendered token for token
as the agent loop built them (each template and history mode), written and read back; trajectories that are no
expert's, and replays that differ from the record, give none and say why."""

import json

import pytest
from pivot_demos import MemoryReplay, play_demo

from memory_env import BUGGY, FIXED, memory_grade, memory_task
from patchgym.agent.config import AgentConfig
from patchgym.agent.loop import run_agent
from patchgym.agent.scripts import ScriptEngine
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.pivot.states import StateError, build_states, decision_points, prompt_ids, read_states, write_states

TARGET = "/testbed/calc.py"


def loop_prompt(trajectory, n: int) -> list[int]:
    """The ids the loop gave the model at turn n: the whole sequence so far (keep) or that turn's prompt."""
    if trajectory.history == "template":
        return trajectory.turns[n].prompt_ids
    ids = []
    for turn in trajectory.turns[:n]:
        ids += turn.prompt_ids + turn.output_ids + turn.close_ids
    return ids + trajectory.turns[n].prompt_ids


def test_every_expert_turn_is_a_state_with_its_files_before_and_after(demo, points):
    assert [p.turn for p in sorted(points.values(), key=lambda p: p.turn)] == list(range(demo.steps))
    assert list(points) == ["search", "view", "str_replace", "execute_bash", "finish"]
    for point in points.values():
        assert point.key == f"memory.calc.0#0@{point.turn}" and point.task_id == "memory.calc.0"
        assert point.messages == demo.messages[:2 * point.turn + 2]  # system, user, then (assistant, observation)s
        assert point.action == demo.turns[point.turn].action
        assert [len(point.earlier_actions), point.finished] == [point.turn, point is points["finish"]]
    assert [points[k].target for k in points] == [TARGET, TARGET, TARGET, None, None]
    assert points["search"].files == points["view"].files == {TARGET: BUGGY["calc.py"]}
    assert points["str_replace"].files == {TARGET: BUGGY["calc.py"]}
    assert points["str_replace"].after == {TARGET: FIXED["calc.py"]}
    assert points["execute_bash"].files == points["finish"].files == {} and points["view"].after == {}


@pytest.mark.parametrize("template, kwargs, history, tool_format", [
    ("smollm2", {}, "keep", "text"), ("smollm2", {}, "template", "native"), ("qwen3", {}, "keep", "native"),
    ("qwen3-thinking-2507", {}, "keep", "text"), ("qwen3", {"enable_thinking": False}, "template", "native")])
def test_the_prompt_of_each_state_is_the_loops_token_for_token(tokenizer, qwen3_tokenizer, template, kwargs, history,
                                                              tool_format):
    tokenizer = tokenizer if template == "smollm2" else qwen3_tokenizer(template, **kwargs)
    trajectory = play_demo(tokenizer, AgentConfig(tool_format=tool_format, history=history), seed=1)
    assert trajectory.resolved and trajectory.turns[0].prompt_ids

    found = decision_points(trajectory, memory_task(), MemoryReplay())

    assert len(found) == trajectory.steps
    for point in found:
        assert prompt_ids(point, tokenizer) == loop_prompt(trajectory, point.turn), point.key


def test_a_state_of_another_template_is_refused_by_name(demo, points, qwen3_tokenizer):
    thinking = qwen3_tokenizer("qwen3-thinking-2507")  # its generation prompt opens <think>; SmolLM2's text did not
    with pytest.raises(StateError, match=r"state memory.calc.0#0@2: assistant message 2 does not begin with"):
        prompt_ids(points["str_replace"], thinking)


def test_states_are_written_and_read_back_and_bad_rows_are_named(points, tmp_path):
    path = tmp_path / "states.jsonl"
    write_states(path, list(points.values()))
    assert read_states(path) == list(points.values())

    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(StateError, match=rf"{path}:2: not a decision point"):
        read_states(path)
    record = json.loads(lines[1])
    del record["action"]
    path.write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(StateError, match=rf"{path}:2: not a decision point: .*action"):
        read_states(path)
    path.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(StateError, match=r"states memory.calc.0#0@0 appear twice"):
        read_states(path)
    with pytest.raises(StateError, match=r"state file .*missing.jsonl cannot be read"):
        read_states(tmp_path / "missing.jsonl")


class Actions:
    """A script that plays fixed action texts, one per turn."""

    def __init__(self, actions):
        self.actions = actions

    def act(self, task, observation, turn):
        return self.actions[turn]


def test_format_errors_and_failed_edits_are_no_states_and_unresolved_runs_give_none(tokenizer):
    task = memory_task()
    def edit(old):
        return render_call_xml(ToolCall("file_editor", {"command": "str_replace", "path": "calc.py", "old_str": old,
                                                        "new_str": "return a + b"}))
    actions = ["I will fix it.", edit("return a * b"), edit("return a - b"), render_call_xml(ToolCall("finish", {}))]
    config = AgentConfig()
    trajectory = run_agent(task, ScriptEngine(Actions(actions), task), MemoryReplay().env, config)
    trajectory.grade, trajectory.trajectory_id = memory_grade(task, trajectory.patch), "fumbled#0"
    assert trajectory.resolved and [t.format_error for t in trajectory.turns] == [True, False, False, False]

    found = decision_points(trajectory, task, MemoryReplay())
    assert [(p.turn, p.call["name"], p.target) for p in found] == [(2, "file_editor", TARGET), (3, "finish", None)]
    assert found[0].earlier_actions == actions[:2]  # replayed as they were, the format error too

    failed = trajectory.model_copy(update={"grade": None, "trajectory_id": "unresolved#0"})
    with pytest.raises(StateError, match="trajectory unresolved#0: it did not resolve its task"):
        decision_points(failed, task, MemoryReplay())
    built, skipped = build_states([failed, trajectory], {task.instance_id: task}, MemoryReplay)
    assert [p.key for p in built] == ["fumbled#0@2", "fumbled#0@3"]
    assert skipped == ["unresolved#0: it did not resolve its task"]
    _, skipped = build_states([trajectory], {}, MemoryReplay)
    assert skipped == ["fumbled#0: its task memory.calc.0 is not among the tasks given"]


def test_a_replay_that_differs_from_the_record_is_refused_at_its_turn(demo):
    other = {"calc.py": "def add(a, b):\n    return b - a\n"}  # the expert's edit does not match here
    with pytest.raises(StateError, match=r"memory.calc.0#0, turn 2: the replay differs from the record \(exit "
                                         r"status 1, recorded 0\)"):
        decision_points(demo, memory_task(), MemoryReplay(other))
