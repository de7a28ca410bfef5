"""The rollout engine on real sandboxes: real grading with retries of infrastructure errors, the record and resume,
and a 100 MB diff measured in the sandbox but never sent back.

What needs no sandbox (every sample played, graded and recorded once under the sandbox bound, resuming with more
samples on an append-only record, a line cut by a crash, a grading infra error, the separate bounds of sandboxes and
generations) is proven in the fast tier (test_rollout_memory.py). The engine is the same on every backend, so its
test runs on docker (each backend's sandbox contract is tests/sandbox's); the 100 MB diff runs on each backend, as
nothing else measures a diff over the limit inside each backend's sandbox."""

import asyncio
import json

import pytest

from patchgym.agent.config import AgentConfig
from patchgym.agent.scripts import OracleScript
from patchgym.agent.trajectory import Trajectory
from patchgym.env.tools import ToolCall, render_call_xml
from patchgym.eval.metrics import summarize
from patchgym.rollout import RolloutConfig, RolloutEngine, ScriptedAgent
from patchgym.sandbox import SandboxConfig


@pytest.fixture
def sandbox_config(backend):
    return SandboxConfig(backend=backend)


class Probe(ScriptedAgent):
    """The oracle, counting its episodes and how many ran at once; `fail(sample, attempt)` says which raise."""

    def __init__(self, fail=lambda sample, attempt: False, hold_s: float = 0.0):
        super().__init__(OracleScript(), AgentConfig())
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


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_an_infra_error_is_retried_then_recorded_and_never_scored(sandbox_config, tiny_task, tmp_path):
    """On real sandboxes and the real grader: a retried trajectory resolves and its record is a valid Trajectory with
    the grader's verdict; an infrastructure error that stays is recorded unscored, and resuming reruns only it."""
    flaky = Probe(fail=lambda sample, attempt: attempt == 1)  # the first attempt's engine dies
    (t,) = RolloutEngine(flaky, sandbox_config, RolloutConfig(retries=1), run_dir=tmp_path / "flaky",
                         progress=False).run([tiny_task])
    assert t.attempt == 2 and t.resolved and flaky.started == 2
    (record,) = lines(tmp_path / "flaky" / "trajectories.jsonl")
    written = Trajectory.model_validate(record)
    assert written.grade.f2p == {"tests/test_add.py::test_add": "PASSED"} and written.engine["class"] == "OracleScript"

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
    from patchgym.env.grading.grade import Grade
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
