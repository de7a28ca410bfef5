"""Pivot iterations on the tiny model (a random 2-layer Llama on SmolLM2's tokenizer), warm-started on the memory
task's expert demo so that its samples are sometimes right, at the demo's five states: the whole pool is measured,
the states whose samples differ are kept and the others dropped, a group of equal rewards has advantage 0 and
moves no weight, the mixed ones change the policy, whose new weights reach the engine, the engine's logprobs are
the policy's, and each iteration writes its metrics line and shows its progress line."""

import pytest
import torch
from pivot_demos import MemoryBash, MemoryReplay

from memory_env import memory_task
from patchgym.config import load_config
from patchgym.inference.factory import make_engine
from patchgym.pivot.config import PivotConfig
from patchgym.pivot.selection import mixed
from patchgym.pivot.states import decision_points
from patchgym.pivot.train import (
    PivotState,
    group_advantages,
    pivot_iteration,
    run_pivot,
    state_pool,
    training_sequences,
)
from patchgym.train.distributed import Distributed
from patchgym.train.metrics import MetricsLog
from patchgym.train.metrics_schema import PIVOT_KEYS, UPDATE_KEYS, read_metrics
from patchgym.train.policy import LocalPolicy
from patchgym.train.sft import sft_batches, sft_sequences
from patchgym.train.update import make_optimizer, policy_update

G = 4
PIVOT = PivotConfig(group_size=G, states_per_iteration=5, refresh_every=2)


@pytest.fixture(scope="module")
def run(tiny, demo):
    """(config, policy, engine, states): the policy warm-started on the demo (60 SFT steps, its loss ~0.08 a
    token) and pushed into an hf engine; sampling at the demo's T = 0.5, seeded."""
    config = load_config(overrides=[
        "inference.model=tiny", "inference.threads=1", "train.threads=1", "train.lr=0.003", "train.weight_decay=0",
        "agent.sampling.temperature=0.5", "agent.sampling.seed=0", "agent.sampling.max_new_tokens=96",
        "algorithm.advantage=grpo"])
    policy = LocalPolicy(config, Distributed.from_env("cpu"))
    engine = make_engine(config.inference)
    try:
        policy.warm_start(sft_batches(sft_sequences([demo]), 1, 60, config.seed), lr=0.03)
        policy.sync(engine)
        yield config, policy, engine, decision_points(demo, memory_task(), MemoryReplay())
    finally:
        engine.close()


@pytest.fixture(scope="module")
def first(run):
    """The first iteration (a measuring one), with the policy's weights before it."""
    config, policy, engine, points = run
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    state = PivotState()
    record, groups = pivot_iteration(state_pool(points, MemoryBash()), policy, engine, config, PIVOT, state,
                                     bash=MemoryBash())
    return state, record, groups, before


def test_the_pool_is_measured_and_the_states_whose_samples_differ_are_kept(first):
    state, record, groups, _ = first
    assert len(groups) == record["states_measured"] == 5 and all(len(g.verdicts) == G for g in groups.values())
    kept = {key for key, group in groups.items() if mixed(group.rewards)}
    assert 0 < len(kept) < 5, {key: group.rewards for key, group in groups.items()}  # some kept, some dropped
    assert set(state.selection.kept) == kept and state.selection.measured == 5
    assert record["states_kept"] == len(kept) and record["kept_fraction"] == len(kept) / 5
    assert record["states_trained"] == len(kept) and record["groups"] == len(kept)  # drawn from the kept set
    rewards = [r for group in groups.values() for r in group.rewards]
    assert record["reward_mean"] == pytest.approx(sum(rewards) / len(rewards)) and record["samples"] == 5 * G
    parsable = [v.reason != "format_error" for group in groups.values() for v in group.verdicts]
    assert 0 < record["parsable_fraction"] == sum(parsable) / len(parsable)
    assert sum(record["reasons"].values()) == 5 * G


def test_a_group_of_equal_rewards_has_advantage_0_and_moves_no_weight(run, first):
    config, policy, _, _ = run
    _, _, groups, _ = first
    # the iteration computed advantages for the kept states it trained; here over every state it measured
    advantages = group_advantages(list(groups.values()), config.algorithm)
    assert advantages.tolist() == [a for group in groups.values() for a in group.advantages]
    for group in groups.values():
        if mixed(group.rewards):
            assert any(a != 0 for a in group.advantages) and sum(group.advantages) == pytest.approx(0, abs=1e-9)
        else:
            assert group.advantages == [0.0] * G, group.rewards
    uniform = [group for group in groups.values() if not mixed(group.rewards)]
    sequences = training_sequences(uniform, config.algorithm)
    assert len(sequences) == G * len(uniform) and {s.advantage for s in sequences} == {0.0}

    model = type(policy.model)(policy.model.config)  # a copy: the policy itself trains on in the other tests
    model.load_state_dict(policy.model.state_dict())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    update = policy_update(model, make_optimizer(model, 0.01), sequences, config.algorithm, micro_token_budget=4096,
                           temperature=0.5)
    assert update["loss"] == 0.0 and update["skipped_zero_advantage"] == len(sequences)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_the_mixed_states_change_the_policy_and_the_engine_gets_its_weights(run, first):
    _, policy, engine, _ = run
    _, record, groups, before = first
    after = policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(v, after[k]) for k, v in engine.model.state_dict().items())
    # The update's logprobs at the sampling temperature are the engine's, token for token.
    assert record["rollout_logprob_gap"] < 1e-4 and record["optimizer_steps"] == 1
    assert record["trained_sequences"] == G * record["states_trained"] and record["loss"] is not None
    tokens = sum(len(turn.completion_ids) for group in groups.values() for turn in group.turns)
    trained = sum(len(turn.completion_ids) for group in groups.values() if mixed(group.rewards)
                  for turn in group.turns)
    assert record["sampled_tokens"] == tokens and record["policy_tokens"] == trained


def test_iterations_between_refreshes_sample_only_kept_states_and_write_metrics_and_progress(
        run, first, tmp_path, capsys):
    config, policy, engine, points = run
    state, _, _, _ = first
    kept = set(state.selection.kept)
    metrics = MetricsLog(tmp_path, loggers=("jsonl",))
    try:
        state, lines = run_pivot(points, policy, engine, config, PIVOT, 2, bash=MemoryBash(), metrics=metrics,
                                 state=state, iteration_offset=10)
    finally:
        metrics.close()
    (line,) = read_metrics(tmp_path)
    assert lines == [line] and state.iteration == 2
    assert set(PIVOT_KEYS) | set(UPDATE_KEYS) <= set(line), set(PIVOT_KEYS) | set(UPDATE_KEYS) - set(line)
    assert (line["iteration"], line["stage"], line["pivot_iteration"]) == (12, "pivot", 2)
    assert line["states_measured"] == 0 and line["states_trained"] == line["samples"] / G == len(kept)
    assert set(state.selection.kept) <= kept and line["states_kept"] == len(state.selection.kept)
    shown = capsys.readouterr().out
    assert "pivot: 1/1, reward " in shown and " left" in shown, shown
    assert "pivot iteration 2/2: reward " in shown, shown
