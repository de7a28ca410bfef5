"""Memory of sharded loading: peak RSS per rank for loading a random Qwen3-shaped model (~0.5 B parameters) and one
training step on 2 CPU ranks under torchrun, on the sharded path (meta init, each rank reading only its shards from
the safetensors) and on the full-copy path main had (every rank loads the whole model, then FSDP2 shards it).

    nice python bench/memory.py [--layers 28] [--tokens 512] [--param-dtype fp32] [--kl] [--json]

The model (a Qwen3Config: hidden 1024, MLP 3072, 16 heads, 8 KV heads, vocab 151936, tied embeddings) is saved once,
fp32, to a temporary directory. Each rank trains on 2 sequences of --tokens tokens, packed as one micro-batch (the
micro-batching the trainer has). --kl adds the KL reference: sharded on the sharded path, a full copy on the other.

floor per rank = (parameters + gradients + AdamW's two states) / ranks, all fp32 (the master shards), + activations:
the bytes autograd saves for the backward pass in that step (a saved-tensors hook, parameters excluded). The floor
leaves out the Python/torch runtime, FSDP2's gathered layers and the reference model. Targets: sharded peak <= 1.3 x
floor, and <= 0.6 x the full-copy path's peak. It also prints the load alone against the full-copy path's load,
and `patchgym plan`'s training total for the same run against the step's measured peak above the runtime.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from report import print_result  # bench/report.py, beside this script

WORLD = 2
FLOOR_TARGET, FULL_COPY_TARGET = 1.3, 0.6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokens", type=int, default=512, help="tokens of each of a rank's 2 sequences")
    parser.add_argument("--param-dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--kl", action="store_true", help="with the KL reference model")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=("sharded", "full-copy"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        params = save_model(Path(tmp) / "model", args.layers)
        planned = plan_bytes(Path(tmp) / "model", args)
        runs = {path: launch(path, Path(tmp), args) for path in ("sharded", "full-copy")}
    sharded, full = (max(r["peak_rss"] for r in runs[p]) for p in ("sharded", "full-copy"))
    sharded_load, full_load = (max(r["load_rss"] for r in runs[p]) for p in ("sharded", "full-copy"))
    floor = max(r["floor"] for r in runs["sharded"])
    gb = lambda n: round(n / 2**30, 3)  # noqa: E731
    result = {
        "bench": "memory", "params": params, "ranks": WORLD, "param_dtype": args.param_dtype, "kl": args.kl,
        "tokens_per_rank": 2 * args.tokens, "floor_gb": gb(floor),
        "activations_gb": gb(max(r["activations"] for r in runs["sharded"])),
        "runtime_rss_gb": gb(max(r["runtime_rss"] for r in runs["sharded"])),
        "sharded_load_rss_gb": gb(sharded_load), "sharded_peak_rss_gb": gb(sharded),
        "full_copy_load_rss_gb": gb(full_load), "full_copy_peak_rss_gb": gb(full),
        "ratio_to_floor": round(sharded / floor, 3), "ratio_to_full_copy": round(sharded / full, 3),
        "target_floor": FLOOR_TARGET, "target_full_copy": FULL_COPY_TARGET,
        # the load alone: where the two paths differ (the step's state is the same once both are sharded)
        "load_ratio_to_full_copy": round(sharded_load / full_load, 3),
    }
    # `patchgym plan` for this shape, ranks and micro-batch, against what the step added to the runtime's RSS
    measured = max(r["peak_rss"] - r["runtime_rss"] for r in runs["sharded"])
    result.update(plan_train_gb=gb(planned), measured_train_gb=gb(measured),
                  plan_to_measured=round(planned / measured, 3),
                  plan_within_20_percent=abs(planned / measured - 1) <= 0.2)
    result["meets_targets"] = (result["ratio_to_floor"] <= FLOOR_TARGET
                               and result["ratio_to_full_copy"] <= FULL_COPY_TARGET)
    print_result(result, args.json)
    return 0


def save_model(directory: Path, layers: int) -> int:
    """A random-init Qwen3 of `layers` layers with the test tokenizer, saved as fp32 safetensors; its parameters."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from patchgym.inference.models import qwen3_tokenizer

    tokenizer = qwen3_tokenizer()
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def plan_bytes(model_dir: Path, args) -> float:
    """`patchgym plan`'s training total per rank for the run the workers make: this shape, WORLD ranks, FSDP, one
    packed micro-batch of 2 x --tokens, the worker's dtype and KL setting (its reference is not in plan's count)."""
    from patchgym.config import load_config
    from patchgym.train.plan import plan, read_shape

    tokens = 2 * args.tokens
    config = load_config([], ["train.fsdp=true", f"train.param_dtype={args.param_dtype}",
                              f"train.micro_token_budget={tokens}", f"agent.max_context_tokens={tokens}"])
    shape = read_shape(json.loads((model_dir / "config.json").read_text()), str(model_dir / "config.json"))
    return plan(config, shape, WORLD, 80.0).train_total


