"""The rollout engine against the in-memory Env and grader (the fast tier: no sandbox): every trajectory played,
graded and recorded once, the sandbox bound, retries of infrastructure errors, empty patches, resume."""

import asyncio
import json

from memory_env import MemoryEnv, memory_grade, memory_task
from patchgym.agent.config import AgentConfig
from patchgym.agent.trajectory import reward
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.rollout import RolloutConfig, RolloutEngine, ScriptedAgent
from patchgym.sandbox import SandboxConfig

FIX = render_call_xml(ToolCall("file_editor", {"command": "str_replace", "path": "calc.py",
                                                "old_str": "a - b", "new_str": "a + b"}))
FINISH = render_call_xml(ToolCall("finish", {}))


class Fixes:
    """Fixes the bug, then submits."""

    def act(self, task, observation, turn):
        return FIX if turn == 0 else FINISH


class Counting(ScriptedAgent):
    """Counts episodes, and how many ran at once."""

    def __init__(self, policy=None):
        super().__init__(policy or Fixes(), AgentConfig())
        self.running = self.peak = self.started = 0

    async def play(self, task, env, generate, save_path):
        self.started += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.01)
            return await super().play(task, env, generate, save_path)
        finally:
            self.running -= 1


def engine(agent, tmp_path, make_env=lambda pools: MemoryEnv(), **config) -> RolloutEngine:
    return RolloutEngine(agent, SandboxConfig(), RolloutConfig(**config), run_dir=tmp_path, progress=False,
                         make_env=make_env, grader=memory_grade)


def test_every_sample_is_played_graded_and_recorded_once(tmp_path):
    agent = Counting()
    tasks = [memory_task(0), memory_task(1)]
    trajectories = engine(agent, tmp_path, max_sandboxes=2).run(tasks, samples=3)
    assert [t.trajectory_id for t in trajectories] == [f"memory.calc.{n}#{s}" for n in (0, 1) for s in range(3)]
    assert all(t.resolved and reward(t) == 1.0 and t.grade.outcome == "resolved" for t in trajectories)
    assert agent.peak == 2
    lines = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["trajectory_id"] for r in lines) == sorted(t.trajectory_id for t in trajectories)
    assert not (tmp_path / "partial").exists()


def test_an_infra_error_is_retried_then_recorded_unscored(tmp_path):
    attempts = []

    def dies_first(pools):
        attempts.append(1)
        return MemoryEnv(die_on_step=1 if len(attempts) == 1 else None)

    (t,) = engine(Counting(), tmp_path, make_env=dies_first, retries=1).run([memory_task()])
    assert t.attempt == 2 and t.resolved and len(attempts) == 2
    (dead,) = engine(Counting(), tmp_path / "dead", make_env=lambda pools: MemoryEnv(die_on_step=1),
                     retries=1).run([memory_task()])
    assert dead.termination == "infra_error" and dead.attempt == 2 and not dead.scored and dead.grade is None


def test_a_sandbox_the_agent_killed_is_scored_zero_once_and_counted(tmp_path):
    from patchgym.eval.metrics import summarize

    envs = []

    def killed(pools):
        envs.append(MemoryEnv(killed_on_step=1))
        return envs[-1]

    (t,) = engine(Counting(), tmp_path, make_env=killed, retries=2).run([memory_task()])
    assert t.termination == "sandbox_killed" and t.attempt == 1 and len(envs) == 1, "not retried"
    assert t.scored and t.grade is None and reward(t) == 0.0 and "killed the sandbox" in t.error
    summary = summarize([t], runs=1)
    assert summary["infra_errors"] == 0 and summary["pass@1"] == 0.0
    assert summary["by_termination"]["sandbox_killed"]["count"] == 1


def test_an_empty_patch_is_not_graded(tmp_path):
    class Null:
        def act(self, task, observation, turn):
            return FINISH

    (t,) = engine(Counting(Null()), tmp_path).run([memory_task()])
    assert t.grade.error == "empty_patch" and t.grade.outcome == "empty_patch" and reward(t) == 0.0


def test_a_rerun_resumes_what_is_recorded(tmp_path):
    engine(Counting(), tmp_path).run([memory_task()], samples=2)
    path = tmp_path / "trajectories.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2])  # a crash cut the last line
    again = Counting()
    trajectories = engine(again, tmp_path).run([memory_task()], samples=2)
    assert again.started == 1 and [t.sample for t in trajectories] == [0, 1]
    assert len(path.read_text().splitlines()) == 2


def test_a_patch_too_large_is_recorded_scored_and_not_graded(tmp_path):
    graded = []
    agent = Counting()
    agent.config = AgentConfig(max_patch_bytes=10)
    (t,) = RolloutEngine(agent, SandboxConfig(), run_dir=tmp_path, progress=False, make_env=lambda pools: MemoryEnv(),
                         grader=lambda *a: graded.append(a)).run([memory_task()])
    assert t.termination == "patch_too_large" and t.grade is None and t.scored and reward(t) == 0.0
    assert graded == [] and t.patch == ""


def test_a_diff_the_agent_broke_is_its_outcome_not_an_infra_error(tmp_path):
    class BreaksGit:
        def act(self, task, observation, turn):
            return [FIX, render_call_xml(ToolCall("execute_bash", {"command": "break git"})), FINISH][turn]

    (t,) = engine(Counting(BreaksGit()), tmp_path, retries=2).run([memory_task()])
    assert t.termination == "patch_failed" and t.attempt == 1, "not retried"
    assert t.scored and t.grade is None and reward(t) == 0.0 and "not a git repository" in t.error
