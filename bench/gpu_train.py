"""bench/gpu.sh's trainer measures, under torchrun (every rank runs them; rank 0 prints the JSON lines):

    torchrun --nproc-per-node N bench/gpu_train.py --model NAME --models-dir DIR [--tiny]

The model DIR/NAME is written first when missing (bench/gpu_models.py, by rank 0).

train: patchgym's policy update (LocalPolicy.update: FSDP2 over the ranks when N > 1, bf16 autocast on CUDA,
gradient checkpointing) on random token sequences; MFU = 6 * params * tokens / seconds / (N * the GPU's peak bf16
dense FLOP/s), after one warm-up update. On CPU there is no peak in the table, so mfu is null.
sync_gather: the trainer's half of a weight push without a server: gathered_weights (FSDP2 shards gathered one
tensor at a time) packed in buckets into a reused /dev/shm segment; every bucket is read back as the engine's
worker reads it and compared with the model's weights. Seconds and the largest bucket.
long_context: one 32K-token sequence (--tiny: 1K) through the policy update with train.sequence_parallel = N, when
N > 1; else "skipped".
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from gpu_common import Unavailable, measured, peak_flops  # beside this script
from gpu_models import ensure_model


def make_config(model_dir: str, device: str, world: int, tokens: int, **train):
    from patchgym.config import Config

    return Config.model_validate({
        "inference": {"model": model_dir, "device": device},
        "train": {"fsdp": world > 1, "bf16": device.startswith("cuda"), "gradient_checkpointing": True,
                  "micro_token_budget": tokens, "lr": 1e-6, **train}})


def random_sequences(vocab: int, count: int, length: int, seed: int = 0):
    from patchgym.train.batch import TrainSequence

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        ids = torch.randint(10, vocab, (length,), generator=gen).tolist()
        mask = [0] * (length // 4) + [1] * (length - length // 4)
        out.append(TrainSequence(ids, mask, [-1.0] * length, advantage=1.0 if i % 2 else -1.0))
    return out


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def train_measure(args, place) -> dict:
    from patchgym.rl.config import load_preset
    from patchgym.train.policy import LocalPolicy

    config = make_config(args.model, place.device, place.world, args.seq_len * args.sequences)
    policy = LocalPolicy(config, place)
    params = sum(p.numel() for p in policy.model.parameters())  # a DTensor's numel is the whole parameter's
    vocab, algo = policy.model.config.vocab_size, load_preset("grpo++")
    policy.update(random_sequences(vocab, args.sequences, args.seq_len // 4, seed=place.rank + 100), algo)
    sequences = random_sequences(vocab, args.sequences, args.seq_len, seed=place.rank)
    _sync(place.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        policy.update(sequences, algo)
    _sync(place.device)
    seconds = (time.perf_counter() - start) / args.steps
    tokens = args.sequences * args.seq_len * place.world  # every rank trains on its own sequences
    gpu, peak = peak_flops(place.device)
    flops = 6 * params * tokens / seconds
    return {"ranks": place.world, "device": gpu, "params": params, "tokens_per_step": tokens,
            "step_s": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            "model_tflops": round(flops / 1e12, 2), "peak_tflops_per_gpu": peak and peak / 1e12,
            "mfu": round(flops / (peak * place.world), 4) if peak else None,
            "peak_memory_mb": round(peak_memory_mb(place.device), 1), "_policy": policy}


def gather_measure(args, place, policy) -> dict:
    from patchgym.inference.vllm_worker import bucket_tensors
    from patchgym.inference.weight_push import PushStats, ShmSegment, push
    from patchgym.train.prepare import full_state_dict, gathered_weights

    bucket_bytes = int(args.bucket_mb * 2**20)
    segment = ShmSegment(1 << 20) if place.main else None
    reference = full_state_dict(policy.model)  # every rank gathers (it is a collective); rank 0 compares
    mismatched = []

    def read_back(nbytes: int, rows: list) -> None:
        with open(segment.path, "rb") as f:  # the file, as the engine's worker reads it
            raw = torch.frombuffer(bytearray(f.read(nbytes)), dtype=torch.uint8)
        for name, tensor in bucket_tensors(raw, rows):
            if not torch.equal(tensor, reference[name].detach().to("cpu", torch.bfloat16)):
                mismatched.append(name)

    _sync(place.device)
    start = time.perf_counter()
    try:
        if place.main:
            stats = push(gathered_weights(policy.model), bucket_bytes, torch.bfloat16, segment, read_back,
                         PushStats())
        else:
            for _ in gathered_weights(policy.model):  # rank 0's pulls are gathers: take part in each
                pass
    finally:
        if segment is not None:
            segment.close()
    seconds = time.perf_counter() - start
    if not place.main:
        return {}
    if mismatched:
        raise AssertionError(f"{len(mismatched)} tensors read back differ, e.g. {mismatched[:3]}")
    return {"ranks": place.world, "seconds": round(seconds, 3), "tensors": stats.tensors, "buckets": stats.buckets,
            "largest_bucket_mb": round(stats.largest_bucket / 2**20, 1), "pushed_mb": round(stats.bytes / 2**20, 1),
            "bucket_mb": args.bucket_mb, "checked": True, "checkpoint_written": False}


def long_measure(args, world: int) -> dict:
    if world < 2:
        raise Unavailable(f"sequence parallelism needs 2 or more ranks, this run has {world}", status="skipped")
    from patchgym.rl.config import load_preset
    from patchgym.train.distributed import Distributed
    from patchgym.train.policy import LocalPolicy

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    place = Distributed.from_env(device, sequence_parallel=world)
    config = make_config(args.model, place.device, world, args.long_len, sequence_parallel=world)
    policy = LocalPolicy(config, place)
    algo = load_preset("grpo++")
    sequences = random_sequences(policy.model.config.vocab_size, 1, args.long_len, seed=7)  # the same on every rank
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _sync(place.device)
    start = time.perf_counter()
    metrics = policy.update(sequences, algo)
    _sync(place.device)
    return {"ranks": world, "sequence_parallel": world, "tokens": args.long_len,
            "step_s": round(time.perf_counter() - start, 3), "loss_finite": all(
                v == v for v in metrics.values() if isinstance(v, float)),
            "peak_memory_mb_per_rank": round(peak_memory_mb(place.device), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a bench/gpu_models.py name, e.g. qwen3-1.7b")
    parser.add_argument("--models-dir", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--sequences", type=int, default=4, help="sequences per rank per update")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--long-len", type=int, default=32768)
    parser.add_argument("--measures", default="train,sync_gather,long_context")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from patchgym.train.distributed import Distributed

    place = Distributed.from_env("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    model = args.model
    if place.main:
        ensure_model(args.models_dir, model, "cuda" if place.device.startswith("cuda") else "cpu")
    place.barrier()
    args.model = str(args.models_dir / model)
    wanted, state, failed = args.measures.split(","), {}, False

    def run_train() -> dict:
        result = train_measure(args, place)
        state["policy"] = result.pop("_policy")
        return result

    for name, run in (("train", run_train),
                      ("sync_gather", lambda: _needs(state) or gather_measure(args, place, state["policy"])),
                      ("long_context", lambda: long_measure(args, place.world))):
        if name not in wanted:
            continue
        if place.main:  # only rank 0 prints; the others take part in the same collectives
            failed |= measured(name, run, model=model)["status"] == "failed"
        else:
            try:
                run()
            except Exception:  # rank 0 reports it
                pass
        if name == "sync_gather":
            state.pop("policy", None)  # free the train measure's model before the long sequence
        place.barrier()
    place.close()
    return 1 if failed else 0


def _needs(state: dict) -> None:
    if "policy" not in state:
        raise Unavailable("the train measure did not run or failed, so there is no policy to push", status="skipped")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
