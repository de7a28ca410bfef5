"""Step-wise samples (agent.history template): one sequence per turn, each with its trajectory's advantage, and a
normalisation that counts a trajectory once however many steps it has, checked against hand-computed losses."""

import pytest
import torch

from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.rl.losses import aggregate_loss
from patchgym.train.batch import collate, sequences_from_trajectories, stepwise_extra_tokens
from patchgym.train.update import step_denominators_of


def turn(prompt: list[int], sampled: list[int], format_error: bool = False) -> Turn:
    return Turn(prompt_ids=prompt, completion_ids=sampled, logprobs=[-0.5] * len(sampled), finish_reason="stop",
                close_ids=[9], action="", format_error=format_error)


# A: step-wise, two steps; the second prompt re-renders the first (ids 1, 2, 10, 11 then 3).
STEPWISE = Trajectory(task_id="a", trajectory_id="a#0", history="template",
                      turns=[turn([1, 2], [10, 11]), turn([1, 2, 10, 11, 3], [12, 13, 14])])
# B: one kept sequence with one sampled token.
KEPT = Trajectory(task_id="b", trajectory_id="b#0", turns=[turn([1, 2], [20])])


def test_each_step_is_its_prompt_plus_its_sample_with_the_trajectory_advantage():
    a1, a2, b = sequences_from_trajectories([STEPWISE, KEPT], [2.0, -1.0])
    assert (a1.input_ids, a1.loss_mask) == ([1, 2, 10, 11], [0, 0, 1, 1])
    assert (a2.input_ids, a2.loss_mask) == ([1, 2, 10, 11, 3, 12, 13, 14], [0] * 5 + [1] * 3)
    assert a1.rollout_logprobs == [0.0, 0.0, -0.5, -0.5]
    assert a1.advantage == a2.advantage == 2.0 and b.advantage == -1.0
    assert (a1.weight, a1.trajectory_tokens, b.weight, b.trajectory_tokens) == (0.5, 5, 1.0, 0)
    assert b.input_ids == [1, 2, 20, 9]  # a kept trajectory is still one sequence, its closing appended


@pytest.mark.parametrize("mode, expected", [
    # per-token losses: A's sampled tokens 1, 2 | 3, 4, 5 (sum 15, 5 tokens); B's one token 6.
    ("token-mean", (15 + 6) / 6),
    ("seq-mean-token-mean", (15 / 5 + 6 / 1) / 2),  # A counted once, divided by its 5 tokens, B by its 1
    ("seq-mean-token-sum", (15 + 6) / 2),
])
def test_a_stepwise_trajectory_counts_once_in_the_loss(mode, expected):
    sequences = sequences_from_trajectories([STEPWISE, KEPT], [1.0, 1.0])
    batch = collate(sequences, pad_id=0)
    per_token = torch.zeros_like(batch["loss_mask"])
    values = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    for row, mask in enumerate(batch["loss_mask"]):
        for col in torch.nonzero(mask)[:, 0]:
            per_token[row, col] = next(values)
    den = step_denominators_of(sequences)
    assert (den.tokens, den.seqs) == (6, 2)  # three rows, two trajectories
    loss = aggregate_loss(per_token, batch["loss_mask"], mode, global_tokens=den.tokens, global_seqs=den.seqs,
                          row_tokens=batch["row_tokens"])
    assert loss.item() == pytest.approx(expected)


def test_the_extra_tokens_are_the_prefixes_fed_again():
    assert stepwise_extra_tokens([STEPWISE, KEPT]) == 4  # 4 + 8 step tokens, minus the last step's 8


def test_format_error_steps_can_be_left_out():
    faulty = STEPWISE.model_copy(update={"turns": [turn([1], [5], format_error=True), *STEPWISE.turns]})
    rows = sequences_from_trajectories([faulty], [1.0], mask_format_errors=True)
    assert len(rows) == 2 and all(r.weight == 0.5 and r.trajectory_tokens == 5 for r in rows)
