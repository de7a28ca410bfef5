"""bench/gpu.sh --tiny: the GPU benchmark's code paths on CPU (2 gloo ranks, a 2-layer Qwen3 written to disk with
random weights), so the script cannot rot before a GPU runs it. The vLLM measures are skipped there, and say so."""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# qwen3-tiny (bench/gpu_models.py): embedding 2048 x 128 (tied with lm_head); per layer q, o 128 x 128, k, v
# 128 x 64, gate, up, down 128 x 256, q/k norms 32 each, 2 layer norms 128 each; a final norm of 128.
TINY_PARAMS = 2048 * 128 + 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 32 + 2 * 128) + 128


def test_the_tiny_mode_runs_every_measure_and_reports_each(tmp_path):
    shm_before = set(os.listdir("/dev/shm"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}  # run as README shows it: the project's .venv
    done = subprocess.run([str(ROOT / "bench" / "gpu.sh"), "--tiny", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by = {(r["measure"], r.get("engine")): r for r in lines}
    train = by["train", None]
    assert train["status"] == "ok" and train["ranks"] == 2 and train["params"] == TINY_PARAMS
    assert train["tokens_per_step"] == 2 * 2 * 256 and train["tokens_per_s"] > 0 and train["mfu"] is None  # CPU
    gather = by["sync_gather", None]
    assert gather["status"] == "ok" and gather["checked"] and gather["buckets"] > 2
    assert gather["tensors"] == 24  # 11 per layer, the embedding and the final norm; the tied lm_head once
    assert by["long_context", None]["status"] in {"ok", "not available"}
    for key in [("rollout", "bare"), ("rollout", "patchgym"), ("sync", None)]:
        assert by[key]["status"] == "skipped" and "tiny mode" in by[key]["reason"]
    summary = lines[-1]
    assert summary["measure"] == "summary" and summary["failed"] == []
    assert summary["statuses"]["train:qwen3-tiny"] == "ok"
    assert [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()] == lines[:-1]
    assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("patchgym-push-")}
