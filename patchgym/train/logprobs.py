"""Per-token logprobs (and entropies) of a causal LM, computed only where they are needed.

The vocabulary projection is the costly part (SmolLM2: 49k logits per token, 192 KiB in fp32), so it is applied
only to the positions asked for (the sampled tokens), in chunks; when the chunk logits would be large, each chunk
is recomputed in the backward pass instead of being kept.
"""

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# Above this many logits (~1 GiB in fp32) a chunk is recomputed in backward rather than kept.
LOGIT_CHUNK_ELEMENTS = 1 << 28


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    positions: Tensor | None = None,
    entropy: bool = False,
    entropy_grad: bool = False,
    position_ids: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """[B, T] fp32: at t, log p(input_ids[t] | input_ids[<t]); 0 at position 0, on padding and outside `positions`.

    `positions` ([B, T], nonzero = wanted) limits the work to those tokens (default: every real token).
    With `entropy`, also return the [B, T] entropy of the distribution each of those tokens was drawn from,
    differentiable only with `entropy_grad`. `position_ids` default to the model's own (0..T-1).
    """
    wanted = (attention_mask if positions is None else positions).bool().clone()
    wanted[:, 0] = False
    rows, cols = wanted.nonzero(as_tuple=True)
    hidden = final_hidden_states(model, input_ids, attention_mask, position_ids=position_ids)
    logprobs, entropies = token_logprobs(model.get_output_embeddings(), hidden[rows, cols - 1], input_ids[rows, cols],
                                         entropy=entropy, entropy_grad=entropy_grad)
    scatter = lambda values: torch.zeros(input_ids.shape, dtype=values.dtype,  # noqa: E731
                                         device=values.device).index_put((rows, cols), values)
    if entropy:
        return scatter(logprobs), scatter(entropies)
    return scatter(logprobs)


def final_hidden_states(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, *,
                        position_ids: Tensor | None = None) -> Tensor:
    """The decoder's last hidden states [B, T, H], from a forward pass through the whole model.

    The pass goes through the model's own forward (so wrappers such as FSDP2 and peft see it) with a single logit
    kept; the hidden states are read off the decoder with a hook.
    """
    captured: list[Tensor] = []
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, output: captured.append(output[0] if isinstance(output, tuple) else
                                                     output.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=1,
              use_cache=False)
    finally:
        hook.remove()
    return captured[-1]


def token_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor, *, entropy: bool = False,
                   entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """([N] log softmax(head(hidden))[targets], [N] entropies or None), over row chunks of the logits."""
    rows_per_chunk = max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0])
    recompute = torch.is_grad_enabled() and hidden.shape[0] > rows_per_chunk
    parts = []
    for start in range(0, max(hidden.shape[0], 1), rows_per_chunk):
        args = (head, hidden[start:start + rows_per_chunk], targets[start:start + rows_per_chunk], entropy,
                entropy_grad)
        parts.append(checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args))
    logprobs = torch.cat([p[0] for p in parts])
    return logprobs, (torch.cat([p[1] for p in parts]) if entropy else None)


def _chunk(head: nn.Module, hidden: Tensor, targets: Tensor, entropy: bool,
           entropy_grad: bool) -> tuple[Tensor, Tensor]:
    logits = head(hidden).float()
    normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - normalizer
    if not entropy:
        return logprobs, logprobs.new_zeros(0)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # H = logsumexp(z) - sum softmax(z) z
        entropies = normalizer - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropies
