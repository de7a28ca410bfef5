"""Advantage estimators against algorithms.md §3: the worked example, the edge cases, and the invalid-member flag."""

import pytest
import torch

from patchgym.rl.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, register_estimator

torch.set_num_threads(1)

ESTIMATORS = sorted(ADVANTAGE_ESTIMATORS)


def test_worked_example_one_success_in_ten():
    # algorithms.md §3 "Worked example (G = 10, binary reward, 1 success)": GRPO with the unbiased std gives
    # 2.846 / -0.316 (the population std would give 3.000 / -0.333); Dr. GRPO 0.9 / -0.1; RLOO 1.0 / -0.111.
    rewards = torch.tensor([1.0] + [0.0] * 9)
    groups = ["task"] * 10
    expected = {"grpo": (2.846, -0.316), "dr_grpo": (0.900, -0.100), "rloo": (1.000, -0.111)}
    for name, (success, failure) in expected.items():
        adv = compute_advantages(name, rewards, groups)
        assert adv[0].item() == pytest.approx(success, abs=1e-3), name
        assert torch.allclose(adv[1:], torch.full((9,), failure), atol=1e-3), name


def test_rloo_is_reward_minus_mean_of_the_others():
    rewards = torch.tensor([0.3, 1.0, -0.5, 0.8])
    adv = compute_advantages("rloo", rewards, [0] * 4)
    others = torch.stack([torch.cat([rewards[:i], rewards[i + 1:]]).mean() for i in range(4)])
    assert torch.allclose(adv, rewards - others)


def test_reinforce_pp_baseline_whitens_over_the_batch():
    # Group means subtracted: [.75, -.25, -.25, -.25] and [.5, .5, -.5, -.5]; over the 8 trajectories the mean is 0
    # and the unbiased std is sqrt(1.75 / 7) = 0.5, so the advantages double.
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    adv = compute_advantages("reinforce_pp_baseline", rewards, list("aaaabbbb"))
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5, 1, 1, -1, -1]), atol=1e-5)


def test_reinforce_pp_baseline_whitens_over_groups_of_equal_rewards_too():
    # Centered: [2, 0, -2] and six zeros; the batch of 9 has mean 0 and unbiased std sqrt(8 / 8) = 1, so the
    # advantages are the centered rewards. Whitening over the first group alone would give [1, 0, -1].
    rewards = torch.tensor([3.0, 1.0, -1.0] + [0.5] * 6)
    adv = compute_advantages("reinforce_pp_baseline", rewards, list("aaabbbbbb"))
    assert torch.allclose(adv, torch.tensor([2.0, 0, -2] + [0.0] * 6), atol=1e-5)


def test_reinforce_pp_baseline_leaves_single_member_groups_out_of_the_batch():
    # As above, but the batch is the first group alone (std 2): a group of one has no baseline.
    rewards = torch.tensor([3.0, 1.0, -1.0, 5.0])
    adv = compute_advantages("reinforce_pp_baseline", rewards, list("aaab"))
    assert torch.allclose(adv, torch.tensor([1.0, 0, -1, 0]), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_equal_rewards_give_exactly_zero(name, dtype):
    # §3 "All rewards equal -> A = 0 for every estimator". Ten rewards of 0.1 have a computed mean off by rounding
    # (float32: ~1e-9) and GRPO divides that by a std just as tiny (float32: -0.0074 instead of 0), which
    # "drop A = 0" would then keep.
    rewards = torch.tensor([0.1] * 10 + [1.0, 0.0], dtype=dtype)
    adv = compute_advantages(name, rewards, ["same"] * 10 + ["mixed"] * 2)
    assert torch.equal(adv[:10], torch.zeros(10))
    assert (adv[10:] != 0).all()


@pytest.mark.parametrize("name", ESTIMATORS)
def test_single_member_groups_get_zero(name):
    # §3 "Group of size 1": verl returns the raw reward; the recommendation (and ours) is 0.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    adv = compute_advantages(name, rewards, ["alone", "pair", "pair", "also alone"])
    assert adv[0] == 0 and adv[3] == 0
    assert adv[1] > 0 > adv[2]


# rewards [1, 0, 1, 0]: the last two are invalid (say, compact-filtered), their rewards must not matter.
INVALID_CASES = {
    # rLLM: invalid members count with reward 0 -> group rewards [1, 0, 0, 0], n = 4, unbiased std 0.5
    True: {"dr_grpo": [0.75, -0.25], "rloo": [1.0, -1 / 3], "grpo": [1.5, -0.5]},
    # left out: group rewards [1, 0], n = 2, std 0.7071
    False: {"dr_grpo": [0.5, -0.5], "rloo": [1.0, -1.0], "grpo": [0.70711, -0.70711]},
}


@pytest.mark.parametrize("invalid_as_zero", [True, False])
@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "grpo"])
def test_invalid_members_with_both_flag_values(name, invalid_as_zero):
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    valid = torch.tensor([True, True, False, False])
    adv = compute_advantages(name, rewards, ["g"] * 4, valid, invalid_as_zero=invalid_as_zero)
    expected = INVALID_CASES[invalid_as_zero][name] + [0.0, 0.0]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-4)


def test_one_valid_member_counts_only_when_invalid_siblings_count():
    rewards, valid = torch.tensor([1.0, 0.0]), torch.tensor([True, False])
    assert compute_advantages("rloo", rewards, [0, 0], valid, invalid_as_zero=False).tolist() == [0.0, 0.0]
    assert compute_advantages("rloo", rewards, [0, 0], valid, invalid_as_zero=True).tolist() == [1.0, 0.0]


def test_groups_are_matched_by_id_not_position():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    adv = compute_advantages("dr_grpo", rewards, ["x", ("y", 1), "x", ("y", 1), "x", ("y", 1)])
    assert torch.allclose(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 2 / 3, -1 / 3, -1 / 3]))
    assert adv.dtype == torch.float32


@pytest.mark.parametrize("as_type", [list, tuple, torch.tensor], ids=["list", "tuple", "tensor"])
def test_group_ids_of_any_sequence_type_group_by_value(as_type):
    # A tensor's elements hash by identity: read one by one, every trajectory was once a group of its own (all 0).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = compute_advantages("dr_grpo", rewards, as_type([7, 7, 3, 3]))
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]


@pytest.mark.parametrize("group_ids", [[torch.tensor(0), torch.tensor(0)], torch.zeros(2, 1), iter([0, 0])],
                         ids=["list of tensors", "2-D tensor", "iterator"])
def test_group_ids_that_cannot_group_by_value_are_refused(group_ids):
    with pytest.raises(TypeError, match="group ids"):
        compute_advantages("dr_grpo", torch.tensor([1.0, 0.0]), group_ids)


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: dr_grpo, grpo, reinforce_pp_baseline, rloo"):
        compute_advantages("ppo", torch.zeros(2), [0, 0])


def test_registered_estimator_is_used_by_name():
    register_estimator("double_centered")(lambda rewards, groups, eps: 2 * (rewards - groups.mean))
    try:
        adv = compute_advantages("double_centered", torch.tensor([1.0, 0.0]), [0, 0])
    finally:
        del ADVANTAGE_ESTIMATORS["double_centered"]
    assert adv.tolist() == [1.0, -1.0]
