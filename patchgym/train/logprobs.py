"""Per-token logprobs (and entropies) of a causal LM, computed only where they are needed, from padded rows or from
sequences packed into one row.

The vocabulary projection is the costly part (SmolLM2: 49k logits per token, 192 KiB in fp32), so it is applied
only to the positions asked for (the sampled tokens), in chunks; when the chunk logits would be large, each chunk
is recomputed in the backward pass instead of being kept.

Inside `sampling_temperature(T)` they are of softmax(logits / T), the distribution rollouts at T sampled from.

Packed rows (patchgym.train.batch.collate_packed): positions restart per sequence, and attention stays inside each
sequence: under a flash-attention implementation by the varlen kernel's cu_seqlens (transformers' padding-free
path), otherwise by a block-diagonal causal 4-D mask, which transformers' masking utilities take as given.
"""

import contextlib
from contextvars import ContextVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# Above this many logits (~1 GiB in fp32) a chunk is recomputed in backward rather than kept.
LOGIT_CHUNK_ELEMENTS = 1 << 28

_TEMPERATURE: ContextVar[float] = ContextVar("sampling_temperature", default=1.0)


@contextlib.contextmanager
def sampling_temperature(temperature: float):
    """Inside, logprobs and entropies are those of softmax(logits / temperature): the distribution rollouts sampled
    at that temperature drew from, which the engines' logprobs are of (verl's actor scales its logits the same way),
    so that the update's ratios and its gap to the rollout logprobs compare like with like. 1 outside."""
    if temperature <= 0:
        raise ValueError(f"a sampling temperature must be > 0 to have logprobs, got {temperature}")
    token = _TEMPERATURE.set(float(temperature))
    try:
        yield
    finally:
        _TEMPERATURE.reset(token)


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
    hidden = final_hidden_states(model, input_ids, attention_mask)
    return _scattered(model, hidden[rows, cols - 1], input_ids[rows, cols], (rows, cols), input_ids.shape,
                      entropy, entropy_grad)


def packed_logprobs(model: nn.Module, packed_ids: Tensor, lengths: Tensor, positions: Tensor, *,
                    entropy: bool = False, entropy_grad: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """sequence_logprobs of sequences packed in one row (`packed_ids` [1, N], `lengths` [rows] summing to N), from
    one forward pass; laid out [rows, width] like `positions` (nonzero = wanted), 0 elsewhere and at each start."""
    wanted = positions.bool().clone()
    wanted[:, 0] = False
    rows, cols = wanted.nonzero(as_tuple=True)
    flat = (lengths.cumsum(0) - lengths)[rows] + cols  # where (row, col) sits in the packed row
    hidden = final_hidden_states(model, packed_ids, **packed_forward_kwargs(model, lengths))[0]
    return _scattered(model, hidden[flat - 1], packed_ids[0, flat], (rows, cols), positions.shape,
                      entropy, entropy_grad)


def batch_logprobs(model: nn.Module, batch: dict[str, Tensor], *, entropy: bool = False,
                   entropy_grad: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Logprobs (and entropies) at the loss-mask positions of a micro-batch, packed (`collate_packed`) or padded
    (`collate`); [rows, width] either way."""
    if "packed_ids" in batch:
        return packed_logprobs(model, batch["packed_ids"], batch["lengths"], batch["loss_mask"], entropy=entropy,
                               entropy_grad=entropy_grad)
    return sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], positions=batch["loss_mask"],
                             entropy=entropy, entropy_grad=entropy_grad)


def packed_forward_kwargs(model: nn.Module, lengths: Tensor) -> dict:
    """The forward arguments that keep packed sequences apart: position_ids restarting at each sequence, and either
    flash-attention's varlen boundaries (cu_seqlens) or a block-diagonal causal mask [1, 1, N, N], additive (0 or
    the dtype's min), which sdpa and eager attention both take; a row of one sequence needs neither."""
    device = lengths.device
    positions = torch.cat([torch.arange(int(n), device=device) for n in lengths])[None]
    implementation = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if implementation.startswith("flash"):
        bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        longest = int(lengths.max())
        return {"position_ids": positions, "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds,
                "max_length_q": longest, "max_length_k": longest}
    if len(lengths) == 1:
        # One sequence: the model's own causal mask is the block mask, and sdpa's causal kernel skips the upper
        # triangle that a dense mask makes it compute (CPU, SmolLM2, 2,500 tokens: about 1.5x faster).
        return {"position_ids": positions}
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    allowed = (sequence[:, None] == sequence[None, :]).tril()[None, None]
    # Additive, not bool: sdpa keeps a bool mask for backward as a float copy per layer, but a float one it keeps
    # as given, so all layers share this one (measured on CPU: 4 N^2 bytes in all, not 4 N^2 per layer).
    dtype = _attention_dtype(model, device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return {"position_ids": positions, "attention_mask": mask}


def _attention_dtype(model: nn.Module, device: torch.device) -> torch.dtype:
    """The dtype the attention scores are in: autocast's when it is on for `device`, else the parameters'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def _scattered(model: nn.Module, hidden: Tensor, targets: Tensor, index: tuple[Tensor, Tensor], shape,
               entropy: bool, entropy_grad: bool) -> Tensor | tuple[Tensor, Tensor]:
    """token_logprobs of `hidden` (one row per wanted token) put back at `index` of a zero [rows, width] tensor."""
    logprobs, entropies = token_logprobs(model.get_output_embeddings(), hidden, targets, entropy=entropy,
                                         entropy_grad=entropy_grad)
    scatter = lambda values: torch.zeros(shape, dtype=values.dtype,  # noqa: E731
                                         device=values.device).index_put(index, values)
    if entropy:
        return scatter(logprobs), scatter(entropies)
    return scatter(logprobs)


def final_hidden_states(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None, **forward) -> Tensor:
    """The decoder's last hidden states [B, T, H], from a forward pass through the whole model (`forward`: extra
    arguments of that pass, e.g. packed_forward_kwargs).

    The pass goes through the model's own forward (so wrappers such as FSDP2 and peft see it) with a single logit
    kept; the hidden states are read off the decoder with a hook.
    """
    captured: list[Tensor] = []
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, output: captured.append(output[0] if isinstance(output, tuple) else
                                                     output.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1, use_cache=False, **forward)
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
    temperature = _TEMPERATURE.get()
    if temperature != 1.0:
        logits = logits / temperature
    normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - normalizer
    if not entropy:
        return logprobs, logprobs.new_zeros(0)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # H = logsumexp(z) - sum softmax(z) z
        entropies = normalizer - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropies
