"""Rollouts at the engine's speed? One RL iteration of `make demo` (its tasks, agent, sandboxes and vLLM server:
tasks_per_iteration x samples_per_task episodes, graded) with every generation request recorded, then the same
requests replayed, in the same run, against the inference engine alone at the same concurrency.

    python bench/rollout_throughput.py [--model smollm2] [--cpu-cores vllm,all] [--hf-requests 8] [--json]

For each vLLM CPU layout in --cpu-cores (inference.vllm_cpu_cores: `vllm`, vLLM's own, a worker process on one core
with the other reserved for its scheduler; `all` or N: the worker in the engine's process on every core or N):
- rollout_tok_s: tokens sampled by the episodes / the rollout's wall time (what the trainer reports);
- engine_alone_tok_s: the recorded requests sent straight to the server, in arrival order, at most
  rollout.max_generations at once, each forced to its recorded length (ignore_eos): same prompts, same tokens;
- prefill_s: the same prompts with one token each (the prefix cache emptied first, as before each replay);
  decode_s = engine_alone_s - prefill_s;
- rollout_vs_engine = rollout_tok_s / engine_alone_tok_s (target >= 0.8).
`hf_tok_s`: the first --hf-requests requests through the hf engine (batched, on every core), for comparison.

floor_tok_s: what the cores could decode if every FLOP ran at the GEMM rate measured here (a large fp32 matmul on
all cores): GEMM FLOP/s / the mean FLOPs of a decoded token of these requests (2 x the linear weights, plus 4 x
layers x width x context for attention). vs_vllm_layout: the best layout's rollout_tok_s over vLLM's own layout's,
measured in this run (target >= 2, in fp32: the dtype whose logprobs match the trainer's).

The model is SmolLM2 unless --model names another (e.g. make demo's warm checkpoint, whose episodes run longer).
Requests are written to DIR/<binding>/requests.jsonl (patchgym.inference.recording).
"""

import argparse
import asyncio
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchgym.config import load_config  # noqa: E402
from patchgym.inference.hf import HFEngine  # noqa: E402
from patchgym.inference.recording import RecordingEngine, Request, replay, write_requests  # noqa: E402
from patchgym.inference.vllm_engine import VLLMEngine, model_dir  # noqa: E402
from patchgym.rollout import ModelAgent, RolloutEngine  # noqa: E402
from patchgym.tasks import read_tasks  # noqa: E402
from patchgym.tasks.factory.build import build_tasks  # noqa: E402

from report import print_result  # noqa: E402  (beside this script)

DEMO = ROOT / "configs" / "demo.yaml"


def demo_tasks(config, out: Path) -> list:
    """make demo's tasks (built like `make demo` builds them when runs/demo-tasks is not there), the first
    tasks_per_iteration of them: one RL iteration's draw."""
    path = ROOT / config.train.tasks
    if not path.exists():
        path = Path(build_tasks(["isodate", "toolz"], 3, 0, out / "tasks", backend=config.sandbox.backend,
                                progress=False).tasks_file)
    return read_tasks(path)[:config.train.tasks_per_iteration]


def rollout(engine, config, tasks, out: Path) -> tuple[list[Request], float, int]:
    recorder = RecordingEngine(engine)
    agent = ModelAgent(recorder, config.agent, model=config.inference.model)
    rollouts = RolloutEngine(agent, config.sandbox, config.rollout, run_dir=out, progress=False)
    began = time.monotonic()
    rollouts.run(tasks, config.train.samples_per_task)
    seconds = time.monotonic() - began
    write_requests(recorder.requests, out / "requests.jsonl")
    return recorder.requests, seconds, rollouts.stats.sampled_tokens


def vllm_replay(engine: VLLMEngine, requests: list[Request], concurrency: int, prefill_only: bool) -> float:
    """Seconds to serve `requests` at `concurrency`, each forced to its recorded length (or to 1 token)."""

    async def send(r: Request) -> None:
        n = 1 if prefill_only else max(1, r.generated)
        body = engine._completion_request(r.prompt_ids, replace(r.params, max_new_tokens=n))
        body["extra_body"] = {**body["extra_body"], "min_tokens": n, "ignore_eos": True}
        await engine._async_client().completions.create(**body)

    engine._post("/reset_prefix_cache", None)
    return asyncio.run(replay(requests, send, concurrency))


