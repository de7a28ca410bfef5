"""The proof that the whole RL path learns: rollouts of a two-turn environment through the real engine, recorded
token by token, RLOO advantages and the grpo++ update; and that it does not learn with the advantages' sign flipped.

The warm start plays the part of pretraining: SFT teaches the answer format and to read the digit, then SFT on
random answers until the model reads it in fewer than 12% of episodes, a weak reader, as a base model that seldom
does the right thing. (From a model that never reads, this toy needs thousands of episodes: the gradient of a
copy circuit that does not exist yet is second order. The test would prove the same thing, only slower.)
"""

import random
import time

import pytest
import torch

from patchgym.inference.hf import HFEngine
from patchgym.rl.advantages import compute_advantages
from patchgym.rl.config import load_preset
from patchgym.train import synthetic
from patchgym.train.batch import TrainSequence, sequences_from_trajectories
from patchgym.train.update import make_optimizer, policy_update, sft_update

WEAK_READER = 0.12  # the warm start stops once the expected reward is below this
ITERATIONS = 12
SAMPLES = 16  # G: rollouts per key; all ten keys every iteration


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
    raise AssertionError(f"the warm start did not converge in {max_steps} SFT steps")


def train(tokenizer, seed: int, flip: bool) -> tuple[float, list[float], float]:
    """(expected reward before RL, mean sampled reward per iteration, expected reward after)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = synthetic.small_policy(tokenizer, seed)
    warm_start(model, tokenizer, rng)
    before = synthetic.expected_reward(model, tokenizer)
    algo = load_preset("grpo++")
    optimizer = make_optimizer(model, lr=3e-3)
    curve = []
    with HFEngine(model, tokenizer, max_batch=len(synthetic.DIGITS) * SAMPLES) as engine:
        for iteration in range(ITERATIONS):
            trajectories = synthetic.rollouts(engine, list(synthetic.DIGITS), SAMPLES, seed=seed * 1000 + iteration)
            rewards = torch.tensor([t.grade.reward for t in trajectories])
            advantages = compute_advantages(algo.advantage, rewards, [t.task_id for t in trajectories])
            if flip:
                advantages = -advantages
            sequences = sequences_from_trajectories(trajectories, advantages.tolist())
            policy_update(model, optimizer, sequences, algo, micro_token_budget=8192, mini_batches=2)
            curve.append(round(float(rewards.mean()), 3))
    return before, curve, synthetic.expected_reward(model, tokenizer)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return tiny[1]


def test_grpo_pp_learns_to_read_the_observation(tokenizer):
    start = time.perf_counter()
    before, curve, after = train(tokenizer, seed=0, flip=False)
    print(f"normal: expected {before:.3f} -> {after:.3f}; sampled per iteration {curve}; "
          f"{time.perf_counter() - start:.0f}s")
    assert before < 0.3 and curve[0] < 0.3
    assert after > 0.8 and curve[-1] > 0.8


def test_flipped_advantages_do_not_learn(tokenizer):
    start = time.perf_counter()
    before, curve, after = train(tokenizer, seed=0, flip=True)
    print(f"flipped: expected {before:.3f} -> {after:.3f}; sampled per iteration {curve}; "
          f"{time.perf_counter() - start:.0f}s")
    assert before < 0.3 and curve[0] < 0.3
    assert after < 0.3 and max(curve) < 0.3
