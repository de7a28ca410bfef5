"""What the bench/gpu.sh measures share: one JSON line per measure (printed, and appended to $GPU_BENCH_OUT when
set), a measure that fails or cannot run reported as such instead of stopping the rest, the peak bf16 dense
FLOP/s by GPU name (for MFU), and the summary of all lines.

    python bench/gpu_common.py summary RESULTS.jsonl
"""

import json
import os
import sys
import traceback

# bf16 dense tensor-core peaks (no sparsity), per GPU, from the vendors' data sheets; matched on the device name.
PEAK_BF16_FLOPS = (("H200", 989e12), ("H100", 989e12), ("H800", 989e12), ("H20", 148e12), ("B200", 2250e12),
                   ("GB200", 2500e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("A10G", 70e12),
                   ("L4", 121e12))
TARGETS = {"rollout_ratio": 0.8, "mfu": 0.40}


def peak_flops(device: str) -> tuple[str, float | None]:
    """(device name, its bf16 dense peak FLOP/s, or None when the name is not in the table, e.g. a CPU)."""
    if not str(device).startswith("cuda"):
        return "cpu", None
    import torch  # here: the summary runs without it

    name = torch.cuda.get_device_name(torch.device(device))
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return name, flops
    return name, None


def emit(record: dict) -> dict:
    line = json.dumps(record)
    print(line, flush=True)
    out = os.environ.get("GPU_BENCH_OUT")
    if out:
        with open(out, "a") as results:
            results.write(line + "\n")
    return record


def measured(name: str, run, **context) -> dict:
    """emit({"measure": name, "status": "ok", **run()}), or the status and reason run() raised Unavailable with,
    or "failed" with the error's last line (the traceback goes to stderr)."""
    try:
        return emit({"measure": name, "status": "ok", **context, **run()})
    except Unavailable as exc:
        return emit({"measure": name, "status": exc.status, **context, "reason": str(exc)})
    except Exception as exc:  # one broken measure must not hide the others' figures
        traceback.print_exc()
        return emit({"measure": name, "status": "failed", **context, "error": f"{type(exc).__name__}: {exc}"[:500]})


class Unavailable(Exception):
    """A measure that cannot run here: status "skipped" (by choice, e.g. tiny mode) or "not available"."""

    def __init__(self, reason: str, status: str = "not available"):
        super().__init__(reason)
        self.status = status


def summary(path: str) -> dict:
    """One line: every measure's status, the headline figures and whether they meet the targets."""
    records = [json.loads(line) for line in open(path) if line.strip()]
    by = {}
    for record in records:
        by.setdefault(record["measure"], []).append(record)
    out: dict = {"measure": "summary", "statuses": {":".join(filter(None, (r["measure"], r.get("model"),
                                                                          r.get("engine")))): r["status"]
                                                    for r in records}}
    rollout = {(r.get("model"), r.get("engine")): r for r in by.get("rollout", []) if r["status"] == "ok"}
    for (model, engine), record in rollout.items():
        bare = rollout.get((model, "bare"))
        if engine == "patchgym" and bare:
            ratio = record["tokens_per_s"] / bare["tokens_per_s"]
            out[f"rollout_ratio:{model}"] = round(ratio, 3)
            out[f"rollout_meets_target:{model}"] = ratio >= TARGETS["rollout_ratio"]
    for record in by.get("train", []):
        if record["status"] == "ok" and record.get("mfu") is not None:
            out[f"mfu:{record['model']}"] = record["mfu"]
            out[f"mfu_meets_target:{record['model']}"] = record["mfu"] >= TARGETS["mfu"]
    for record in by.get("sync", []):
        if record["status"] == "ok":
            out[f"sync_s:{record['model']}"] = record["sync_s"]
    for record in by.get("long_context", []):
        if record["status"] == "ok":
            out[f"long_context_s:{record['model']}"] = record["step_s"]
    out["failed"] = [k for k, v in out["statuses"].items() if v == "failed"]
    return out


if __name__ == "__main__":
    if sys.argv[1:2] != ["summary"] or len(sys.argv) != 3:
        sys.exit("usage: python bench/gpu_common.py summary RESULTS.jsonl")
    os.environ.pop("GPU_BENCH_OUT", None)  # the summary is printed, not appended to the lines it sums up
    emit(summary(sys.argv[2]))
