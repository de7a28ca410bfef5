"""The expert's plan from a gold patch (search, view, edit, test, finish), and the expert engine playing it through
the agent loop in each template and tool format with exact tokens, on the in-memory environment."""

import pytest

from memory_env import BUGGY, MemoryEnv, diff, memory_grade, memory_task
from patchgym.agent.check_tokens import check_trajectory
from patchgym.agent.config import AgentConfig
from patchgym.agent.expert import ExpertEngine, Unplayable, plan_demo
from patchgym.agent.loop import run_agent
from patchgym.env.tools import tool_schemas

BLOCK = "one\ntwo\nthree\nbug\nfour\nfive\nsix\n"
TWICE = BLOCK * 2 + "end\n"  # the second bug's hunk, with its three lines of context, occurs twice


def play(task, files, seed, tokenizer, config):
    plan = plan_demo(task, files, set(), seed)
    tools = tool_schemas(task.workdir, config.command_timeout_s) if config.tool_format == "native" else None
    env = MemoryEnv(files)
    trajectory = run_agent(task, ExpertEngine(tokenizer, plan, config.tool_format, tools), env, config)
    trajectory.grade = memory_grade(task, trajectory.patch)
    return plan, trajectory


def test_the_plan_searches_views_edits_tests_and_finishes_and_varies_with_the_seed():
    plans = [plan_demo(memory_task(), dict(BUGGY), set(), seed) for seed in range(4)]
    for plan in plans:
        names = [(s.call.name, s.call.arguments.get("command")) for s in plan.steps]
        assert names == [("search", None), ("file_editor", "view"), ("file_editor", "str_replace"),
                         ("execute_bash", "python -m py_compile calc.py"), ("finish", None)]
        edit = plan.steps[2].call.arguments
        assert "return a - b" in edit["old_str"] and edit["new_str"] == edit["old_str"].replace("a - b", "a + b")
    assert len({repr(p.steps) for p in plans}) == 4


def test_an_edit_whose_old_text_is_not_unique_is_widened_and_says_so(tokenizer):
    fixed = BLOCK + BLOCK.replace("bug", "fix") + "end\n"
    task = memory_task().model_copy(update={"patch": diff({"calc.py": TWICE}, {"calc.py": fixed})})
    plan, trajectory = play(task, {"calc.py": TWICE}, 0, tokenizer, AgentConfig())
    assert any("not unique" in note and "calc.py" in note for note in plan.notes)
    edit = plan.steps[2].call.arguments
    assert edit["old_str"].startswith("six\none\n") or edit["old_str"].endswith("six\nend\n")
    assert trajectory.resolved and trajectory.patch == task.patch


def test_a_gold_patch_that_does_not_match_the_files_or_is_missing_is_unplayable():
    with pytest.raises(Unplayable, match=r"memory.calc.0: its gold patch does not apply: hunk 1 of calc.py expects "
                                         r"'def add\(a, b\):' at line 1"):
        plan_demo(memory_task(), {"calc.py": "def sub(a, b):\n    return a - b\n"}, set(), 0)
    with pytest.raises(Unplayable, match="memory.calc.0 has no gold patch"):
        plan_demo(memory_task().model_copy(update={"patch": ""}), dict(BUGGY), set(), 0)


def test_new_files_are_created_and_visible_failing_tests_run():
    task = memory_task().model_copy(update={"patch": diff({}, {"pkg/new.py": "X = 1\n"})})
    plan = plan_demo(task, {}, {"test_calc.py"}, 0)
    assert plan.steps[1].call.arguments == {"command": "create", "path": "pkg/new.py", "file_text": "X = 1\n"}
    assert plan.steps[2].call.arguments["command"].endswith("pytest -q -p no:cacheprovider test_calc.py::test_add")


@pytest.mark.parametrize("tool_format", ["text", "native"])
def test_smollm2_demos_resolve_with_exact_tokens(tokenizer, tool_format):
    config = AgentConfig(tool_format=tool_format)
    plan, trajectory = play(memory_task(), dict(BUGGY), 1, tokenizer, config)
    assert trajectory.termination == "submitted" and trajectory.resolved
    assert [t.tool_call["name"] for t in trajectory.turns] == [s.call.name for s in plan.steps]
    assert not any(t.format_error for t in trajectory.turns) and all(t.logprobs for t in trajectory.turns)
    assert plan.steps[0].reasoning in trajectory.turns[0].action  # ChatML: the thought is text before the call
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok and check.non_canonical == 0, check.errors


@pytest.mark.parametrize("name, kwargs, history, tool_format", [
    ("qwen3", {}, "keep", "native"), ("qwen3-thinking-2507", {}, "keep", "text"),
    ("qwen3", {"enable_thinking": False}, "template", "native")])
def test_qwen3_demos_resolve_with_exact_tokens_and_thinking_apart(qwen3_tokenizer, name, kwargs, history,
                                                                  tool_format):
    tokenizer = qwen3_tokenizer(name, **kwargs)
    config = AgentConfig(tool_format=tool_format, history=history)
    plan, trajectory = play(memory_task(), dict(BUGGY), 2, tokenizer, config)
    assert trajectory.termination == "submitted" and trajectory.resolved
    thinks = kwargs.get("enable_thinking", True)
    first = trajectory.turns[0]
    assert (first.reasoning == plan.steps[0].reasoning) == thinks
    assert first.action.startswith("<tool_call>" if tool_format == "native" else "<function=") == thinks
    check = check_trajectory(trajectory, tokenizer)
    assert check.ok and check.non_canonical == 0, check.errors


def test_hunks_of_one_file_apply_in_any_order_each_viewed_where_it_then_is(tokenizer):
    before = {"calc.py": "".join(f"line{i}\n" for i in range(1, 41))}
    after = {"calc.py": before["calc.py"].replace("line5\n", "line5\nnew\nnew\n").replace("line30\n", "LINE30\n")}
    task = memory_task().model_copy(update={"patch": diff(before, after)})
    first_edited = set()
    for seed in range(4):
        plan, trajectory = play(task, dict(before), seed, tokenizer, AgentConfig())
        assert trajectory.resolved, seed
        steps = [s.call.arguments for s in plan.steps[1:-2]]
        assert [s["command"] for s in steps] == ["view", "str_replace", "view", "str_replace"]
        text = before["calc.py"]
        for view, edit in zip(steps[::2], steps[1::2]):
            line = text[:text.index(edit["old_str"])].count("\n") + 1
            assert view["view_range"][0] <= line <= view["view_range"][1], (seed, view, line)
            text = text.replace(edit["old_str"], edit["new_str"])
        first_edited.add("line5" in steps[1]["old_str"])
    assert first_edited == {True, False}
