"""Activation memory per rank of one long sequence with Ulysses sequence parallelism (sp = 2) against one process.

    python bench/sequence_parallel.py [--tokens 8192] [--hidden 512] [--layers 2] [--json]

A random-init Llama, wide and shallow (hidden 512, 8 heads, 4 key/value heads, fp32), one sequence of --tokens
tokens with the loss on every token; one forward and backward pass of patchgym's logprobs, without gradient
checkpointing. `saved_mib` is what autograd keeps for the backward pass at the end of the forward (the activations,
parameters excluded, each storage counted once): the number sequence parallelism is for; `rss_peak_mib` is the
growth of the process's peak resident memory over the pass (the CPU allocator's view, backward included).
sp = 2 runs two gloo processes; each reports its own figures and the larger is shown. ratio = sp2 / sp1, about 1/2
expected (the logits and the all-to-all buffers are not split evenly).
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from patchgym.train.sequence_parallel import Mesh, enable, new_groups, sequence_logprobs  # noqa: E402

from report import print_result  # noqa: E402  bench/report.py, beside this script

VOCAB = 2048


def wide_model(hidden: int, layers: int, tokens: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=tokens, tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).train()


def measure(model, tokens: int) -> dict:
    """One forward and backward pass over a `tokens`-long sequence: saved activations, peak RSS growth, seconds."""
    ids = torch.randint(1, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(1))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    rss_before, peak, done = _rss(), [0], threading.Event()

    def watch():  # the current RSS, sampled: ru_maxrss would report the peak of start-up instead
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss())

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs = sequence_logprobs(model, ids, torch.ones_like(ids))
    saved_mib = sum(saved.values()) / 2**20
    logprobs.sum().backward()
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    return {"saved_mib": round(saved_mib, 1), "rss_peak_mib": round((peak[0] - rss_before) / 2**20, 1),
            "seconds": round(seconds, 2)}


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(rank: int, args, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        sp_group, _ = new_groups(Mesh(2, 2), rank)
        model = enable(wide_model(args.hidden, args.layers, args.tokens), sp_group)
        figures = measure(model, args.tokens)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    one = measure(wide_model(args.hidden, args.layers, args.tokens), args.tokens)
    with tempfile.TemporaryDirectory() as out, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(worker, args=(args, port, out), nprocs=2, join=True)
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(2)]
    two = {key: max(r[key] for r in ranks) for key in ranks[0]}
    print_result({
        "tokens": args.tokens, "hidden": args.hidden, "layers": args.layers, "heads": 8, "kv_heads": 4,
        "sp1_saved_mib": one["saved_mib"], "sp2_saved_mib_per_rank": two["saved_mib"],
        "saved_ratio": round(two["saved_mib"] / one["saved_mib"], 3),
        "sp1_rss_peak_mib": one["rss_peak_mib"], "sp2_rss_peak_mib_per_rank": two["rss_peak_mib"],
        "rss_ratio": round(two["rss_peak_mib"] / max(one["rss_peak_mib"], 1e-9), 3),
        "sp1_seconds": one["seconds"], "sp2_seconds": two["seconds"],
    }, args.json)


if __name__ == "__main__":
    main()
