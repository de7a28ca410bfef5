"""The agent loop on the tiny task in a real sandbox: a scripted oracle that resolves it with exact tokens, the tiny
random model for a real two-step episode, and what each backend must hold against the agent (its user's permissions,
a sandbox killed from outside).

Backend-independent tests run on docker only; the termination reasons, the context limit and a dead env are proven
in the fast tier (test_loop_memory.py), and each backend's sandbox contract in tests/sandbox."""

import pytest

from patchgym.agent import tokens
from patchgym.agent.config import AgentConfig
from patchgym.agent.loop import open_env, run_agent
from patchgym.agent.scripts import OracleScript
from patchgym.agent.trajectory import Trajectory
from patchgym.env.grading.grader import grade_patch
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.inference.hf import HFEngine
from patchgym.sandbox import SandboxConfig

VIEW = render_call_xml(ToolCall("file_editor", {"command": "view", "path": "/testbed/calc/ops.py"}))
FINISH = render_call_xml(ToolCall("finish", {}))


@pytest.fixture
def sandbox_config(backend):
    return SandboxConfig(backend=backend)


def episode(engine, task, sandbox_config, save_path=None, **limits):
    config = AgentConfig(**limits)
    with open_env(sandbox_config, config) as env:
        return run_agent(task, engine, env, config, save_path=save_path)


def oracle_actions(task) -> list[str]:
    oracle = OracleScript()
    return [oracle.act(task, "", 0), VIEW, oracle.act(task, "", 1)]


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_scripted_oracle_submits_a_patch_that_resolves_the_task(scripted, tiny_task, sandbox_config, tmp_path):
    engine = scripted(oracle_actions(tiny_task))
    trajectory = episode(engine, tiny_task, sandbox_config, save_path=tmp_path / "t.json")
    assert trajectory.termination == "submitted" and trajectory.steps == 3
    assert trajectory.turns[0].exit_code == 0 and "left_operand + right_operand" in trajectory.turns[1].observation
    assert trajectory.turns[2].tool_call == {"name": "finish", "arguments": {}}
    assert grade_patch(tiny_task, trajectory.patch, sandbox_config).resolved
    assert Trajectory.load(tmp_path / "t.json") == trajectory


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_the_engine_saw_exactly_the_rendering_of_the_messages(scripted, tiny_task, sandbox_config, tokenizer):
    engine = scripted(oracle_actions(tiny_task))
    trajectory = episode(engine, tiny_task, sandbox_config)
    input_ids, mask, logprobs = tokens.build_training_sequence(trajectory)
    assert input_ids == tokens.render_ids(tokenizer, trajectory.messages, add_generation_prompt=False)
    for turn, prompt in zip(trajectory.turns, engine.prompts):  # each prompt extends the previous sequence
        assert input_ids[: len(prompt)] == prompt
        assert input_ids[len(prompt): len(prompt) + len(turn.completion_ids)] == turn.completion_ids
    assert sum(mask) == sum(len(t.completion_ids) for t in trajectory.turns)
    assert [m["role"] for m in trajectory.messages] == ["system", "user"] + ["assistant", "user"] * 2 + ["assistant"]
    assert trajectory.messages[3]["content"].endswith("\n\nSteps remaining: 49")


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_the_tiny_model_plays_two_steps_and_each_turn_is_saved(tiny, tiny_task, sandbox_config, tmp_path):
    path = tmp_path / "traj.json"
    seen: list[int] = []

    class Watched(HFEngine):
        def generate(self, prompt_ids, params=None):
            seen.append(Trajectory.load(path).steps if path.exists() else -1)
            return super().generate(prompt_ids, params)

    with Watched(*tiny) as engine:
        trajectory = episode(engine, tiny_task, sandbox_config, save_path=path, max_steps=2,
                             sampling={"max_new_tokens": 24, "seed": 0})
    assert seen == [-1, 1]  # before the second turn, the file held the first
    assert trajectory.termination == "max_steps" and trajectory.format_errors == 2
    saved = Trajectory.load(path)
    assert saved == trajectory and saved.engine["class"] == "Watched"
    for turn in saved.turns:
        assert len(turn.logprobs) == len(turn.completion_ids) <= 24
        assert all(lp <= 0 for lp in turn.logprobs)
        ends = turn.completion_ids[-1:] == [tiny[1].eos_token_id]
        assert tiny[1].decode(turn.completion_ids[:-1] if ends else turn.completion_ids) == turn.action
    input_ids, mask, _ = tokens.build_training_sequence(saved)
    assert sum(mask) == sum(len(t.completion_ids) for t in saved.turns)


def bash(command: str) -> str:
    return render_call_xml(ToolCall("execute_bash", {"command": command}))


def test_an_agent_that_tries_to_kill_its_sandbox_plays_on_and_is_graded(scripted, tiny_task, sandbox_config):
    """`kill -9 -1` as the agent's user ends only the agent's processes (the tool's own too): the tool answers with
    what happened, the next step runs, and the episode is graded like any other."""
    runner_kill = "kill -9 $(grep -l 'in-sandbox [r]unner' /proc/[0-9]*/cmdline | cut -d/ -f3)"
    trajectory = episode(scripted([bash("kill -9 -1"), bash(runner_kill), bash("echo alive"), FINISH]), tiny_task,
                         sandbox_config)
    assert trajectory.termination == "submitted" and trajectory.scored, trajectory.error
    killed, denied, alive = (turn.observation for turn in trajectory.turns[:3])
    assert "the tool's process was killed (signal 9" in killed, killed
    assert "Operation not permitted" in denied and alive.endswith("alive"), (denied, alive)
    assert trajectory.patch == ""


def test_an_agent_that_deletes_git_and_the_snapshot_keeps_its_patch(scripted, tiny_task, sandbox_config):
    """Its user may empty the workspace's .git but not the snapshot, so the patch is still the workspace's."""
    fix = "sed -i 's/left_operand - right/left_operand + right/' calc/ops.py"
    trajectory = episode(scripted([bash(f"{fix}; rm -rf /testbed/.git /var/lib/patchgym/base.git"), FINISH]),
                         tiny_task, sandbox_config)
    assert trajectory.termination == "submitted", trajectory.error
    assert "Permission denied" in trajectory.turns[0].observation
    assert "+    return left_operand + right_operand" in trajectory.patch
    assert grade_patch(tiny_task, trajectory.patch, sandbox_config).resolved


def test_a_sandbox_killed_from_outside_during_an_agent_command_is_an_infra_error(scripted, tiny_task, sandbox_config,
                                                                                 kill_from_outside):
    import threading

    config = AgentConfig()
    with open_env(sandbox_config, config) as env:
        class KillsDuringTheCommand:
            """Wraps the fake engine; kills the sandbox from outside while the agent's `sleep` runs."""

            tokenizer = scripted([]).tokenizer
            needs_messages = False
            inner = scripted([bash("sleep 20"), FINISH])

            def generate(self, prompt_ids, params):
                threading.Timer(2.0, lambda: kill_from_outside(env.sandbox)).start()
                return self.inner.generate(prompt_ids, params)

        trajectory = run_agent(tiny_task, KillsDuringTheCommand(), env, config)
    assert trajectory.termination == "infra_error", trajectory.error
