"""Asynchronous RL with bounded staleness: rollouts of later iterations run while one trains, and no trained
trajectory lags more than rollout.max_staleness policy updates behind; S = 0 is the synchronous loop.

The pipeline test uses the two-turn synthetic environment through the real engine and real policy updates; the
trainer tests run the whole loop on the tiny model and the tiny task in Docker."""

import asyncio
import json
import random
import time

import pytest
import torch

from patchgym.inference.hf import HFEngine
from patchgym.rl.advantages import compute_advantages
from patchgym.rl.config import load_preset
from patchgym.tasks import write_tasks
from patchgym.train import synthetic
from patchgym.train.async_rollouts import PolicyVersions, RolloutPipeline
from patchgym.train.batch import sequences_from_trajectories
from patchgym.train.checkpoint import latest_checkpoint, read_state
from patchgym.train.loop import Trainer
from patchgym.train.metrics_schema import read_metrics
from patchgym.train.prepare import full_state_dict
from patchgym.train.update import make_optimizer, policy_update

from test_train_loop import tiny_config  # tests/train is on sys.path (rootdir-relative, no __init__.py)


class GatedEngine:
    """The engine as the rollout engine sees it through VersionedAgent: every generation passes the version gate,
    and the version it ran on is recorded for its batch."""

    needs_messages = False

    def __init__(self, engine: HFEngine, versions: PolicyVersions, seen: list[int]):
        self.engine, self.versions, self.seen, self.tokenizer = engine, versions, seen, engine.tokenizer

    async def agenerate(self, ids, params):
        self.seen.append(await self.versions.enter())
        try:
            return await self.engine.agenerate(ids, params)
        finally:
            self.versions.leave()


@pytest.mark.parametrize("staleness", [1, 2])
def test_rollouts_run_ahead_but_never_lag_more_than_s_updates(tiny, staleness):
    tokenizer = tiny[1]
    torch.manual_seed(0)
    policy = synthetic.small_policy(tokenizer, seed=0)
    sampler = synthetic.small_policy(tokenizer, seed=0)
    algo = load_preset("grpo++")
    optimizer = make_optimizer(policy, lr=1e-3)
    versions, iterations = PolicyVersions(), 5
    seen: dict[int, list[int]] = {}
    spans: dict[int, tuple[float, float]] = {}

    with HFEngine(sampler, tokenizer, max_batch=40) as engine:
        def produce(n: int):
            seen[n] = []
            began = time.monotonic()
            gated = GatedEngine(engine, versions, seen[n])
            trajectories = asyncio.run(play_all(gated, seed=n))
            spans[n] = (began, time.monotonic())
            return trajectories

        pipeline = RolloutPipeline(produce, versions, staleness, iterations)
        trained: dict[int, float] = {}
        try:
            for n in range(1, iterations + 1):
                trajectories = pipeline.get(n)
                rewards = torch.tensor([t.grade.reward for t in trajectories])
                advantages = compute_advantages("rloo", rewards, [t.task_id for t in trajectories])
                sequences = sequences_from_trajectories(trajectories, advantages.tolist())
                policy_update(policy, optimizer, sequences, algo, micro_token_budget=8192)
                # Training slower than rollouts, so that they run ahead as far as admission lets them.
                time.sleep(3 * (spans[1][1] - spans[1][0]) + 0.2)
                weights = full_state_dict(policy)
                versions.swap(lambda: engine.load_weights(weights))
                trained[n] = time.monotonic()
        finally:
            pipeline.close()

    assert versions.version == iterations
    lags = {n: max(n - 1 - v for v in seen[n]) for n in seen}
    print(f"S={staleness}: staleness per iteration {lags}")
    assert sorted(seen) == list(range(1, iterations + 1))
    assert all(0 <= lag <= staleness for lag in lags.values()), lags
    assert all(min(n - 1 - v for v in seen[n]) >= 0 for n in seen)  # never a version from the future
    # It ran ahead up to the bound: batch 2 started before iteration 1's update was pushed, and some batch lags S.
    assert spans[2][0] < trained[1] and max(lags.values()) == staleness


async def play_all(engine, seed: int):
    keys = list(synthetic.DIGITS)
    return await asyncio.gather(*(synthetic.play(engine, key, seed=seed * 100 + 10 * i + s,
                                                 trajectory_id=f"{synthetic.task_id(key)}#{s}")
                                  for i, key in enumerate(keys) for s in range(4)))


@pytest.fixture
def docker_task(backend, tiny_task, tmp_path):
    if backend != "docker":
        pytest.skip("the trainer tests run on the docker backend")
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    return tasks_file


def versions_of(run, n: int) -> dict[str, int]:
    lines = (run / "rollouts" / f"iter-{n}" / "trajectories.jsonl").read_text().splitlines()
    return {(x := json.loads(line))["trajectory_id"]: x["engine"]["policy_version"] for line in lines}


