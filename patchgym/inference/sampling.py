"""Pure tensor functions that turn one row of next-token logits into a sampled id and its logprob."""

import torch

from patchgym.inference.base import SamplingParams


def temperature_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) over the vocabulary; T = 0 (greedy) reports the model's own T = 1 distribution."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def truncate(logprobs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Set to -inf every token that top-k, then top-p (nucleus), then min-p would exclude; off values pass through."""
    out = logprobs
    if top_k > 0 and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = torch.sort(out, descending=True)
        cum = torch.cumsum(sorted_lp.exp(), dim=-1)
        # Keep a token while the mass strictly before it is < top_p, so the top token always survives.
        drop_sorted = (cum - sorted_lp.exp()) >= top_p
        out = out.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    if min_p > 0.0:
        out = out.masked_fill(out < out.max() + torch.log(torch.tensor(min_p)), float("-inf"))
    return out


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Sample one id from a [vocab] row of logits; return it with its logprob (see Generation.logprobs)."""
    logprobs = temperature_logprobs(logits, params.temperature)
    if params.greedy:
        token = int(torch.argmax(logprobs))
    else:
        kept = truncate(logprobs, params.top_k, params.top_p, params.min_p)
        token = int(torch.multinomial(torch.softmax(kept, dim=-1), 1, generator=generator))
    return token, float(logprobs[token])
