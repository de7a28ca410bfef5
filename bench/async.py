"""Asynchronous RL: wall time per iteration with rollouts running one iteration ahead (S = 1) against the synchronous
loop (S = 0), with a slow environment.

    python bench/async.py [--iterations 4] [--samples 8] [--tool-s auto] [--json]

Each iteration: rollouts of the two-turn synthetic environment (10 keys x G samples through the real HF engine,
every generation through the trainer's policy-version gate), then a grpo++ policy update of the small policy and
a weight push (PolicyVersions.swap), driven by the trainer's RolloutPipeline. Each action is followed by a tool
call that sleeps --tool-s seconds; `auto` sets the two tool calls of an episode to take as long as one update
(measured once, before the runs), so that a batch's rollouts take a little longer than its update.
ratio = S=1 s/iteration / S=0 s/iteration; target <= 0.7.
"""

import argparse
import asyncio
import sys
import time

import torch

from patchgym.inference.hf import HFEngine
from patchgym.inference.models import tiny_model
from patchgym.rl.advantages import compute_advantages
from patchgym.rl.config import load_preset
from patchgym.train import synthetic
from patchgym.train.async_rollouts import PolicyVersions, RolloutPipeline
from patchgym.train.batch import sequences_from_trajectories
from patchgym.train.prepare import full_state_dict
from patchgym.train.update import make_optimizer, policy_update

from report import print_result  # bench/report.py, beside this script

TARGET = 0.7
ALGO = load_preset("grpo++")


class SlowToolEngine:
    """The engine behind the version gate; after each generation the environment's tool call sleeps `tool_s`."""

    needs_messages = False

    def __init__(self, engine: HFEngine, versions: PolicyVersions, tool_s: float):
        self.engine, self.versions, self.tool_s, self.tokenizer = engine, versions, tool_s, engine.tokenizer

    async def agenerate(self, ids, params):
        await self.versions.enter()
        try:
            generation = await self.engine.agenerate(ids, params)
        finally:
            self.versions.leave()
        await asyncio.sleep(self.tool_s)
        return generation


def rollouts(engine, samples: int, seed: int):
    async def run_all():
        return await asyncio.gather(*(synthetic.play(engine, key, seed=seed * 1000 + 10 * s + i,
                                                     trajectory_id=f"{synthetic.task_id(key)}#{s}")
                                      for i, key in enumerate(synthetic.DIGITS) for s in range(samples)))
    return asyncio.run(run_all())


def update(policy, optimizer, trajectories) -> None:
    rewards = torch.tensor([t.grade.reward for t in trajectories])
    advantages = compute_advantages("rloo", rewards, [t.task_id for t in trajectories])
    if not advantages.any():  # a batch without signal would skip the whole update: keep the work comparable
        advantages = torch.linspace(-1, 1, len(trajectories))
    sequences = sequences_from_trajectories(trajectories, advantages.tolist())
    policy_update(policy, optimizer, sequences, ALGO, micro_token_budget=512, mini_batches=2)


def run(tokenizer, staleness: int, iterations: int, samples: int, tool_s: float) -> float:
    """Seconds per iteration over `iterations` iterations (the pipeline's start included)."""
    policy = synthetic.small_policy(tokenizer, seed=0)
    optimizer = make_optimizer(policy, lr=1e-3)
    versions = PolicyVersions()
    with HFEngine(synthetic.small_policy(tokenizer, seed=0), tokenizer, max_batch=10 * samples) as hf:
        engine = SlowToolEngine(hf, versions, tool_s)
        pipeline = RolloutPipeline(lambda n: rollouts(engine, samples, n), versions, staleness, iterations)
        start = time.perf_counter()
        try:
            for n in range(1, iterations + 1):
                update(policy, optimizer, pipeline.get(n))
                weights = full_state_dict(policy)
                versions.swap(lambda: hf.load_weights(weights))
        finally:
            pipeline.close()
        return (time.perf_counter() - start) / iterations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8, help="G: samples per key (10 keys)")
    parser.add_argument("--tool-s", default="auto", help="seconds each tool call sleeps, or auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = tiny_model()[1]

    versions = PolicyVersions()
    policy = synthetic.small_policy(tokenizer, seed=0)
    with HFEngine(synthetic.small_policy(tokenizer, seed=0), tokenizer, max_batch=10 * args.samples) as hf:
        engine = SlowToolEngine(hf, versions, 0.0)
        t = time.perf_counter()
        batch = rollouts(engine, args.samples, seed=0)
        generate_s = time.perf_counter() - t
    t = time.perf_counter()
    update(policy, make_optimizer(policy, lr=1e-3), batch)
    training_s = time.perf_counter() - t
    # Two tool calls per episode, together as long as an update: the environment's waiting is what async hides
    # (here generation and training share the same CPU cores, so their compute cannot overlap much).
    tool_s = training_s / 2 if args.tool_s == "auto" else float(args.tool_s)

    sync = run(tokenizer, 0, args.iterations, args.samples, tool_s)
    ahead = run(tokenizer, 1, args.iterations, args.samples, tool_s)
    ratio = ahead / sync
    print_result({"iterations": args.iterations, "episodes_per_iteration": 10 * args.samples,
                  "tool_call_s": round(tool_s, 3), "generation_s": round(generate_s, 3),
                  "training_s": round(training_s, 3), "sync_s_per_iteration": round(sync, 3),
                  "async_s_per_iteration": round(ahead, 3), "ratio": round(ratio, 3), "target": f"<= {TARGET}",
                  "ok": ratio <= TARGET}, args.json)
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
