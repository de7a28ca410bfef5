"""bench/gpu.sh's vLLM measures, one per process (so each gets the whole GPU):

    python bench/gpu_rollout.py rollout --engine bare|patchgym --model DIR [--prompts 64] [--max-new-tokens 512]
    python bench/gpu_rollout.py sync --model DIR [--bucket-mb 256]

rollout: the same chat prompts (token ids), T = 1 with a seed each and the sampled tokens' logprobs, sampled all
at once either by bare vLLM (`vllm.LLM.generate`, vLLM's defaults) or through patchgym's VLLMEngine (its server,
one request each, concurrently); tokens_per_s = generated tokens / wall time after a warm-up request.
sync: the policy on this process's device, pushed into a running VLLMEngine (the trainer's gathered_weights, in
buckets of --bucket-mb: NCCL on CUDA, /dev/shm on CPU); mean seconds of 2 pushes, the memory it added.
"""

import argparse
import asyncio
import importlib.util
import sys
import time

import torch

from gpu_common import Unavailable, measured  # beside this script
from report import QUESTIONS
from sync_watch import SyncWatch

GIB = 2**30


def prompts(model_dir: str, count: int) -> list[list[int]]:
    from patchgym.inference.models import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}],
                                          add_generation_prompt=True, return_dict=False) for i in range(count)]


def bare(args, jobs: list[list[int]]) -> dict:
    from vllm import LLM
    from vllm import SamplingParams as VllmParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=args.dtype, seed=0, max_num_seqs=len(jobs), max_model_len=args.max_model_len,
              kv_cache_memory_bytes=int(args.kv_cache_gb * GIB), **_cpu_eager())
    params = [VllmParams(temperature=1.0, max_tokens=args.max_new_tokens, seed=i, logprobs=0)
              for i in range(len(jobs))]
    llm.generate([TokensPrompt(prompt_token_ids=jobs[0])], params[0])  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in jobs], params)
    seconds = time.perf_counter() - start
    return {"tokens": sum(len(o.outputs[0].token_ids) for o in outputs), "seconds": seconds}


def through_patchgym(args, jobs: list[list[int]]) -> dict:
    from patchgym.inference.base import SamplingParams
    from patchgym.inference.vllm_engine import VLLMEngine

    with VLLMEngine(args.model, dtype=args.dtype, kv_cache_gb=args.kv_cache_gb, max_batch=len(jobs),
                    extra_args=["--max-model-len", str(args.max_model_len)]) as engine:
        engine.generate(jobs[0], SamplingParams(max_new_tokens=args.max_new_tokens, seed=0))  # warm-up

        async def run_all():
            return await asyncio.gather(*(engine.agenerate(ids, SamplingParams(max_new_tokens=args.max_new_tokens,
                                                                               seed=i)) for i, ids in enumerate(jobs)))

        start = time.perf_counter()
        generations = asyncio.run(run_all())
        seconds = time.perf_counter() - start
    return {"tokens": sum(len(g.token_ids) for g in generations), "seconds": seconds}


def rollout(args) -> dict:
    jobs = prompts(args.model, args.prompts)
    result = (bare if args.engine == "bare" else through_patchgym)(args, jobs)
    return {**result, "prompts": len(jobs), "max_new_tokens": args.max_new_tokens,
            "tokens_per_s": round(result["tokens"] / result["seconds"], 1), "seconds": round(result["seconds"], 2)}


def sync(args) -> dict:
    from patchgym.inference.models import load_model
    from patchgym.inference.vllm_engine import VLLMEngine
    from patchgym.inference.weight_push import untied
    from patchgym.train.prepare import gathered_weights

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = load_model(args.model, device)
    model_mb = sum(t.numel() for _, t in untied(model.state_dict())) * 2 / 2**20  # in the engine's bf16
    # The trainer's fp32 copy shares the GPU with the server: give vLLM a slice of it.
    extra = ["--max-model-len", str(args.max_model_len)]
    if device == "cuda":
        extra += ["--gpu-memory-utilization", "0.35"]
    with VLLMEngine(args.model, dtype=args.dtype, kv_cache_gb=min(args.kv_cache_gb, 8.0), max_batch=8,
                    extra_args=extra, sync_bucket_mb=args.bucket_mb) as engine:
        seconds, peak = [], 0.0
        for _ in range(2):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated() if device == "cuda" else 0
            with SyncWatch(engine.pid) as watch:
                start = time.perf_counter()
                engine.load_weights(gathered_weights(model))
                seconds.append(time.perf_counter() - start)
            gpu_added = (torch.cuda.max_memory_allocated() - base) / 2**20 if device == "cuda" else 0.0
            peak = max(peak, watch.peak_mb, gpu_added)
        push = engine.last_push
    return {"transport": push.transport, "checkpoint_written": watch.checkpoint_written,
            "sync_s": round(sum(seconds) / len(seconds), 3), "sync_peak_mb": round(peak, 1),
            "model_mb": round(model_mb, 1), "sync_bucket_mb": args.bucket_mb, "sync_buckets": push.buckets}


def _cpu_eager() -> dict:
    """On CPU, eager mode (compiling costs a minute per start); on GPU, vLLM's defaults (CUDA graphs)."""
    return {} if torch.cuda.is_available() else {"enforce_eager": True}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measure", choices=["rollout", "sync"])
    parser.add_argument("--model", required=True, help="a model directory (bench/gpu_models.py)")
    parser.add_argument("--engine", choices=["bare", "patchgym"], default="patchgym")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-gb", type=float, default=40.0)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    args = parser.parse_args()

    def run() -> dict:
        if importlib.util.find_spec("vllm") is None:
            raise Unavailable("vllm is not installed (pip install '.[vllm]')")
        return rollout(args) if args.measure == "rollout" else sync(args)

    context = {"model": args.model.rstrip("/").rsplit("/", 1)[-1]}
    if args.measure == "rollout":
        context["engine"] = args.engine
    return 0 if measured(args.measure, run, **context)["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
