"""One forward for a state's prompt and all G of its sampled actions: the prompt once, each action after it attending
to the prompt and to itself only (a block mask, position ids starting again where the prompt ends), so that each
action's logprobs are those of `prompt + action` run alone, at about the cost of the prompt once instead of G times.

    row:       [ prompt (P tokens) | action 1 | action 2 | ... | action G ]
    positions:   0 .. P-1            P ..       P ..             P ..
    action k's token t attends to the whole prompt and to action k's tokens 0..t

The pivot stage's prompts are the agent's whole history (about 1,000 tokens) and its actions short (about 100), so
with G = 8 this is about 5x less work than the sequences one by one. The mask is a 4D additive mask, which the
transformers models take with their sdpa and eager attention.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class SharedRow:
    """The packed row of one state's prompt and its actions, and where each action's tokens are predicted from."""

    input_ids: Tensor  # [1, L]
    position_ids: Tensor  # [1, L]
    allowed: Tensor  # [L, L] bool: row i may attend to column j
    predicted_from: list[Tensor]  # per action: the row index whose logits predict each of its tokens
    targets: list[Tensor]  # per action: its token ids


def shared_row(prompt: list[int], actions: list[list[int]]) -> SharedRow:
    """Lay out `prompt` and `actions` (each non-empty) as one row (see the module's docstring)."""
    if not prompt or not actions or not all(actions):
        raise ValueError("a shared row needs a prompt and at least one action, none of them empty")
    size = len(prompt) + sum(len(a) for a in actions)
    allowed = torch.zeros(size, size, dtype=torch.bool)
    allowed[:len(prompt), :len(prompt)] = torch.ones(len(prompt), len(prompt), dtype=torch.bool).tril()
    ids, positions, predicted_from, targets = list(prompt), list(range(len(prompt))), [], []
    start = len(prompt)
    for action in actions:
        n = len(action)
        allowed[start:start + n, :len(prompt)] = True
        allowed[start:start + n, start:start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        ids += action
        positions += range(len(prompt), len(prompt) + n)
        predicted_from.append(torch.tensor([len(prompt) - 1, *range(start, start + n - 1)]))
        targets.append(torch.tensor(action))
        start += n
    return SharedRow(torch.tensor([ids]), torch.tensor([positions]), allowed, predicted_from, targets)


def shared_prompt_logprobs(model: nn.Module, prompt: list[int], actions: list[list[int]]) -> list[Tensor]:
    """Each action's per-token logprobs (fp32, differentiable) given the prompt, from one forward of the shared row."""
    row = shared_row(prompt, actions)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(row.allowed.shape, dtype=dtype).masked_fill(~row.allowed, torch.finfo(dtype).min)
    logits = model(input_ids=row.input_ids.to(device), position_ids=row.position_ids.to(device),
                   attention_mask=mask[None, None].to(device)).logits[0]
    found = []
    for index, target in zip(row.predicted_from, row.targets):
        picked = logits[index.to(device)].float()
        found.append(torch.log_softmax(picked, dim=-1).gather(1, target.to(device)[:, None])[:, 0])
    return found
