"""Ulysses sequence parallelism (train.sequence_parallel = N): each sequence is cut into N equal chunks of tokens,
one per rank of an SP group; attention swaps tokens for heads with an all-to-all (every rank then holds all tokens
of H/N heads), attends, and swaps back. Everything else in the model works on the rank's own tokens.

The ranks form a dp x sp mesh: rank r is member r % sp of SP group r // sp; the ranks of one SP group see the
same sequences, and the dp groups (one member of each SP group) split the batch. FSDP2 shards over all ranks and
sums every gradient over them: that adds the SP members' partial gradients and the dp shares in one reduction.

Each SP member computes the same loss over the whole sequence (its logprobs are gathered), but the gather passes
back only the member's own chunk of the gradient, so the members' parameter gradients add up to the gradient of
that one loss. The targets are shifted before the cut, so a chunk's last token predicts the next chunk's first.
"""

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from patchgym.errors import UserError
from patchgym.train import logprobs as plain

ATTENTION = "ulysses_sdpa"  # the name registered with transformers' AttentionInterface


class SequenceParallelError(UserError, ValueError):
    """A train.sequence_parallel that does not fit the processes or the model."""


@dataclass(frozen=True)
class Mesh:
    """The dp x sp layout of `world` ranks: pure arithmetic, the same on every rank."""

    world: int
    sp: int

    def __post_init__(self):
        if self.sp < 1 or self.world % self.sp:
            raise SequenceParallelError(f"train.sequence_parallel ({self.sp}) must divide the number of processes "
                                        f"({self.world}, torchrun's WORLD_SIZE)")

    @property
    def dp(self) -> int:
        return self.world // self.sp

    def sp_groups(self) -> list[list[int]]:
        """The ranks that share sequences: consecutive ranks (on one node, so the all-to-alls stay local)."""
        return [list(range(d * self.sp, (d + 1) * self.sp)) for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        """The ranks that split the batch: one member of every SP group, the same member index."""
        return [list(range(s, self.world, self.sp)) for s in range(self.sp)]

    def dp_rank(self, rank: int) -> int:
        """Which share of the batch `rank` holds."""
        return rank // self.sp

    def spread(self, shares: list) -> list:
        """One item per rank from one per dp group: every member of an SP group gets its group's share."""
        if len(shares) != self.dp:
            raise ValueError(f"{len(shares)} shares for {self.dp} dp groups")
        return [shares[self.dp_rank(rank)] for rank in range(self.world)]


def check_heads(model_config, sp: int) -> None:
    """Refuse a model whose attention or key/value heads do not split into `sp` equal parts."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    if heads % sp or kv_heads % sp:
        raise SequenceParallelError(
            f"train.sequence_parallel ({sp}) must divide the model's attention heads ({heads}) and key/value heads "
            f"({kv_heads}): Ulysses gives each rank whole heads")


@dataclass
class _Group:
    group: object
    size: int
    rank: int


_ACTIVE: _Group | None = None  # this process's SP group, once enabled (one per process, as the groups are)


def new_groups(mesh: Mesh, rank: int) -> tuple[object, object]:
    """(this rank's SP group, its dp group) as process groups; every rank must call it, in the same order."""
    sp_group, _ = dist.new_subgroups_by_enumeration(mesh.sp_groups())
    dp_group, _ = dist.new_subgroups_by_enumeration(mesh.dp_groups())
    return sp_group, dp_group


def enable(model: nn.Module, sp_group) -> nn.Module:
    """Make `model`'s attention Ulysses over `sp_group` (check_heads first); sequence_logprobs then cuts sequences."""
    global _ACTIVE
    from transformers import AttentionInterface

    size = dist.get_world_size(sp_group)
    check_heads(model.config, size)
    AttentionInterface.register(ATTENTION, ulysses_attention)
    model.config._attn_implementation = ATTENTION
    _ACTIVE = _Group(sp_group, size, dist.get_rank(sp_group))
    return model


def disable() -> None:
    """Forget the SP group (models already switched keep calling ulysses_attention)."""
    global _ACTIVE
    _ACTIVE = None


def gradient_group(process_group):
    """The group to sum plain (unsharded) gradients over: every rank under SP (the data group holds one member of
    each SP group, whose partial gradients must be added too), else `process_group` itself."""
    return dist.group.WORLD if _ACTIVE is not None else process_group


def is_sequence_parallel(model: nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == ATTENTION


def sequence_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, positions: Tensor | None = None,
                      entropy: bool = False, entropy_grad: bool = False, position_ids: Tensor | None = None):
    """logprobs.sequence_logprobs (same arguments and result, on the whole [B, T]), with each sequence cut over the
    SP group when `model` is sequence-parallel. `position_ids` ([B, T], default 0..T-1 per row) may restart inside
    a row (packed sequences): attention then stays within each restart's span."""
    if not is_sequence_parallel(model):
        return plain.sequence_logprobs(model, input_ids, attention_mask, positions=positions, entropy=entropy,
                                       entropy_grad=entropy_grad, position_ids=position_ids)
    group, n, me = _ACTIVE.group, _ACTIVE.size, _ACTIVE.rank
    rows, width = input_ids.shape
    chunk = math.ceil(width / n)
    padded = chunk * n
    wanted = (attention_mask if positions is None else positions).bool().clone()
    wanted[:, 0] = False
    if position_ids is None:
        position_ids = torch.arange(width, device=input_ids.device).expand(rows, -1)
    pad = padded - width
    ids = nn.functional.pad(input_ids, (0, pad))
    # Past the end the positions count on, so the padding stays in the last sequence's span (it is never a target).
    pos = torch.cat([position_ids, position_ids[:, -1:] + 1 + torch.arange(pad, device=ids.device)], dim=1)
    # Shift before the cut: the hidden state at t predicts ids[t + 1], which may sit in the next rank's chunk.
    targets = nn.functional.pad(ids[:, 1:], (0, 1))
    wanted_next = nn.functional.pad(wanted[:, 1:], (0, pad + 1))
    mine = slice(me * chunk, (me + 1) * chunk)
    hidden = plain.final_hidden_states(model, ids[:, mine].contiguous(), None, position_ids=pos[:, mine].contiguous())
    r, c = wanted_next[:, mine].nonzero(as_tuple=True)
    lp, ent = plain.token_logprobs(model.get_output_embeddings(), hidden[r, c], targets[:, mine][r, c],
                                   entropy=entropy, entropy_grad=entropy_grad)

    def whole(values: Tensor) -> Tensor:  # this chunk's next-token values, gathered and put back at the target
        local = torch.zeros(rows, chunk, dtype=values.dtype, device=values.device).index_put((r, c), values)
        full = _GatherChunks.apply(local, group, n, me)
        return torch.cat([full.new_zeros(rows, 1), full[:, :width - 1]], dim=1)

    return (whole(lp), whole(ent)) if entropy else whole(lp)


def ulysses_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
    """transformers' attention signature on this rank's chunk ([B, heads, T/N, D]): all-to-all to [B, heads/N, T, D],
    sdpa over the whole sequence (causal; within each packed span when the positions restart), all-to-all back to
    [B, T/N, heads, D]. The model's own mask is not used (it would cover the chunk only)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    group = _ACTIVE.group
    query, key, value = (_AllToAll.apply(x, group, 1, 2) for x in (query, key, value))
    mask = _span_mask(kwargs.get("position_ids"), group, query.shape[0])
    out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=kwargs.get("dropout", 0.0),
                                    scaling=kwargs.get("scaling"), is_causal=mask is None)
    return _AllToAll.apply(out.contiguous(), group, 1, 2), None


def _span_mask(position_ids: Tensor | None, group, rows: int) -> Tensor | None:
    """None (plain causal) unless some row's whole-sequence positions restart at 0 after its start; then the
    [B, 1, T, T] boolean mask of causal attention within each span."""
    if position_ids is None:
        return None
    parts = [torch.empty_like(position_ids) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, position_ids.contiguous(), group=group)
    pos = torch.cat(parts, dim=1).expand(rows, -1)
    starts = pos == 0
    starts[:, 0] = True
    if not starts[:, 1:].any():
        return None
    span = starts.cumsum(dim=1)
    length = pos.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=pos.device).tril()
    return (causal & (span[:, :, None] == span[:, None, :]))[:, None]


class _AllToAll(torch.autograd.Function):
    """Cut `x` into the group's size along `scatter_dim`, send piece j to rank j, join what arrives along
    `gather_dim`; its gradient is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x: Tensor, group, scatter_dim: int, gather_dim: int) -> Tensor:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), ctx.group, gather_dim, scatter_dim), None, None, None


def _all_to_all(x: Tensor, group, scatter_dim: int, gather_dim: int) -> Tensor:
    pieces = [p.contiguous() for p in x.chunk(dist.get_world_size(group), dim=scatter_dim)]
    received = [torch.empty_like(p) for p in pieces]
    dist.all_to_all(received, pieces, group=group)
    return torch.cat(received, dim=gather_dim)


class _GatherChunks(torch.autograd.Function):
    """All chunks [B, T/N] joined to [B, T] on every member. Every member computes the same loss from them, so the
    gradient of a member's chunk is its own slice of its own gradient: no communication back."""

    @staticmethod
    def forward(ctx, local: Tensor, group, size: int, rank: int) -> Tensor:
        ctx.rank, ctx.chunk = rank, local.shape[1]
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad[:, ctx.rank * ctx.chunk:(ctx.rank + 1) * ctx.chunk], None, None, None
