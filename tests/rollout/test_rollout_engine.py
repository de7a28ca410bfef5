"""The rollout engine on real sandboxes: bounds, retries of infrastructure errors, the append-only record and resume."""

import asyncio
import json
import time

import pytest

from patchgym.agent.config import AgentConfig
from patchgym.agent.reference import OraclePolicy
from patchgym.agent.trajectory import Trajectory
from patchgym.eval.metrics import summarize
from patchgym.inference import Generation, SamplingParams
from patchgym.rollout import RolloutConfig, RolloutEngine, ScriptedAgent, TrajectoryStore
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.sandbox import SandboxConfig


@pytest.fixture
def sandbox_config(backend):
    return SandboxConfig(backend=backend)


class Probe(ScriptedAgent):
    """The oracle, counting its episodes and how many ran at once; `fail(sample, attempt)` says which raise."""

    def __init__(self, fail=lambda sample, attempt: False, hold_s: float = 0.0):
        super().__init__(OraclePolicy(), AgentConfig())
        self.fail, self.hold_s = fail, hold_s
        self.started = self.running = self.peak = 0
        self.attempts: dict[int, int] = {}

    async def play(self, task, env, generate, save_path):
        sample = int(save_path.stem.rsplit("#", 1)[1])
        self.attempts[sample] = self.attempts.get(sample, 0) + 1
        self.started += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.hold_s)
            if self.fail(sample, self.attempts[sample]):
                raise RuntimeError("the engine died")
            return await super().play(task, env, generate, save_path)
        finally:
            self.running -= 1


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_g_samples_each_graded_and_recorded_once(sandbox_config, tiny_task, tmp_path):
    agent = Probe(hold_s=0.2)
    engine = RolloutEngine(agent, sandbox_config, RolloutConfig(max_sandboxes=2), run_dir=tmp_path, progress=False)
    trajectories = engine.run([tiny_task], samples=4)
    assert [t.trajectory_id for t in trajectories] == [f"{tiny_task.instance_id}#{s}" for s in range(4)]
    assert [t.sample for t in trajectories] == [0, 1, 2, 3]
    assert all(t.resolved and t.termination == "submitted" for t in trajectories)
    assert agent.peak == 2  # episodes (and gradings) never held more than max_sandboxes
    assert sorted(r["trajectory_id"] for r in lines(tmp_path / "trajectories.jsonl")) == sorted(
        t.trajectory_id for t in trajectories)
    assert engine.stats.resolved == 4 and engine.stats.mean_steps == 2.0
    assert not (tmp_path / "partial").exists() or not list((tmp_path / "partial").iterdir())


def test_rerunning_resumes_and_counts_nothing_twice(sandbox_config, tiny_task, tmp_path):
    first = Probe()
    RolloutEngine(first, sandbox_config, run_dir=tmp_path, progress=False).run([tiny_task], samples=2)
    before = (tmp_path / "trajectories.jsonl").read_text()
    second = Probe()
    trajectories = RolloutEngine(second, sandbox_config, run_dir=tmp_path, progress=False).run([tiny_task], samples=3)
    assert first.started == 2 and second.started == 1  # only the new sample ran
    assert len(trajectories) == 3 and (tmp_path / "trajectories.jsonl").read_text().startswith(before)
    assert len(lines(tmp_path / "trajectories.jsonl")) == 3


def test_an_infra_error_is_retried_then_recorded_and_never_scored(sandbox_config, tiny_task, tmp_path):
    flaky = Probe(fail=lambda sample, attempt: attempt == 1)  # the first attempt's engine dies
    (t,) = RolloutEngine(flaky, sandbox_config, RolloutConfig(retries=1), run_dir=tmp_path / "flaky",
                         progress=False).run([tiny_task])
    assert t.attempt == 2 and t.resolved and flaky.started == 2

    broken = Probe(fail=lambda sample, attempt: sample == 0)  # sample 0 fails all 3 attempts
    engine = RolloutEngine(broken, sandbox_config, RolloutConfig(retries=2, max_sandboxes=2),
                           run_dir=tmp_path / "broken", progress=False)
    dead, alive = engine.run([tiny_task], samples=2)
    assert dead.termination == "infra_error" and "the engine died" in dead.error and dead.attempt == 3
    assert alive.resolved and alive.attempt == 1 and broken.attempts == {0: 3, 1: 1}
    assert engine.stats.infra_errors == 1 and engine.stats.retries == 2
    summary = summarize([dead, alive], runs=2)
    assert summary["infra_errors"] == 1 and summary["pass@1"] == 1.0  # excluded, not scored 0
    # Resuming reruns the infrastructure error (and only it); the record of the rerun replaces it.
    again = Probe()
    dead2, alive2 = RolloutEngine(again, sandbox_config, run_dir=tmp_path / "broken", progress=False).run(
        [tiny_task], samples=2)
    assert again.started == 1 and dead2.resolved and alive2 == alive


