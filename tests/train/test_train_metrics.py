"""Metrics to Weights & Biases beside metrics.jsonl: a real wandb run in offline mode (no network), inside the run
directory, read back from its transaction log; a resumed run continues the same W&B run."""

import json
import struct
from pathlib import Path

from patchgym.train.metrics import MetricsLog
from patchgym.train.metrics_schema import read_metrics

BLOCK = 32 * 1024  # the .wandb file is a LevelDB-style log: records in 32 KiB blocks, 7-byte chunk headers


def wandb_records(path: Path):
    """The protobuf records of a run-*.wandb file (full chunks, or first/middle/last ones joined)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    position, pending = 7, b""
    while position + 7 <= len(data):
        room = BLOCK - position % BLOCK
        _, length, kind = struct.unpack("<IHB", data[position:position + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # a block's zero-filled tail
            position += room
            continue
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(path: Path) -> list[dict]:
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]


def line(iteration: int) -> dict:
    return {"iteration": iteration, "reward_mean": 0.25 * iteration, "nonzero_advantage_group_fraction": 0.5,
            "termination_fractions": {"submitted": 0.75, "format_errors": 0.25}, "terminations": {"submitted": 3},
            "loss": None}


def test_wandb_offline_run_in_the_run_directory_holds_the_logged_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside tmp_path
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    run = tmp_path / "run"
    metrics = MetricsLog(run, loggers=["jsonl", "wandb"], config={"train": {"lr": 0.01}})
    metrics.write({"iteration": 0, "warm_start": {"trajectories": 4, "tokens": 480, "sft_loss": [2.0, 1.0]}})
    metrics.write(line(1))
    metrics.close()
    assert [m["iteration"] for m in read_metrics(run)] == [0, 1]
    (first,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    rows = history(first)
    assert [r["_step"] for r in rows] == [0, 1]
    assert rows[0]["warm_start/trajectories"] == 4 and rows[0]["warm_start/tokens"] == 480
    assert rows[1]["reward_mean"] == 0.25 and rows[1]["nonzero_advantage_group_fraction"] == 0.5
    assert rows[1]["termination_fractions/format_errors"] == 0.25 and rows[1]["terminations/submitted"] == 3
    assert "loss" not in rows[1] and "iteration" not in rows[1]
    (started,) = [r.run for r in wandb_records(first) if r.WhichOneof("record_type") == "run"]
    assert {i.key: json.loads(i.value_json) for i in started.config.update}["train"] == {"lr": 0.01}

    resumed = MetricsLog(run, resume_after=1, loggers=["jsonl", "wandb"])  # the same W&B run goes on
    resumed.write(line(2))
    resumed.close()
    logs = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2 and {p.name for p in logs} == {first.name}  # run-<id>.wandb: one id
    (second,) = [p for p in logs if p != first]
    assert [r["_step"] for r in history(second)] == [2]
