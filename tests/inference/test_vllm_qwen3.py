"""vLLM serves a (random, small) Qwen3ForCausalLM with the configured chat template: the server renders a chat to
exactly the ids the token builder gives the hf engine, kwargs included, and plays multi-turn episodes in both
history modes with exact tokens."""

import importlib.util
import json
import urllib.request

import pytest
import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from memory_env import MemoryEnv, memory_task
from patchgym.agent import tokens
from patchgym.agent.check_tokens import check_trajectory
from patchgym.agent.config import AgentConfig, SamplingConfig
from patchgym.agent.loop import run_agent
from patchgym.inference.base import SamplingParams
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.models import qwen3_tokenizer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install '.[vllm]')")

CHAT = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "calc.add subtracts."}]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tiny):
    """A saved random Qwen3 whose 32-wide heads vLLM's CPU attention takes, with Qwen3's tokenizer stand-in."""
    directory = tmp_path_factory.mktemp("qwen3-model")
    tokenizer = qwen3_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_the_vllm_server_renders_the_chat_as_the_token_builder_does(qwen3_dir):
    from patchgym.inference.vllm_engine import VLLMEngine

    kwargs = {"enable_thinking": False}
    ours = configure_tokenizer(qwen3_tokenizer(), "qwen3", kwargs)
    expected = tokens.prompt_ids(ours, CHAT)
    assert ours.decode(expected).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with VLLMEngine(str(qwen3_dir), kv_cache_gb=0.25, chat_template="qwen3", chat_template_kwargs=kwargs,
                    extra_args=["--max-model-len", "2048"]) as engine:
        assert tokens.prompt_ids(engine.tokenizer, CHAT) == expected
        body = {"model": str(qwen3_dir), "messages": CHAT, "add_generation_prompt": True}
        request = urllib.request.Request(f"{engine.url}/tokenize", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert json.loads(response.read())["tokens"] == expected  # the server's own chat rendering
        generation = engine.generate(expected, SamplingParams(max_new_tokens=5, seed=1))
        assert len(generation.token_ids) == len(generation.logprobs) >= 1
        # A multi-turn episode through the vLLM engine: its first prompt is the hf engine's, every token exact.
        for history in ("keep", "template"):
            config = AgentConfig(history=history, max_steps=3, max_format_errors=10,
                                 sampling=SamplingConfig(max_new_tokens=8, seed=2))
            trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
            assert trajectory.steps == 3 and trajectory.turns[0].prompt_ids == tokens.prompt_ids(
                ours, trajectory.messages[:2])
            check = check_trajectory(trajectory, ours)
            assert check.ok, check.errors
