"""Per-token policy loss (clipped PPO ratio, dual clip, truncated importance sampling), KL and entropy terms, and
the one aggregation every term goes through (docs/algorithms.md §1, §2, §8, §9).

All tensors are [batch, tokens]; `mask` is 1 on policy-sampled tokens only. Denominators are explicit
(`global_tokens`, `global_seqs`: the totals over the whole optimizer step, see `step_denominators`), so that the
sum of the losses of a step's micro-batches is exactly the loss of the full batch.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from patchgym.registry import Registry

LOG_RATIO_LIMIT = 20.0  # verl clamps log-ratios to +-20 so exp() cannot overflow


@dataclass(frozen=True)
class Denominators:
    """What a reduction divides by: masked tokens and non-empty sequences of the whole optimizer step (over all
    data-parallel ranks), and L_const where the aggregation uses one."""

    tokens: float
    seqs: float
    norm_constant: float | None = None


Aggregator = Callable[[Tensor, Tensor, Denominators], Tensor]  # (row sums of m*l, row token counts, denominators)
AGGREGATIONS: Registry[Aggregator] = Registry("loss aggregation")
# Decorator: make a loss aggregation available to `aggregate_loss` (and the config) under a name.
register_aggregation = AGGREGATIONS.register


@register_aggregation("token-mean")
def token_mean(row_sums: Tensor, row_tokens: Tensor, den: Denominators) -> Tensor:
    """sum_{i,k} m*l / sum_{i,k} m (DAPO, Nebius Eq. 8)."""
    return row_sums.sum() / max(den.tokens, 1)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(row_sums: Tensor, row_tokens: Tensor, den: Denominators) -> Tensor:
    """(1/B) sum_i [sum_k m*l / L_i] (original GRPO); B counts sequences with at least one policy token."""
    return (row_sums / row_tokens.clamp(min=1)).sum() / max(den.seqs, 1)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(row_sums: Tensor, row_tokens: Tensor, den: Denominators) -> Tensor:
    """(1/B) sum_i sum_k m*l (DeepSWE's rLLM scripts)."""
    return row_sums.sum() / max(den.seqs, 1)


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(row_sums: Tensor, row_tokens: Tensor, den: Denominators) -> Tensor:
    """(1/B) sum_i sum_k m*l / L_const (Dr. GRPO in oat, SkyRL; verl omits the 1/B)."""
    if den.norm_constant is None:
        # verl's fallback, the padded width, changes with padding and micro-batching, so it is never guessed.
        raise ValueError("loss aggregation 'seq-mean-token-sum-norm' needs norm_constant (L_const)")
    return row_sums.sum() / (max(den.seqs, 1) * den.norm_constant)


def step_denominators(mask: Tensor) -> tuple[int, int]:
    """(policy tokens, sequences with at least one policy token) of `mask`: pass the whole step's mask here."""
    return int(mask.sum()), int((mask.sum(-1) > 0).sum())


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    norm_constant: float | None = None,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    row_tokens: Tensor | None = None,
) -> Tensor:
    """Reduce a [batch, tokens] loss to a scalar with `mode`; denominators default to those of `mask` itself.

    `row_tokens` [batch] is L_i of each row's sequence; a step-wise row (one turn of a trajectory) carries its
    whole trajectory's policy tokens there, so seq-mean-token-mean counts the trajectory as one sequence (the
    count B of `global_seqs` then counts trajectories too: patchgym.train.batch). Default: each row's own tokens.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(sorted(AGGREGATIONS))}")
    tokens, seqs = step_denominators(mask)
    den = Denominators(tokens=tokens if global_tokens is None else global_tokens,
                       seqs=seqs if global_seqs is None else global_seqs, norm_constant=norm_constant)
    mask = mask.to(per_token.dtype)
    # where(), not a product: a padded position may hold inf or NaN, and inf * 0 would make the loss NaN.
    row_sums = torch.where(mask > 0, per_token, 0.0).sum(-1)
    return AGGREGATIONS[mode](row_sums, mask.sum(-1) if row_tokens is None else row_tokens.to(mask.dtype), den)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    agg_mode: str,
    norm_constant: float | None = None,
    rollout_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    row_tokens: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss (minimised) and its metrics.

    l1 = -A*r, l2 = -A*clip(r, 1-clip_low, 1+clip_high), l = max(l1, l2); for A < 0 with dual clip c: min(l, -A*c).
    With rollout logprobs and `tis_cap`, l is multiplied by the detached min(exp(old - rollout), tis_cap).
    """
    if tis_cap is not None and rollout_logprobs is None:
        raise ValueError("tis_cap is set but no rollout_logprobs were given")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    negative = advantages < 0
    dual_active = torch.zeros_like(negative)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_active = negative & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    weights = None
    if rollout_logprobs is not None and tis_cap is not None:
        weights = torch.exp(old_logprobs - rollout_logprobs).clamp(max=tis_cap).detach()
        loss = loss * weights
    total = aggregate_loss(loss, mask, agg_mode, norm_constant, global_tokens=global_tokens, global_seqs=global_seqs,
                           row_tokens=row_tokens)
    with torch.no_grad():
        clip_active = clipped > unclipped
        metrics = {
            "tokens": float(mask.sum()),  # weight for averaging the other metrics over micro-batches
            "clip_frac_low": _masked_mean(clip_active & negative, mask),
            "clip_frac_high": _masked_mean(clip_active & (advantages > 0), mask),
            "clip_frac_dual": _masked_mean(dual_active, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            # k3 estimate of KL(old || new) on tokens sampled from old: (r - 1) - log r, never negative.
            "approx_kl": _masked_mean(ratio - 1 - log_ratio, mask),
        }
        if rollout_logprobs is not None:
            metrics["rollout_logprob_gap"] = _masked_mean((old_logprobs - rollout_logprobs).abs(), mask)
        if weights is not None:
            metrics["tis_weight_mean"] = _masked_mean(weights, mask)
    return total, metrics


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": lambda delta: -delta,  # unbiased, high variance, can be negative
    "k2": lambda delta: 0.5 * delta**2,  # biased, low variance; its gradient is the true KL gradient
    # unbiased and >= 0 ("low_var_kl"); clamped like verl so one far-off token cannot dominate
    "k3": lambda delta: (torch.exp(delta) - delta - 1).clamp(-10, 10),
}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) with delta = ref - logprobs: k1 = -delta, k2 = delta^2/2,
    k3 = exp(delta) - delta - 1."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; known: {', '.join(sorted(KL_ESTIMATORS))}")
    delta = (ref_logprobs - logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return KL_ESTIMATORS[kind](delta)


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    tokens = float(mask.sum())
    if tokens == 0:
        return 0.0
    return float(torch.where(mask > 0, values.to(torch.float64), 0.0).sum() / tokens)
