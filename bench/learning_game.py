"""The proof that the whole RL path learns, as a measurement: rollouts of a two-turn environment (the "secret digit"
game of patchgym.train.synthetic) through the real engine, recorded token by token, RLOO advantages and the grpo++
update; and a control with the advantages' sign flipped, which must not learn.

    python bench/learning_game.py [--seed 0] [--iterations 12] [--samples 16] [--threads 1] [--json]

The warm start plays the part of pretraining: SFT teaches the answer format and to read the digit, then SFT on
random answers until the model reads it in fewer than 12% of episodes, a weak reader, as a base model that seldom
does the right thing. (From a model that never reads, this toy needs thousands of episodes: the gradient of a copy
circuit that does not exist yet is second order. It would prove the same thing, only slower.)
Target (`ok`): both runs start below 0.3 expected reward; the normal run ends above 0.8 (expected and last sampled
mean reward), the flipped one stays below 0.3 throughout. About a minute per run on one core.
"""

import argparse
import random
import sys
import time

import torch

from patchgym.inference.hf import HFEngine
from patchgym.inference.models import tiny_model
from patchgym.rl.advantages import compute_advantages
from patchgym.rl.config import load_preset
from patchgym.train import synthetic
from patchgym.train.batch import TrainSequence, sequences_from_trajectories
from patchgym.train.update import make_optimizer, policy_update, sft_update

from report import print_result  # bench/report.py, beside this script

WEAK_READER = 0.12  # the warm start stops once the expected reward is below this


def warm_start(model, tokenizer, rng: random.Random) -> None:
    episodes: dict[tuple[str, str], TrainSequence] = {}

    def batch(copy: bool) -> list[TrainSequence]:
        keys = synthetic.random_keys(32, rng)
        pairs = [(k, k if copy else rng.choice(synthetic.DIGITS)) for k in keys]
        for pair in pairs:
            if pair not in episodes:
                episodes[pair] = sequences_from_trajectories(
                    [synthetic.scripted(tokenizer, pair[0], ("ready", pair[1]))], [0.0])[0]
        return [episodes[pair] for pair in pairs]

    sft_until(model, tokenizer, make_optimizer(model, lr=1e-2), lambda: batch(copy=True), lambda r: r > 0.95)
    sft_until(model, tokenizer, make_optimizer(model, lr=1e-3), lambda: batch(copy=False), lambda r: r < WEAK_READER)


def sft_until(model, tokenizer, optimizer, batch, done, max_steps: int = 200) -> None:
    for _ in range(max_steps):
        if done(synthetic.expected_reward(model, tokenizer)):
            return
        sft_update(model, optimizer, batch(), micro_token_budget=4096)
    sys.exit(f"the warm start did not converge in {max_steps} SFT steps")


def train(tokenizer, seed: int, flip: bool, iterations: int, samples: int) -> dict:
    """Expected reward before RL, mean sampled reward per iteration, expected reward after, seconds."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = synthetic.small_policy(tokenizer, seed)
    warm_start(model, tokenizer, rng)
    before = synthetic.expected_reward(model, tokenizer)
    algo = load_preset("grpo++")
    optimizer = make_optimizer(model, lr=3e-3)
    curve = []
    with HFEngine(model, tokenizer, max_batch=len(synthetic.DIGITS) * samples) as engine:
        for iteration in range(iterations):
            trajectories = synthetic.rollouts(engine, list(synthetic.DIGITS), samples, seed=seed * 1000 + iteration)
            rewards = torch.tensor([t.grade.reward for t in trajectories])
            advantages = compute_advantages(algo.advantage, rewards, [t.task_id for t in trajectories])
            if flip:
                advantages = -advantages
            sequences = sequences_from_trajectories(trajectories, advantages.tolist())
            policy_update(model, optimizer, sequences, algo, micro_token_budget=8192, mini_batches=2)
            curve.append(round(float(rewards.mean()), 3))
    return {"before": round(before, 3), "curve": curve, "after": round(synthetic.expected_reward(model, tokenizer), 3),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--samples", type=int, default=16, help="G: rollouts per key; all ten keys every iteration")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = tiny_model()[1]
    normal = train(tokenizer, args.seed, False, args.iterations, args.samples)
    flipped = train(tokenizer, args.seed, True, args.iterations, args.samples)
    ok = (normal["before"] < 0.3 and normal["curve"][0] < 0.3 and normal["after"] > 0.8 and normal["curve"][-1] > 0.8
          and flipped["before"] < 0.3 and flipped["after"] < 0.3 and max(flipped["curve"]) < 0.3)
    print_result({"normal": normal, "flipped": flipped, "ok": ok}, args.json)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
