"""`patchgym train --resume` after `kill -9` at several points: mid-rollouts, right after a checkpoint, and right
after a metrics line. No finished rollout is lost or counted twice, and every iteration is logged exactly once."""

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from patchgym.sandbox.reaper import leftovers, reap
from patchgym.tasks import write_tasks
from patchgym.train.checkpoint import latest_checkpoint, read_state
from patchgym.train.metrics_schema import read_metrics

ITERATIONS, G = 3, 4


def start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen([str(Path(sys.executable).with_name("patchgym")), "train", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def kill_when(process: subprocess.Popen, ready, log: Path, timeout: float = 120) -> None:
    """SIGKILL `process` as soon as `ready()` holds."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None, f"the run ended before the kill point:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no kill point within {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
    process.kill()
    process.wait()


def recorded(path: Path) -> list[str]:
    """Trajectory ids of the whole lines of a trajectories.jsonl (a line cut by the kill is not recorded)."""
    if not path.exists():
        return []
    return [json.loads(line)["trajectory_id"] for line in path.read_text().splitlines(keepends=True)
            if line.endswith("\n")]


def whole_lines(path: Path) -> str:
    text = path.read_text() if path.exists() else ""
    return text[: text.rfind("\n") + 1]


def test_kill_9_then_resume_loses_and_repeats_nothing(backend, tiny, tiny_task, tmp_path):
    if backend != "docker":
        pytest.skip("the resume test runs on the docker backend")
    tasks = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "inference": {"model": "tiny"},
        "agent": {"max_steps": 2, "sampling": {"max_new_tokens": 8}},
        "rollout": {"max_sandboxes": 1},  # one episode at a time, so a kill lands between recorded trajectories
        "train": {"tasks": str(tasks), "iterations": ITERATIONS, "tasks_per_iteration": 1, "samples_per_task": G,
                  "lr": 0.01, "keep_checkpoints": 1},
    }))
    run, log = tmp_path / "run", tmp_path / "train.log"
    run_id = f"train-resume-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATCHGYM_RUN_ID": run_id}
    rollouts = lambda n: run / "rollouts" / f"iter-{n}" / "trajectories.jsonl"  # noqa: E731

    # 1. Mid-rollouts of iteration 1, once some trajectories are recorded.
    kill_when(start(["-c", str(config), "--out", str(run)], env, log), lambda: len(recorded(rollouts(1))) >= 1, log)
    before_1 = whole_lines(rollouts(1))
    assert 1 <= len(recorded(rollouts(1))) < G
    assert latest_checkpoint(run) is None

    # 2. Right after iteration 1's checkpoint (resuming reads RUN/config.yaml).
    kill_when(start(["--resume", "--out", str(run)], env, log), lambda: latest_checkpoint(run) is not None, log)
    assert rollouts(1).read_text().startswith(before_1)  # recorded trajectories kept verbatim

    # 3. Right after iteration 2's metrics line, perhaps before its checkpoint.
    kill_when(start(["--resume", "--out", str(run)], env, log),
              lambda: any(m["iteration"] == 2 for m in read_metrics(run)), log)
    before_2 = whole_lines(rollouts(2))

    finished = start(["--resume", "--out", str(run)], env, log)
    assert finished.wait(timeout=300) == 0, log.read_text()[-3000:]

    assert rollouts(1).read_text().startswith(before_1) and rollouts(2).read_text().startswith(before_2)
    for n in range(1, ITERATIONS + 1):
        ids = Counter(recorded(rollouts(n)))
        assert ids == Counter({f"{tiny_task.instance_id}#{s}": 1 for s in range(G)}), (n, ids)
    metrics = read_metrics(run)
    assert [m["iteration"] for m in metrics] == list(range(1, ITERATIONS + 1))
    assert all(m["trajectories"] == G for m in metrics)
    state = read_state(latest_checkpoint(run))
    assert state["iteration"] == ITERATIONS and state["optimizer_steps"] == ITERATIONS
    assert "metrics:" in log.read_text()

    reap()  # scratch left by the killed runs; their containers removed themselves
    assert leftovers(run_id) == []
