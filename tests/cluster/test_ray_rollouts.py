"""cluster.backend=ray on a real 3-node Ray cluster (head + 2 worker raylets) with local sandboxes: rollouts spread
over the nodes, a half-written store resumes, and a node killed mid-iteration loses nothing and counts nothing twice."""

import json
import sys
import time

import pytest
import ray
import ray.cloudpickle
from ray_nodes import alive_actors, kill_when_busy, reap_after_kill

from patchgym.agent.scripts import OracleScript
from patchgym.cluster import make_rollouts
from patchgym.config import load_config
from patchgym.env.tools.calls import ToolCall, render_call_xml
from patchgym.rollout import ScriptedAgent

# Workers on other raylets cannot import this test module: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.parametrize("backend", ["local"], indirect=True)  # bubblewrap sandboxes start fastest


class SlowOracle(OracleScript):
    """Sleeps `seconds` in a tool call first, so a node can be killed while its episode is running."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def act(self, task, observation, turn):
        if turn == 0:
            return render_call_xml(ToolCall("execute_bash", {"command": f"sleep {self.seconds}"}))
        return super().act(task, observation, turn - 1)


def ray_config(backend: str, *extra: str):
    return load_config(overrides=["cluster.backend=ray", f"sandbox.backend={backend}", "rollout.max_sandboxes=1",
                                  *extra])


def ids_in(path) -> list[str]:
    return [json.loads(line)["trajectory_id"] for line in path.read_text().splitlines()]


def test_rollouts_run_on_every_node(ray_cluster, backend, tiny_task, tmp_path):
    engine = make_rollouts(ray_config(backend), ScriptedAgent(OracleScript()), run_dir=tmp_path, progress=False)
    trajectories = engine.run([tiny_task], samples=3)
    assert [t.trajectory_id for t in trajectories] == [f"{tiny_task.instance_id}#{s}" for s in range(3)]
    assert all(t.resolved and t.termination == "submitted" for t in trajectories)
    # One trajectory in flight per worker (max_sandboxes=1) and three workers: one on each node.
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(alive) == 3 and {t.node for t in trajectories} == alive
    assert sorted(ids_in(tmp_path / "trajectories.jsonl")) == sorted(t.trajectory_id for t in trajectories)
    assert engine.stats.done == 3 and engine.stats.resolved == 3 and engine.stats.reassigned == 0
    assert alive_actors() == []  # the workers end with the run


def test_a_half_written_store_resumes(ray_cluster, backend, tiny_task, tmp_path):
    agent = ScriptedAgent(OracleScript())
    make_rollouts(ray_config(backend), agent, run_dir=tmp_path, progress=False).run([tiny_task], samples=2)
    path = tmp_path / "trajectories.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2])  # a crash cut the second line
    engine = make_rollouts(ray_config(backend), agent, run_dir=tmp_path, progress=False)
    trajectories = engine.run([tiny_task], samples=3)
    assert engine.stats.resumed == 1 and engine.stats.done == 3 and all(t.resolved for t in trajectories)
    assert path.read_text().startswith(first + "\n") and len(ids_in(path)) == 3
    assert sorted(ids_in(path)) == sorted(t.trajectory_id for t in trajectories)
    again = make_rollouts(ray_config(backend), agent, run_dir=tmp_path, progress=False)
    start = time.monotonic()
    assert again.run([tiny_task], samples=3) == trajectories and again.stats.resumed == 3
    assert time.monotonic() - start < 5  # everything recorded: no worker was started


def test_a_node_killed_mid_iteration_loses_nothing(ray_cluster, victim, backend, tiny_task, tmp_path):
    engine = make_rollouts(ray_config(backend), ScriptedAgent(SlowOracle(6)), run_dir=tmp_path, progress=False)
    kill = kill_when_busy(ray_cluster, victim, after_s=2.0)
    start = time.monotonic()
    trajectories = engine.run([tiny_task], samples=6)
    kill["thread"].join(timeout=10)
    assert "killed_at" in kill, kill.get("error")
    assert kill["busy"] == 1  # it was playing an episode when it died

    ids = ids_in(tmp_path / "trajectories.jsonl")
    assert sorted(ids) == sorted(f"{tiny_task.instance_id}#{s}" for s in range(6))  # each exactly once
    assert [t.trajectory_id for t in trajectories] == [f"{tiny_task.instance_id}#{s}" for s in range(6)]
    assert all(t.resolved and t.termination == "submitted" and t.attempt == 1 for t in trajectories)
    assert engine.stats.reassigned == 1 and engine.stats.lost_nodes == [victim.node_id]
    assert engine.stats.done == 6 and engine.stats.resolved == 6
    survivors = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert victim.node_id not in survivors and len(survivors) == 2
    # Killed during its first episode, the victim recorded nothing: that episode ran again on a survivor.
    assert not any(t.node == victim.node_id for t in trajectories)
    print(f"node kill: {len(trajectories)} trajectories in {time.monotonic() - start:.1f} s, "
          f"{engine.stats.reassigned} reassigned, by node "
          f"{ {n[:8]: sum(t.node == n for t in trajectories) for n in {t.node for t in trajectories}} }")

    assert reap_after_kill(victim) == []  # the dead node's sandboxes had no owner left to close them
