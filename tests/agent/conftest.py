"""Fixtures for the agent loop: SmolLM2's real tokenizer (through the tiny model) and a scripted fake engine."""

import pytest
import torch

from patchgym.inference import Generation, SamplingParams

torch.set_num_threads(1)  # two cores, shared with the sandboxes


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


class ScriptedEngine:
    """A fake engine: answers turn i with the i-th scripted text, tokenised canonically, plus the end-of-turn token.

    It honours max_new_tokens (cutting the ids, finish_reason "length") and keeps every prompt it was given.
    """

    needs_messages = False

    def __init__(self, tokenizer, actions: list[str]):
        self.tokenizer = tokenizer
        self.actions = list(actions)
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.prompts.append(list(prompt_ids))
        action = self.actions[min(len(self.prompts), len(self.actions)) - 1]  # the last action repeats
        ids = self.tokenizer.encode(action, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        reason = "stop" if len(ids) <= params.max_new_tokens else "length"
        ids = ids[: params.max_new_tokens]
        return Generation(ids, [-0.5] * len(ids), reason)

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return self.generate(prompt_ids, params)

    def load_weights(self, state_dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.fixture
def scripted(tokenizer):
    """scripted(actions) on SmolLM2's tokenizer, or scripted(actions, another_tokenizer)."""
    return lambda actions, other=None: ScriptedEngine(other or tokenizer, actions)
