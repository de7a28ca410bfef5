"""The pivot stage in real docker sandboxes: a demo of the tiny task replayed gives its states with the files as they
were; the bash check runs sampled commands at a state restored by replay, each sample from the same state; the
reward's edit rules leave the file the real editor leaves."""

import pytest

from patchgym.agent.config import AgentConfig
from patchgym.agent.expert import ExpertEngine, plan_demo
from patchgym.agent.loop import open_env, run_agent
from patchgym.env.grading.grader import grade_patch
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.pivot.replay import SandboxBash, SandboxReplay
from patchgym.pivot.reward import InvalidEdit, apply_edit, local_reward
from patchgym.pivot.states import build_states
from patchgym.sandbox import SandboxConfig

pytestmark = pytest.mark.parametrize("backend", ["docker"], indirect=True)
OPS = "/testbed/calc/ops.py"


def bash(command):
    return render_call_xml(ToolCall("execute_bash", {"command": command}))


def test_a_replayed_demo_gives_states_whose_bash_check_runs_at_that_state(backend, tiny_task, tiny_sources, tiny):
    clean, buggy = tiny_sources
    sandbox, agent = SandboxConfig(backend=backend), AgentConfig()
    plan = plan_demo(tiny_task, {"calc/ops.py": buggy}, {"tests/test_sub.py"}, seed=0)
    with open_env(sandbox, agent) as env:
        trajectory = run_agent(tiny_task, ExpertEngine(tiny[1], plan, agent.tool_format), env, agent)
    trajectory.grade, trajectory.trajectory_id = grade_patch(tiny_task, trajectory.patch, sandbox), "tiny#0"
    assert trajectory.resolved

    points, skipped = build_states([trajectory], {tiny_task.instance_id: tiny_task},
                                   lambda: SandboxReplay(sandbox, agent))

    assert skipped == [] and len(points) == trajectory.steps
    by_name = {p.call["arguments"].get("command", p.call["name"]) if p.call["name"] == "file_editor"
               else p.call["name"]: p for p in points}
    assert by_name["str_replace"].files == {OPS: buggy} and by_name["str_replace"].after == {OPS: clean["calc/ops.py"]}
    assert by_name["search"].target == OPS
    tests = by_name["execute_bash"]
    assert "tests/test_sub.py" in tests.call["arguments"]["command"] and tests.exit_code == 0
    with SandboxBash({tiny_task.instance_id: tiny_task}, sandbox, agent, timeout_s=20, max_open=1) as check:
        assert local_reward(tests, tests.action, bash=check).reason == "bash_same_program"
        assert local_reward(tests, bash("ls calc && rm -rf calc"), bash=check).reason == "bash_runs"
        assert local_reward(tests, tests.action, bash=check).reward == 1.0  # restored: calc/ is back
        assert local_reward(tests, bash("python -m pytest -q tests/test_missing.py"), bash=check).reward == 0.0
        assert local_reward(tests, bash("nosuchcommand --fix"), bash=check).reason == "bash_fails"
        bug = "grep -q 'left_operand - right_operand' calc/ops.py"
        assert check.exit_code(tests, bug) == 1  # the expert's fix is in at this state
        assert check.exit_code(by_name["search"], bug) == 0  # replayed to turn 0: not yet (the first sandbox closed)
        assert list(check._envs) == ["tiny#0@0"]


def test_the_reward_s_edits_leave_what_the_real_editor_leaves(backend, tiny_task, tiny_sources):
    clean, buggy = tiny_sources
    edits = [{"command": "str_replace", "path": "calc/ops.py", "old_str": "left_operand - right", "new_str": "x"},
             {"command": "str_replace", "path": "calc/ops.py", "old_str": "a", "new_str": "b"},
             {"command": "str_replace", "path": "calc/ops.py", "old_str": "def sub", "new_str": "def sub"},
             {"command": "insert", "path": "calc/ops.py", "insert_line": 0, "new_str": "import os"},
             {"command": "insert", "path": "calc/ops.py", "insert_line": 6, "new_str": "X = 1\n\n"},
             {"command": "insert", "path": "calc/ops.py", "insert_line": 99, "new_str": "X = 1"},
             {"command": "create", "path": "calc/new.py", "file_text": "Y = 2"},
             {"command": "create", "path": "calc/ops.py", "file_text": "Y = 2"}]
    replay = SandboxReplay(SandboxConfig(backend=backend), AgentConfig())
    try:
        replay.reset(tiny_task)
        for args in edits:
            path = f"/testbed/{args['path']}"
            before = replay.read([path])[path]
            try:
                expected = apply_edit(before, args)
            except InvalidEdit:
                expected = before
            result = replay.step(render_call_xml(ToolCall("file_editor", args)))
            assert (result.exit_code == 0) == (expected != before), (args, result.observation)
            assert replay.read([path])[path] == expected, args
            if result.exit_code == 0:
                replay.step(render_call_xml(ToolCall("file_editor", {"command": "undo_edit", "path": args["path"]})))
        assert replay.read([OPS]) == {OPS: buggy}
    finally:
        replay.close()
