"""The sampling functions on hand-computed rows."""

import math

import pytest
import torch

from patchgym.inference.base import SamplingParams
from patchgym.inference.sampling import sample_token, temperature_logprobs, truncate

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log()


def kept(row: torch.Tensor) -> list[bool]:
    return torch.isfinite(row).tolist()


def test_defaults_are_the_unbiased_policy():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed, p.stop_token_ids) == (1.0, 1.0, 0, 0.0, None, ())


def test_temperature_logprobs_divide_logits_by_t():
    lp = temperature_logprobs(torch.tensor([0.0, math.log(3.0)]), 1.0)
    assert lp.exp().tolist() == pytest.approx([0.25, 0.75])
    lp = temperature_logprobs(torch.tensor([0.0, 2 * math.log(3.0)]), 2.0)  # logits / 2 = [0, log 3]
    assert lp.exp().tolist() == pytest.approx([0.25, 0.75])
    assert temperature_logprobs(LOGITS, 0.0).exp().tolist() == pytest.approx(PROBS.tolist())


def test_truncation_rules():
    lp = LOGITS
    assert kept(truncate(lp, 0, 1.0, 0.0)) == [True, True, True, True]
    assert kept(truncate(lp, 2, 1.0, 0.0)) == [True, True, False, False]
    assert kept(truncate(lp, 0, 0.8, 0.0)) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    assert kept(truncate(lp, 0, 0.81, 0.0)) == [True, True, True, False]
    assert kept(truncate(lp, 0, 0.1, 0.0)) == [True, False, False, False]  # the top token always survives
    assert kept(truncate(lp, 0, 1.0, 0.3)) == [True, True, True, False]  # keep p >= 0.3 * 0.5


def test_sample_token_reports_the_untruncated_logprob():
    params = SamplingParams(top_k=1, seed=0)
    token, logprob = sample_token(LOGITS, params, torch.Generator().manual_seed(0))
    assert token == 0 and logprob == pytest.approx(math.log(0.5))
    greedy, logprob = sample_token(LOGITS, SamplingParams(temperature=0), torch.Generator())
    assert greedy == 0 and logprob == pytest.approx(math.log(0.5))


def test_sample_token_follows_the_distribution():
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[sample_token(LOGITS, SamplingParams(), gen)[0]] += 1
    assert (counts / 4000).tolist() == pytest.approx(PROBS.tolist(), abs=0.03)


def test_invalid_params_are_refused():
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -1}, {"min_p": 1}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
