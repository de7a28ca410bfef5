"""One forward of a prompt and its G actions gives each action the logprobs (and gradients) of `prompt + action`
run alone through the trainer's own sequence_logprobs."""

import pytest
import torch

from patchgym.pivot.shared_prompt import shared_prompt_logprobs, shared_row
from patchgym.train.logprobs import sequence_logprobs


def alone(model, prompt, action):
    ids = torch.tensor([prompt + action])
    positions = torch.zeros_like(ids)
    positions[0, len(prompt):] = 1
    return sequence_logprobs(model, ids, torch.ones_like(ids), positions=positions)[0, len(prompt):]


def test_each_action_gets_the_logprobs_and_gradients_it_gets_alone(tiny):
    torch.set_num_threads(1)
    model, _ = tiny
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 1000, (40,), generator=g).tolist()
    actions = [torch.randint(5, 1000, (n,), generator=g).tolist() for n in (1, 6, 3, 9)]
    shared = shared_prompt_logprobs(model, prompt, actions)
    separate = [alone(model, prompt, a) for a in actions]
    for mine, reference in zip(shared, separate):
        assert mine.shape == reference.shape and torch.allclose(mine, reference, atol=1e-5), (mine, reference)
    weights = [0.5, -1.0, 2.0, 0.25]  # an advantage per action, as a policy-gradient loss weighs them
    grads = []
    for logprobs in (shared, separate):
        model.zero_grad()
        sum(w * lp.sum() for w, lp in zip(weights, logprobs)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    model.zero_grad()
    assert grads[0].abs().sum() > 0
    # fp32 sums taken in another order: equal to a relative 1e-4 of the gradient's norm (measured: 1e-5)
    assert (grads[0] - grads[1]).norm() / grads[1].norm() < 1e-4, (grads[0] - grads[1]).abs().max()


def test_the_row_lets_an_action_see_the_prompt_and_itself_only():
    row = shared_row([1, 2, 3], [[4, 5], [6]])
    assert row.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]] and row.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    assert row.allowed[5].tolist() == [True, True, True, False, False, True]  # the second action: not the first
    assert row.allowed[4].tolist() == [True, True, True, True, True, False]
    assert row.allowed[1].tolist() == [True, True, False, False, False, False]  # the prompt stays causal
    assert [p.tolist() for p in row.predicted_from] == [[2, 3], [2]]
    with pytest.raises(ValueError, match="none of them empty"):
        shared_row([1], [[2], []])