def test_a_dead_grading_sandbox_is_an_infra_error(sandbox_config, tiny_task, tmp_path, monkeypatch):
    from patchgym.env.grading.grader import Grade
    from patchgym.rollout import engine as rollout_engine

    monkeypatch.setattr(rollout_engine, "grade_patch", lambda task, *a, **k: Grade(instance_id=task.instance_id,
                                                                                      error="infra"))
    (t,) = RolloutEngine(Probe(), sandbox_config, RolloutConfig(retries=0), run_dir=tmp_path,
                         progress=False).run([tiny_task])
    assert t.termination == "infra_error" and t.error.startswith("grading")


def test_a_line_cut_by_a_crash_is_dropped_and_redone(sandbox_config, tiny_task, tmp_path):
    RolloutEngine(Probe(), sandbox_config, run_dir=tmp_path, progress=False).run([tiny_task], samples=2)
    path = tmp_path / "trajectories.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2])  # the crash hit mid-write
    assert len(TrajectoryStore(path).records()) == 1 and path.read_text() == first + "\n"
    agent = Probe()
    trajectories = RolloutEngine(agent, sandbox_config, run_dir=tmp_path, progress=False).run([tiny_task], samples=2)
    assert agent.started == 1 and all(t.resolved for t in trajectories) and len(lines(path)) == 2


class SlowEngine:
    """A fake engine whose requests take a while; it records how many were in flight at once."""

    tokenizer = None
    needs_messages = False

    def __init__(self):
        self.in_flight = self.peak = 0

    async def agenerate(self, ids, params):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= 1
        return Generation([1, 2], [-0.1, -0.2], "stop")


class Generates(ScriptedAgent):
    """Samples three turns through the rollout engine's bounded sampler, then plays the oracle."""

    def __init__(self):
        super().__init__(OraclePolicy(), AgentConfig())
        self.engine = SlowEngine()

    async def play(self, task, env, generate, save_path):
        for _ in range(3):
            await generate([1], [], SamplingParams())
        return await super().play(task, env, generate, save_path)


def test_generation_and_sandboxes_have_separate_bounds(sandbox_config, tiny_task, tmp_path):
    agent = Generates()
    engine = RolloutEngine(agent, sandbox_config, RolloutConfig(max_sandboxes=4, max_generations=2),
                           run_dir=tmp_path, progress=False)
    start = time.monotonic()
    trajectories = engine.run([tiny_task], samples=4)
    assert agent.engine.peak == 2 and all(t.resolved for t in trajectories)
    assert engine.stats.sampled_tokens == 4 * 3 * 2 and time.monotonic() - start > 6 * 0.05


def test_trajectories_written_are_valid_records(sandbox_config, tiny_task, tmp_path):
    RolloutEngine(Probe(), sandbox_config, run_dir=tmp_path, progress=False).run([tiny_task])
    (record,) = lines(tmp_path / "trajectories.jsonl")
    t = Trajectory.model_validate(record)
    assert t.grade.f2p == {"tests/test_add.py::test_add": "PASSED"} and t.engine["class"] == "OraclePolicy"


class WritesABigFile(ScriptedAgent):
    """Writes 100 MB of random bytes into the workspace, then submits."""

    def __init__(self):
        super().__init__(self, AgentConfig())

    def act(self, task, observation, turn):
        if turn == 0:
            return render_call_xml(ToolCall("execute_bash", {"command": "head -c 100000000 /dev/urandom > big.bin"}))
        return render_call_xml(ToolCall("finish", {}))


def test_a_patch_over_max_patch_bytes_is_patch_too_large_and_never_graded(sandbox_config, tiny_task, tmp_path,
                                                                           monkeypatch):
    from patchgym.env.grading.grader import Grade
    from patchgym.rollout import engine as rollout_engine

    graded = []
    monkeypatch.setattr(rollout_engine, "grade_patch",
                        lambda task, *a, **k: graded.append(task) or Grade(instance_id=task.instance_id))
    (t,) = RolloutEngine(WritesABigFile(), sandbox_config, run_dir=tmp_path, progress=False).run([tiny_task])
    assert t.termination == "patch_too_large" and t.scored and t.grade is None and graded == []
    assert t.patch == "" and "over the limit of 1000000" in t.error
    size = int(t.error.split()[3])
    assert size > 100_000_000  # the whole diff was measured in the sandbox, but not sent back
    assert len((tmp_path / "trajectories.jsonl").read_bytes()) < 100_000
