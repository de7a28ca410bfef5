"""Which engine a config gets (inference.engine auto) and how many tokens a turn may sample when nobody says
(agent.sampling.max_new_tokens null): fast, no engine started."""

import importlib.util

import pytest

from patchgym.config import Config, load_config
from patchgym.inference.config import InferenceConfig, resolved_engine


@pytest.fixture
def vllm_installed(monkeypatch):
    """Whether `vllm` is importable, as resolved_engine asks it (find_spec, which imports nothing)."""
    real = importlib.util.find_spec

    def set_installed(installed: bool):
        def find_spec(name, *a):
            if name == "vllm":
                return real("json") if installed else None  # any spec says "installed"
            return real(name, *a)
        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return set_installed


def test_auto_is_vllm_for_a_pretrained_model_where_it_is_installed_else_hf(vllm_installed):
    vllm_installed(True)
    assert resolved_engine(InferenceConfig()) == "vllm"  # smollm2, the default model
    assert resolved_engine(InferenceConfig(model="/models/qwen3-8b")) == "vllm"
    for tiny in ("tiny", "tiny-qwen3", "tiny-qwen2.5"):  # random test models are built in this process
        assert resolved_engine(InferenceConfig(model=tiny)) == "hf"
    assert resolved_engine(InferenceConfig(), next_token_logprobs=True) == "hf"  # the verifier's scoring
    assert resolved_engine(InferenceConfig(base_url="http://127.0.0.1:8000/v1")) == "openai"
    vllm_installed(False)
    assert resolved_engine(InferenceConfig()) == "hf"


def test_a_named_engine_is_kept(vllm_installed):
    vllm_installed(True)
    for name in ("hf", "openai", "vllm"):
        assert resolved_engine(InferenceConfig(engine=name, model="tiny")) == name
    with pytest.raises(ValueError):
        InferenceConfig(engine="llamacpp")


def test_a_turns_budget_is_the_models_unless_set():
    assert Config().agent.sampling.max_new_tokens == 320  # smollm2's
    assert Config(inference={"model": "tiny-qwen3"}).agent.sampling.max_new_tokens == 1024
    assert Config().agent.sampling.max_new_tokens == 320  # the shared default object was not changed
    given = load_config([], ["inference.model=smollm2", "agent.sampling.max_new_tokens=700"])
    assert given.agent.sampling.max_new_tokens == 700
    assert load_config([], ["inference.model=/models/qwen3-8b"]).agent.sampling.max_new_tokens == 1024