@pytest.mark.parametrize("staleness", [1, 2])
def test_trainer_records_versions_within_the_bound(docker_task, tiny, tmp_path, staleness):
    run = tmp_path / "run"
    config = tiny_config(tmp_path, docker_task, "train.iterations=4", f"rollout.max_staleness={staleness}",
                         "train.samples_per_task=3")
    trainer = Trainer(config, run, progress=False)
    trainer.run()
    metrics = read_metrics(run)
    assert [m["iteration"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        versions = versions_of(run, m["iteration"])
        assert len(versions) == 3
        lags = [m["iteration"] - 1 - v for v in versions.values()]
        assert all(0 <= lag <= staleness for lag in lags), (m["iteration"], versions)
        assert m["staleness_max"] == max(lags) and m["policy_version_min"] == min(versions.values())
    print(f"S={staleness}: staleness_max per iteration {[m['staleness_max'] for m in metrics]}")
    engine, trained = trainer.engine.model.state_dict(), full_state_dict(trainer.model)
    assert all(torch.equal(engine[k], trained[k]) for k in trained)  # the last push landed


def comparable(line: dict) -> dict:
    """A metrics line without timings, and without the engine-vs-trainer logprob gap: the engine's batch make-up
    (which requests share a forward pass) varies from run to run and moves its logprobs by ~1e-9."""
    return {k: v for k, v in line.items() if not k.startswith("time_") and not k.endswith("_per_s")
            and k not in ("seconds", "rollout_logprob_gap", "tis_weight_mean")}


def test_synchronous_runs_are_on_policy_and_reproducible(docker_task, tiny, tmp_path):
    """S = 0: every trajectory of iteration n is sampled by version n - 1 (staleness 0), and with a sampling seed
    two runs give the same metrics and weights."""
    results = []
    for name in ("a", "b"):
        config = tiny_config(tmp_path, docker_task, "train.iterations=3", "agent.sampling.seed=7")
        trainer = Trainer(config, tmp_path / name, progress=False)
        trainer.run()
        results.append((read_metrics(tmp_path / name), full_state_dict(trainer.model)))
        for n in (1, 2, 3):
            assert set(versions_of(tmp_path / name, n).values()) == {n - 1}
    (metrics_a, weights_a), (metrics_b, weights_b) = results
    assert [comparable(m) for m in metrics_a] == [comparable(m) for m in metrics_b]
    assert all(m["staleness_max"] == 0 for m in metrics_a)
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


class CrashAfterCheckpoint(Trainer):
    """Stops (as a crash would) right after iteration `at`'s checkpoint, once the run-ahead rollouts of the next
    iteration have recorded a trajectory."""

    at = 2

    def _checkpoint(self, state):
        path = super()._checkpoint(state)
        if state.iteration == self.at:
            ahead = self.out / "rollouts" / f"iter-{self.at + 1}" / "trajectories.jsonl"
            deadline = time.monotonic() + 60
            while not (ahead.exists() and ahead.read_text().count("\n") >= 1):
                assert time.monotonic() < deadline, "the next iteration's rollouts never recorded a trajectory"
                time.sleep(0.05)
            raise KeyboardInterrupt
        return path


def test_resume_with_rollouts_run_ahead_loses_and_repeats_nothing(docker_task, tiny, tmp_path):
    """A crash after iteration 2 leaves iteration 3's rollouts partly recorded; the resumed run draws the same task
    and keeps them (with their older versions, still within S), running only the rest."""
    run = tmp_path / "run"
    config = tiny_config(tmp_path, docker_task, "train.iterations=3", "rollout.max_staleness=1",
                         "train.samples_per_task=4", "rollout.max_sandboxes=1")
    with pytest.raises(KeyboardInterrupt):
        CrashAfterCheckpoint(config, run, progress=False).run()
    before = versions_of(run, 3)
    assert 1 <= len(before) <= 4 and set(before.values()) <= {1, 2}
    assert read_state(latest_checkpoint(run))["iteration"] == 2

    random.seed(123)  # the resumed run must take its randomness from the checkpoint, not from here
    Trainer(config, run, progress=False).run(resume=True)
    lines = (run / "rollouts" / "iter-3" / "trajectories.jsonl").read_text().splitlines()
    ids = [json.loads(line)["trajectory_id"] for line in lines]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 4
    after = versions_of(run, 3)
    assert all(after[k] == v for k, v in before.items())  # the recorded ones were kept, not rerun
    assert all(2 - v <= 1 for v in after.values())
    assert [m["iteration"] for m in read_metrics(run)] == [1, 2, 3]
    assert read_metrics(run)[-1]["trajectories"] == 4
