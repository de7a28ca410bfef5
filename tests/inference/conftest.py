"""Fixtures for the inference stage: the tiny random model on SmolLM2's real tokenizer, and an engine over it."""

import pytest
import torch

from patchgym.inference.hf import HFEngine

torch.set_num_threads(1)  # two cores, shared with other jobs


@pytest.fixture
def engine(tiny):
    model, tokenizer = tiny
    with HFEngine(model, tokenizer, max_batch=8) as eng:
        yield eng


@pytest.fixture
def prompts(tiny):
    """Chat-template prompts of different lengths, so batches need real left padding."""
    _, tokenizer = tiny
    questions = ["Hi", "What is 2 + 2?", "Write a haiku about patches and tests, please.", "Fix the bug in foo.py"]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False)
        for q in questions
    ]


@pytest.fixture
def reference_logprobs():
    return forward_logprobs


def forward_logprobs(model, prompt_ids: list[int], token_ids: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) of each sampled token from one plain forward pass over prompt + completion."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits / scale, dim=-1)
    return logprobs.gather(1, torch.tensor(token_ids)[:, None])[:, 0].tolist()