def launch(path: str, tmp: Path, args) -> list[dict]:
    """One torchrun of WORLD ranks on `path`; each rank's figures."""
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", str(WORLD),
               __file__, "--worker", path, "--dir", str(tmp), "--layers", str(args.layers), "--tokens",
               str(args.tokens), "--param-dtype", args.param_dtype, *(["--kl"] if args.kl else [])]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return [json.loads((tmp / f"{path}-{rank}.json").read_text()) for rank in range(WORLD)]


def worker(args) -> int:
    from patchgym.inference.models import load_model
    from patchgym.rl.config import load_preset
    from patchgym.train.config import TrainConfig
    from patchgym.train.distributed import Distributed, prepare_policy, prepare_reference
    from patchgym.train.prepare import shard_model
    from patchgym.train.update import make_optimizer, policy_update

    place = Distributed.from_env("cpu")
    runtime_rss = peak_rss()  # python, torch, transformers and the process group, before any weight
    model_dir = str(Path(args.dir) / "model")
    train = TrainConfig(fsdp=True, param_dtype=args.param_dtype, micro_token_budget=2 * args.tokens)
    if args.worker == "sharded":
        model, _ = prepare_policy(model_dir, "cpu", train, place, None)
        ref = prepare_reference(model_dir, "cpu", train, place, model) if args.kl else None
    else:  # main's prepare_policy and LocalPolicy: a full copy on every rank, then shards; a full reference
        model = shard_model(load_model(model_dir)[0], param_dtype=args.param_dtype)
        ref = load_model(model_dir)[0].requires_grad_(False) if args.kl else None
    load_rss = peak_rss()
    algo = load_preset("grpo++").model_copy(update={"kl_coef": 0.01 if args.kl else 0.0})
    saved = SavedTensors()
    with saved:
        policy_update(model, make_optimizer(model, 1e-5), batch(args.tokens, place.rank), algo,
                      micro_token_budget=train.micro_token_budget, process_group=place.group, ref_model=ref)
    params = sum(p.numel() for p in model.parameters())  # DTensors count their global size
    states = params * (4 + 4 + 8)  # fp32 master shards, their gradients, AdamW's exp_avg and exp_avg_sq
    figures = {"rank": place.rank, "runtime_rss": runtime_rss, "load_rss": load_rss, "peak_rss": peak_rss(),
               "activations": saved.bytes,
               "floor": states / place.world + saved.bytes}
    (Path(args.dir) / f"{args.worker}-{place.rank}.json").write_text(json.dumps(figures))
    place.close()
    return 0


def batch(tokens: int, rank: int) -> list:
    """2 sequences of `tokens` random ids: a 64-token prompt, the rest sampled, advantages +1 and -1."""
    from patchgym.train.batch import TrainSequence

    gen = torch.Generator().manual_seed(rank)
    out = []
    for advantage in (1.0, -1.0):
        ids = torch.randint(100, 40000, (tokens,), generator=gen).tolist()
        mask = [0] * 64 + [1] * (tokens - 64)
        out.append(TrainSequence(ids, mask, [-2.0 * m for m in mask], advantage=advantage))
    return out


class SavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """Counts the bytes of the storages autograd saves for backward, each once; parameters (and views of them,
    FSDP2's gathered weights among them) are state, not activations."""

    def __init__(self):
        self.seen: dict[int, int] = {}
        super().__init__(self._pack, lambda t: t)

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    def _pack(self, tensor):
        base = tensor._base if tensor._base is not None else tensor
        if not (base.is_leaf and base.requires_grad):
            storage = tensor.untyped_storage()
            self.seen[storage.data_ptr()] = storage.nbytes()
        return tensor


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    sys.exit(main())
