"""An RL iteration of the Trainer with cluster.backend=ray on a real 3-node Ray cluster: the tiny model serves from
one engine actor, rollout workers on every node sample from it, the policy trains in a TrainerWorker actor, a worker
node is killed mid-rollouts, and nothing is lost: every trajectory is recorded once, trained on, and the engine actor
ends up with the trainer worker's weights. The trainer worker goes on the node cluster.trainer_resource names, writes
the run's checkpoints there, and a resumed run continues from them."""

import json
import time

import pytest
import ray
import torch
from ray_nodes import alive_actors, kill_when_busy, reap_after_kill

from patchgym.config import load_config
from patchgym.inference.models import load_model
from patchgym.tasks import write_tasks
from patchgym.train.checkpoint import latest_checkpoint, read_state
from patchgym.train.loop import Trainer, TrainError
from patchgym.train.metrics_schema import read_metrics

G = 6


class EngineWatch(Trainer):
    """The Trainer, keeping what its engine actor and its trainer worker hold after setup and after each iteration,
    and the worker's node (the actors are gone once run returns)."""

    def _setup(self, checkpoint, **kwargs):
        state = super()._setup(checkpoint, **kwargs)
        self.initial_weights = ray.get(self.policy.worker.state_dict.remote())
        return state

    def iteration(self, state):
        record = super().iteration(state)
        self.engine_weights = ray.get(self.engine.actor.state_dict.remote())
        self.trained_weights = ray.get(self.policy.worker.state_dict.remote())
        self.trainer_node = ray.get(self.policy.worker.node.remote())
        return record


@pytest.mark.parametrize("backend", ["local"], indirect=True)
def test_an_iteration_survives_a_dead_node(ray_cluster, victim, backend, tiny, tiny_task, tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = load_config(overrides=[
        "cluster.backend=ray", f"sandbox.backend={backend}", "inference.model=tiny", f"train.tasks={tasks_file}",
        "train.iterations=1", "train.tasks_per_iteration=1", f"train.samples_per_task={G}", "train.lr=0.01",
        "train.weight_decay=0.1", "agent.max_steps=2", "agent.sampling.max_new_tokens=8", "rollout.max_sandboxes=1",
        "algorithm.advantage=rloo"])
    trainer = EngineWatch(config, tmp_path / "run", progress=False)
    kill = kill_when_busy(ray_cluster, victim, after_s=0.3)
    start = time.monotonic()
    trainer.run()
    took = time.monotonic() - start
    kill["thread"].join(timeout=10)
    assert "killed_at" in kill, kill.get("error")

    records = [json.loads(line) for line in
               (tmp_path / "run" / "rollouts" / "iter-1" / "trajectories.jsonl").read_text().splitlines()]
    ids = [r["trajectory_id"] for r in records]
    assert sorted(ids) == sorted(f"{tiny_task.instance_id}#{s}" for s in range(G))  # each once, none lost
    assert all(r["termination"] != "infra_error" and r["engine"]["class"] == "RemoteEngine" for r in records)
    nodes = {r["node"] for r in records}
    # The victim had an episode in flight when it died (kill["busy"]); that one was replayed by a survivor. An
    # episode it finished before the kill (the tiny model's are short) is recorded once, like any other.
    assert kill["busy"] >= 1 and len(nodes - {victim.node_id}) == 2

    (line,) = read_metrics(tmp_path / "run")
    assert line["trajectories"] == G and line["trained_trajectories"] == G and line["optimizer_steps"] == 1
    trained = trainer.trained_weights
    assert trainer.trainer_node == ray.get_runtime_context().get_node_id()  # trainer_resource null: the driver's
    assert trainer.engine_weights.keys() == trained.keys()
    assert all(torch.equal(trainer.engine_weights[k], trained[k]) for k in trained)
    print(f"trainer on ray: {G} trajectories, node killed with {kill['busy']} episode(s) on it, iteration took "
          f"{took:.1f} s, by node { {n[:8]: sum(r['node'] == n for r in records) for n in nodes} }")

    assert reap_after_kill(victim) == []  # the dead node's sandboxes had no owner left to close them
    assert alive_actors() == []  # the engine actor and the rollout workers are gone


@pytest.mark.parametrize("backend", ["local"], indirect=True)
def test_the_trainer_worker_trains_on_its_node_checkpoints_and_resumes(ray_cluster, backend, tiny, tiny_task,
                                                                       tmp_path):
    here = ray.get_runtime_context().get_node_id()
    node, resource = next((n["NodeID"], r) for n in ray.nodes() if n["Alive"] and n["NodeID"] != here
                          for r in n["Resources"] if r.startswith("node-"))
    tasks_file, run = tmp_path / "tasks.jsonl", tmp_path / "run"
    write_tasks([tiny_task], tasks_file)
    overrides = [
        "cluster.backend=ray", f"cluster.trainer_resource={resource}", f"sandbox.backend={backend}",
        "inference.model=tiny", f"train.tasks={tasks_file}", "train.tasks_per_iteration=1", "train.samples_per_task=2",
        "train.lr=0.01", "train.weight_decay=0.1", "train.warmup_steps=4", "agent.max_steps=2",
        "agent.sampling.max_new_tokens=8", "rollout.max_sandboxes=1", "algorithm.advantage=rloo"]
    first = EngineWatch(load_config(overrides=[*overrides, "train.iterations=1"]), run, progress=False)
    first.run()
    assert first.trainer_node == node  # the update ran in the worker on the node with the resource
    trained = first.trained_weights
    assert all(torch.equal(first.engine_weights[k], v) for k, v in trained.items())  # pushed worker -> engine
    assert any(not torch.equal(first.initial_weights[k], v) for k, v in trained.items())  # the step moved it

    checkpoint = latest_checkpoint(run)  # written by the worker, in the usual layout: one process loads it
    assert checkpoint.name == "iter-1" and read_state(checkpoint)["iteration"] == 1
    saved = load_model(str(checkpoint / "model"), "cpu")[0].state_dict()
    assert all(torch.equal(saved[k], v) for k, v in trained.items())

    second = EngineWatch(load_config(overrides=[*overrides, "train.iterations=2"]), run, progress=False)
    second.run(resume=True)
    assert second.trainer_node == node
    assert all(torch.equal(second.initial_weights[k], v) for k, v in trained.items())  # from the checkpoint
    assert all(torch.equal(second.engine_weights[k], v) for k, v in second.trained_weights.items())
    lines = read_metrics(run)
    assert [m["iteration"] for m in lines] == [1, 2] and lines[1]["optimizer_steps"] == 2
    assert [m["lr"] for m in lines] == pytest.approx([0.01 * 2 / 4, 0.01 * 3 / 4])  # the schedule went on
    assert latest_checkpoint(run).name == "iter-2"
    assert alive_actors() == []


def test_a_trainer_resource_no_node_has_is_named(ray_cluster, tiny, tiny_task, tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = load_config(overrides=["cluster.backend=ray", "cluster.trainer_resource=no-such-node",
                                    "inference.model=tiny", f"train.tasks={tasks_file}", "train.tasks_per_iteration=1"])
    with pytest.raises(TrainError, match="cluster.trainer_resource: no alive Ray node advertises 'no-such-node'"):
        Trainer(config, tmp_path / "run", progress=False).run()
    assert alive_actors() == []  # the engine actor started before it is closed
