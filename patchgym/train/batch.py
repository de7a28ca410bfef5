"""Training batches from trajectories: one token sequence per trajectory (built from its stored ids, never
re-tokenised), or one per turn for step-wise trajectories (agent.history template), micro-batches grouped by a token
budget, and the tensors of one forward pass: packed (the sequences back to back in one row, no padding) or padded.

Step-wise normalisation: the steps of one trajectory count as that one trajectory. Every step row carries its
trajectory's advantage, weight 1/steps (so B, the sequence count of seq-mean aggregations, counts trajectories) and
its trajectory's policy tokens as L_i (so seq-mean-token-mean divides by the trajectory's length, not the step's).
token-mean needs nothing: it counts tokens. The loss of a step-wise trajectory is then the loss its turns would
have as one sequence, with the same tokens sampled.
"""

from collections.abc import Sequence, Sized
from dataclasses import dataclass

import torch
from torch import Tensor

from patchgym.agent.tokens import build_training_sequence
from patchgym.agent.trajectory import Trajectory


@dataclass
class TrainSequence:
    """One trajectory as the trainer sees it; the three lists are aligned by position."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on sampled tokens (end-of-turn included), 0 on prompt, observations, template closings
    rollout_logprobs: list[float]  # the engine's logprob of each sampled token, 0 elsewhere
    advantage: float
    trajectory_id: str = ""
    weight: float = 1.0  # its share of its trajectory in the sequence count B: 1 / steps for a step-wise row
    trajectory_tokens: int = 0  # L_i of seq-mean-token-mean: its trajectory's policy tokens (0: its own)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def policy_tokens(self) -> int:
        return sum(self.loss_mask)


def sequences_from_trajectories(
    trajectories: Sequence[Trajectory], advantages: Sequence[float], *, mask_format_errors: bool = False
) -> list[TrainSequence]:
    """One TrainSequence per trajectory that has a token to learn from, with its advantage.

    `mask_format_errors` zeroes the mask of turns the environment could not parse (RFT/SFT: learn only the turns
    that worked). A trajectory left with no masked-in token is skipped: it would add nothing to any loss or
    denominator. Pass only trajectories that take loss (compact filtering drops the others before this).
    """
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
    sequences = []
    for trajectory, advantage in zip(trajectories, advantages):
        if trajectory.history == "template":
            sequences += step_sequences(trajectory, float(advantage), mask_format_errors=mask_format_errors)
            continue
        input_ids, loss_mask, logprobs = build_training_sequence(trajectory)
        if mask_format_errors:
            loss_mask = _mask_format_error_turns(trajectory, loss_mask)
        if any(loss_mask):
            sequences.append(TrainSequence(input_ids, loss_mask, logprobs, float(advantage), trajectory.trajectory_id))
    return sequences


def step_sequences(trajectory: Trajectory, advantage: float, *,
                   mask_format_errors: bool = False) -> list[TrainSequence]:
    """One TrainSequence per turn of a step-wise trajectory: the prompt exactly as rendered at that turn, plus its
    sampled ids, weighted so that the trajectory counts once (see the module docstring)."""
    turns = [t for t in trajectory.turns if t.completion_ids and not (mask_format_errors and t.format_error)]
    total = sum(len(t.completion_ids) for t in turns)
    if not turns:
        return []
    return [TrainSequence(t.prompt_ids + t.output_ids, [0] * len(t.prompt_ids) + t.output_mask,
                          [0.0] * len(t.prompt_ids) + t.output_logprobs, advantage, trajectory.trajectory_id,
                          weight=1 / len(turns), trajectory_tokens=total) for t in turns]


def stepwise_extra_tokens(trajectories: Sequence[Trajectory]) -> int:
    """Input tokens that step-wise training feeds beyond one sequence per trajectory: every step re-feeds its
    prompt, so this is the sum of all steps' lengths minus the last step's (which holds the whole history)."""
    extra = 0
    for trajectory in trajectories:
        if trajectory.history == "template" and trajectory.turns:
            lengths = [len(t.prompt_ids) + len(t.output_ids) for t in trajectory.turns]
            extra += sum(lengths) - lengths[-1]
    return extra


def _mask_format_error_turns(trajectory: Trajectory, loss_mask: list[int]) -> list[int]:
    """A copy of `loss_mask` with the sampled ids of format-error turns set to 0 (same layout as the sequence)."""
    masked = list(loss_mask)
    start = 0
    for turn in trajectory.turns:
        start += len(turn.prompt_ids)
        if turn.format_error:
            masked[start:start + len(turn.output_ids)] = [0] * len(turn.output_ids)
        start += len(turn.output_ids) + len(turn.close_ids)
    return masked


def pack_micro_batches(sequences: Sequence[Sized], token_budget: int) -> list[list[int]]:
    """Indices of `sequences` (anything with a length: TrainSequences, id lists) grouped so that each group's
    padded size (rows x longest) is <= `token_budget`.

    Greedy over the sequences sorted longest first, so each group pads little; a sequence longer than the budget
    gets a group of its own. The result depends only on the lengths, so every rank packs the same way.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    groups: list[list[int]] = []
    for i in order:
        # Sorted longest first, so a group's first member sets its padded width.
        if groups and (len(groups[-1]) + 1) * len(sequences[groups[-1][0]]) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pack_sequences(sequences: Sequence[Sized], token_budget: int) -> list[list[int]]:
    """Indices of `sequences` grouped so that each group's total length is <= `token_budget` (they are packed into
    one row, so nothing is padded).

    First-fit decreasing: longest first, each into the first group with room; a sequence longer than the budget
    gets a group of its own. The result depends only on the lengths, so every rank packs the same way.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    groups: list[list[int]] = []
    room: list[int] = []
    for i in order:
        length = len(sequences[i])
        fits = next((g for g, free in enumerate(room) if length <= free), None)
        if fits is None:
            groups.append([i])
            room.append(token_budget - length)
        else:
            groups[fits].append(i)
            room[fits] -= length
    return groups


def collate_packed(sequences: Sequence[TrainSequence]) -> dict[str, Tensor]:
    """The model's input as one row with no padding: packed_ids and position_ids [1, sum of lengths] (positions
    restart at 0 at each sequence) and lengths [rows]. The per-token loss tensors (loss_mask, rollout_logprobs,
    advantages, row_tokens, and attention_mask marking real tokens) keep collate's [rows, width] layout, because
    every loss aggregation sums per sequence; `patchgym.train.logprobs.batch_logprobs` maps between the two."""
    rows = collate(sequences, pad_id=0)
    del rows["input_ids"]
    return {
        "packed_ids": torch.tensor([[t for s in sequences for t in s.input_ids]], dtype=torch.long),
        "position_ids": torch.tensor([[p for s in sequences for p in range(len(s))]], dtype=torch.long),
        "lengths": torch.tensor([len(s) for s in sequences], dtype=torch.long),
        **rows,
    }


def collate(sequences: Sequence[TrainSequence], pad_id: int) -> dict[str, Tensor]:
    """Right-padded [rows, width] tensors: input_ids, attention_mask, loss_mask, rollout_logprobs, and advantages
    (each row's advantage repeated over its positions; the loss mask decides where it counts)."""
    width = max(len(s) for s in sequences)

    def padded(values: list, fill, dtype: torch.dtype) -> Tensor:
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype)

    return {
        "input_ids": padded([s.input_ids for s in sequences], pad_id, torch.long),
        "attention_mask": padded([[1] * len(s) for s in sequences], 0, torch.long),
        "loss_mask": padded([s.loss_mask for s in sequences], 0, torch.float32),
        "rollout_logprobs": padded([s.rollout_logprobs for s in sequences], 0.0, torch.float32),
        "advantages": torch.tensor([[s.advantage] for s in sequences], dtype=torch.float32).expand(-1, width).clone(),
        "row_tokens": torch.tensor([s.trajectory_tokens or s.policy_tokens for s in sequences], dtype=torch.float32),
    }
