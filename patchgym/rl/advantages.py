"""Advantage estimators: one scalar per trajectory from the outcome rewards of its group (docs/algorithms.md §3).

Every estimator is a small registered function over per-trajectory group statistics; `compute_advantages` builds
those statistics once (which members count, their mean and unbiased std) and applies the rules every estimator
shares: a group with fewer than 2 counted members, a group whose counted rewards are all equal, and an invalid
(filtered) trajectory all get advantage 0.
"""

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from patchgym.registry import Registry


@dataclass(frozen=True)
class GroupStats:
    """For each trajectory, statistics of its group over the members that count (float64, one value per trajectory).

    `std` is unbiased (n - 1), as in verl, SkyRL and oat; it is NaN where `size` < 2, which `trained` excludes.
    """

    size: Tensor  # n_eff: members of the group that count in its statistics
    mean: Tensor
    std: Tensor
    all_equal: Tensor  # bool: the group's counted rewards are all equal
    valid: Tensor  # bool: the trajectory itself takes loss

    @property
    def in_batch(self) -> Tensor:
        """Valid trajectories of groups with n_eff >= 2: the batch that REINFORCE++-baseline whitens over."""
        return self.valid & (self.size >= 2)

    @property
    def trained(self) -> Tensor:
        """Trajectories that may get a nonzero advantage; every other one gets exactly 0."""
        return self.in_batch & ~self.all_equal


Estimator = Callable[[Tensor, GroupStats, float], Tensor]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
# Decorator: make an estimator available to `compute_advantages` (and the config) under a name.
register_estimator = ADVANTAGE_ESTIMATORS.register


@register_estimator("grpo")
def group_normalized_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    """GRPO: A_i = (R_i - mean) / (std + eps), std unbiased."""
    return (rewards - groups.mean) / (groups.std + eps)


@register_estimator("dr_grpo")
def mean_centered_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    """Dr. GRPO: A_i = R_i - mean (no std, so no difficulty bias)."""
    return rewards - groups.mean


@register_estimator("rloo")
def leave_one_out_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    """RLOO / LOOP: A_i = R_i - mean_{j != i} R_j = n/(n-1) * (R_i - mean), n = counted members."""
    return (rewards - groups.mean) * groups.size / (groups.size - 1)


@register_estimator("reinforce_pp_baseline")
def batch_whitened_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    """REINFORCE++-baseline: a_i = R_i - group mean, then whitened over the batch: (a - mean(a)) / (std(a) + eps).

    Whitened over trajectories (as rLLM), not tokens (as verl); std unbiased. Groups of equal rewards are in the
    batch (with a = 0) but keep advantage 0.
    """
    centered = rewards - groups.mean
    pool = centered[groups.in_batch]
    if pool.numel() < 2:
        return torch.zeros_like(rewards)
    return (centered - pool.mean()) / (pool.std() + eps)


def compute_advantages(
    estimator: str,
    rewards: Tensor,
    group_ids: Sequence[Hashable] | Tensor,
    valid: Tensor | None = None,
    *,
    eps: float = 1e-6,
    invalid_as_zero: bool = True,
) -> Tensor:
    """One advantage per trajectory, in the dtype of `rewards`.

    `group_ids` are compared by value (strings, numbers, tuples, or a 1-D tensor of them). `valid` (bool, default
    all True) marks trajectories that take loss. With `invalid_as_zero` (rLLM) an invalid
    trajectory stays in its group's statistics with reward 0; without it, it is left out of them. Either way its
    own advantage is 0.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}")
    index = _group_index(group_ids)
    if rewards.ndim != 1 or index.numel() != rewards.numel():
        raise ValueError(f"need 1-D rewards and one group id each; got shape {tuple(rewards.shape)}, "
                         f"{index.numel()} group ids")
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    counted = torch.ones_like(valid) if invalid_as_zero else valid
    # float64 so that a group of equal rewards is not turned into rounding noise divided by a tiny std.
    stat_rewards = torch.where(valid, rewards.double(), 0.0)
    groups = group_stats(stat_rewards, index, counted, valid)
    advantages = ADVANTAGE_ESTIMATORS[estimator](stat_rewards, groups, eps)
    return torch.where(groups.trained, advantages, 0.0).to(rewards.dtype)


def group_stats(rewards: Tensor, index: Tensor, counted: Tensor, valid: Tensor) -> GroupStats:
    """Per-trajectory size, mean and unbiased std of its group over `counted` members; see GroupStats."""
    num_groups = int(index.max()) + 1 if index.numel() else 0
    weight = counted.double()

    def per_group_sum(values: Tensor) -> Tensor:
        return torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, values * weight)[index]

    size = per_group_sum(torch.ones_like(rewards))
    mean = per_group_sum(rewards) / size.clamp(min=1)
    std = (per_group_sum((rewards - mean) ** 2) / (size - 1)).sqrt()
    highest = _group_extreme(rewards, index, counted, num_groups, "amax")
    lowest = _group_extreme(rewards, index, counted, num_groups, "amin")
    return GroupStats(size=size, mean=mean, std=std, all_equal=highest <= lowest, valid=valid)


def _group_extreme(rewards: Tensor, index: Tensor, counted: Tensor, num_groups: int, reduce: str) -> Tensor:
    fill = -torch.inf if reduce == "amax" else torch.inf
    values = torch.where(counted, rewards, fill)
    out = torch.full((num_groups,), fill, dtype=rewards.dtype)
    return out.scatter_reduce(0, index, values, reduce=reduce)[index]


def _group_index(group_ids: Sequence[Hashable] | Tensor) -> Tensor:
    """Each trajectory's group number, in order of first appearance. A tensor element hashes by identity, not by
    value (every trajectory would be a group of its own, all advantages 0), so a tensor (or array) is read as its
    values, and ids that cannot be compared by value are refused."""
    if hasattr(group_ids, "tolist"):  # a torch tensor or a numpy array
        if group_ids.ndim != 1:
            raise TypeError(f"group ids as a tensor must be 1-D, got shape {tuple(group_ids.shape)}")
        group_ids = group_ids.tolist()
    if not isinstance(group_ids, Sequence):
        raise TypeError(f"group ids must be a sequence (list, tuple, 1-D tensor), got a {type(group_ids).__name__}")
    positions: dict[Hashable, int] = {}
    index = []
    for g in group_ids:
        if isinstance(g, Tensor):
            raise TypeError("group ids must be values, not tensors (which hash by identity): pass ids.tolist()")
        index.append(positions.setdefault(g, len(positions)))
    return torch.tensor(index, dtype=torch.long)