def hf_tok_s(model: str, requests: list[Request], concurrency: int, threads: int) -> float:
    torch.set_num_threads(threads)
    engine = HFEngine.from_spec(model, max_batch=concurrency)
    tokens = []

    async def send(r: Request) -> None:
        generation = await engine.agenerate(r.prompt_ids, replace(r.params, max_new_tokens=max(1, r.generated)))
        tokens.append(len(generation.token_ids))

    try:
        seconds = asyncio.run(replay(requests, send, concurrency))
    finally:
        engine.close()
    return sum(tokens) / seconds


def decode_flops(model: str, requests: list[Request]) -> float:
    """FLOPs of decoding every recorded token: 2 x linear weights (lm_head included) + 4 x layers x width x context."""
    c = AutoConfig.from_pretrained(model_dir(model))
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    attention = c.hidden_size * head * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    linear = c.num_hidden_layers * (attention + 3 * c.hidden_size * c.intermediate_size) + c.hidden_size * c.vocab_size
    width = c.num_attention_heads * head
    total = 0.0
    for r in requests:
        n, p = r.generated, len(r.prompt_ids)
        total += n * 2 * linear + 4 * c.num_hidden_layers * width * (n * p + n * (n - 1) / 2)
    return total


def gemm_flops(threads: int, size: int = 2048, repeats: int = 10) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    began = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size ** 3 * repeats / (time.perf_counter() - began)


def measure(layout: str, args, out: Path) -> dict:
    config = load_config([DEMO], [f"inference.model={args.model}", f"inference.vllm_cpu_cores={layout}"])
    tasks = demo_tasks(config, out)
    concurrency = config.rollout.max_generations
    run_dir = out / f"cpu-{layout}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a rollout resumes from the trajectories there: nothing to record
    with VLLMEngine.from_config(config.inference) as engine:
        requests, rollout_s, sampled = rollout(engine, config, tasks, run_dir)
        forced = sum(max(1, r.generated) for r in requests)
        alone_s = vllm_replay(engine, requests, concurrency, prefill_only=False)
        prefill_s = vllm_replay(engine, requests, concurrency, prefill_only=True)
    rollout_tok_s, alone_tok_s = sampled / rollout_s, forced / alone_s
    return {"cpu_cores": layout, "episodes": len(tasks) * config.train.samples_per_task, "requests": len(requests),
            "prompt_tokens": sum(len(r.prompt_ids) for r in requests), "generated_tokens": sampled,
            "rollout_s": round(rollout_s, 1), "rollout_tok_s": round(rollout_tok_s, 1),
            "engine_alone_s": round(alone_s, 1), "engine_alone_tok_s": round(alone_tok_s, 1),
            "prefill_s": round(prefill_s, 1), "decode_s": round(alone_s - prefill_s, 1),
            "rollout_vs_engine": round(rollout_tok_s / alone_tok_s, 3), "_requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--cpu-cores", default="vllm,all", help="vLLM CPU layouts to measure, comma-separated")
    parser.add_argument("--hf-requests", type=int, default=8, help="requests replayed through the hf engine (0: none)")
    parser.add_argument("--dir", type=Path, default=ROOT / "runs" / "bench-rollout-throughput")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    runs = [measure(layout, args, args.dir) for layout in args.cpu_cores.split(",")]
    best = max(runs, key=lambda r: r["rollout_tok_s"])
    default = next((r for r in runs if r["cpu_cores"] == "vllm"), None)
    requests = best.pop("_requests")
    for r in runs:
        r.pop("_requests", None)
    flops = decode_flops(args.model, requests)
    gflops = gemm_flops(cores) / 1e9
    result = {
        "model": args.model, "dtype": "float32", "cores": cores, **{k: best[k] for k in (
            "cpu_cores", "rollout_tok_s", "engine_alone_tok_s", "rollout_vs_engine", "prefill_s", "decode_s")},
        "floor_tok_s": round(gflops * 1e9 / (flops / max(1, sum(r.generated for r in requests))), 1),
        "gemm_gflops": round(gflops, 1), "decode_gflop_per_token": round(flops / 1e9 / max(1, sum(
            r.generated for r in requests)), 3),
        "vs_vllm_layout": round(best["rollout_tok_s"] / default["rollout_tok_s"], 2) if default else None,
        "hf_tok_s": round(hf_tok_s(args.model, requests[:args.hf_requests], 8, cores), 1) if args.hf_requests else None,
        "runs": runs,
    }
    print_result(result, args.json)


if __name__ == "__main__":
    main()
