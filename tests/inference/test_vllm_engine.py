"""VLLMEngine on SmolLM2 in fp32 against an HF forward pass of the same weights: exact ids and logprobs, seeded
sampling, the requested sampling (and only it) reaching the server, and live weight pushes that change what the
running server computes and restore it exactly."""

import glob
import importlib.util
import json
import urllib.request

import pytest
import torch

from patchgym.inference.base import SamplingParams
from patchgym.inference.models import load_model
from patchgym.train.prepare import gathered_weights

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install '.[vllm]')")

# Over two of vLLM's 128-token CPU KV blocks, so the prefix cache holds the prompt's KV after one request: a push
# that did not empty the cache would have the next request reuse KV computed with the old weights.
SYSTEM = " ".join([
    "You are a careful assistant for a small software team.",
    "Answer every question in one or two short sentences, in plain English, without lists, code blocks or quotes.",
    "Never repeat the question back to the user before answering it, and never apologise for anything.",
    "If a question is about programming, prefer Python examples and mention the standard library first.",
    "If a question is about history, give the year and the place, and say nothing about what happened later.",
    "If a question is about science, give the simplest true explanation that a curious child could follow.",
    "If a question is about food, name one dish and one ingredient that makes it special, and stop there.",
    "If a question is about animals, say where they live and what they eat, and never invent a fact.",
    "If you do not know the answer, say so in five words or fewer, and do not guess or make anything up.",
    "Keep a friendly tone, avoid jargon, do not use emoji, and end every answer with a full stop.",
    "These rules hold for the whole conversation, whatever the user asks later and however they ask it.",
])


@pytest.fixture(scope="module")
def hf():
    return load_model("smollm2")


@pytest.fixture(scope="module")
def engine():
    from patchgym.inference.vllm_engine import VLLMEngine

    # 8 MB buckets split SmolLM2's fp32 layers (its MLP matrices are 3.5 MB each): fused groups span buckets.
    with VLLMEngine("smollm2", kv_cache_gb=1.0, sync_bucket_mb=8) as eng:
        yield eng


def chat(tokenizer, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def forward_logits(model, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] fp32 logits that predicted each completion token, from one teacher-forced pass."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1: -1].float()


def picked(logprobs: torch.Tensor, token_ids: list[int]) -> list[float]:
    return logprobs.gather(1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


def score(engine, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The server's teacher-forced logprobs of a fixed completion (prompt_logprobs), one request, nothing sampled."""
    body = {"model": engine.model, "prompt": prompt_ids + token_ids, "max_tokens": 1, "prompt_logprobs": 0}
    request = urllib.request.Request(f"{engine.url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        entries = json.loads(response.read())["choices"][0]["prompt_logprobs"][len(prompt_ids):]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, token_ids)]


def test_generation_gives_exact_ids_and_the_models_logprobs(engine, hf):
    model, tokenizer = hf
    prompt = chat(tokenizer, "What is the capital of France?")
    gen = engine.generate(prompt, SamplingParams(max_new_tokens=32, seed=3))
    assert gen.exact and 0 < len(gen.token_ids) == len(gen.logprobs) <= 32
    if gen.finish_reason == "stop":
        assert gen.token_ids[-1] == tokenizer.eos_token_id
    else:
        assert gen.finish_reason == "length" and len(gen.token_ids) == 32
    expected = picked(torch.log_softmax(forward_logits(model, prompt, gen.token_ids), -1), gen.token_ids)
    assert gen.logprobs == pytest.approx(expected, abs=1e-4)


def test_seeded_sampling_is_reproducible(engine, hf):
    _, tokenizer = hf
    prompt = chat(tokenizer, "Write a very short poem about the sea.")
    a, b, c = (engine.generate(prompt, SamplingParams(max_new_tokens=16, seed=s)) for s in (5, 5, 6))
    assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    assert c.token_ids != a.token_ids


def test_seeded_requests_with_long_prompts_in_flight_together(engine):
    """Eight seeded requests of ~1K-token prompts at once: more prompt than one of vLLM's steps takes, so with chunked
    prefill some would sit in a partial prefill, where vLLM on CPU crashes rewinding a seeded CPU generator (the
    engine turns chunking off on CPU). Each comes back whole and the same seed gives the same ids again."""
    import asyncio
    import random

    rng = random.Random(0)  # prompts that share no prefix, so the prefix cache cannot shorten any prefill
    prompts = [[rng.randrange(100, 40000) for _ in range(1000)] for _ in range(8)]

    async def all_at_once():
        return await asyncio.gather(*(engine.agenerate(p, SamplingParams(max_new_tokens=8, seed=i))
                                      for i, p in enumerate(prompts)))

    first, again = asyncio.run(all_at_once()), asyncio.run(all_at_once())
    assert all(0 < len(g.token_ids) <= 8 for g in first)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]


@pytest.mark.parametrize("params, kind", [
    (SamplingParams(max_new_tokens=16, seed=1), "full"),  # the defaults: T = 1, nothing truncated
    (SamplingParams(max_new_tokens=16, seed=1, temperature=0.7), "T=0.7"),
    (SamplingParams(max_new_tokens=16, temperature=0), "greedy"),
    (SamplingParams(max_new_tokens=16, seed=1, top_k=5), "top-5"),  # shows that truncation would be seen
])
def test_the_requested_sampling_and_nothing_else_reaches_the_server(engine, hf, params, kind):
    """Reported logprobs are those of the distribution sampled from, so they reveal what the server applied: with the
    defaults they must be the full softmax, which any top-k, top-p, min-p or temperature the server added (say, from
    the model's generation_config) would change."""
    model, tokenizer = hf
    prompt = chat(tokenizer, "Name a fruit and say why you like it.")
    gen = engine.generate(prompt, params)
    logits = forward_logits(model, prompt, gen.token_ids)
    if kind == "T=0.7":
        logits = logits / 0.7
    if kind == "top-5":
        logits = logits.masked_fill(logits < logits.topk(5, dim=-1).values[:, -1:], float("-inf"))
    assert gen.logprobs == pytest.approx(picked(torch.log_softmax(logits, -1), gen.token_ids), abs=1e-4)
    if kind == "greedy":
        assert gen.token_ids == logits.argmax(-1).tolist()
    if kind == "top-5":
        full = picked(torch.log_softmax(forward_logits(model, prompt, gen.token_ids), -1), gen.token_ids)
        assert max(a - b for a, b in zip(gen.logprobs, full)) > 1e-3


def test_pushed_weights_are_served_at_once_and_the_originals_restore_it_exactly(engine, hf):
    model, tokenizer = hf
    prompt = chat(tokenizer, "Why do cats purr?")
    params = SamplingParams(max_new_tokens=24, seed=7)
    pid = engine.pid
    before = engine.generate(prompt, params)
    before_scores = score(engine, prompt, before.token_ids)

    original = {name: t.clone() for name, t in model.state_dict().items()}
    perturbed = dict(original)
    noise = torch.Generator().manual_seed(0)
    # Whole fused groups (q, k, v; gate, up), a plain layer, in different depths, and the embedding, which SmolLM2's
    # output head shares (the reload once left vLLM's head on the old, prepacked embedding).
    for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                 "model.layers.7.mlp.gate_proj.weight",
                 "model.layers.7.mlp.up_proj.weight", "model.layers.20.mlp.down_proj.weight"]:
        perturbed[name] = original[name] + 0.05 * torch.randn(original[name].shape, generator=noise)
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]  # still tied, as a trained model is
    try:
        engine.load_weights(perturbed)
        assert engine.last_push.transport == "shm" and engine.last_push.buckets > 10
        assert engine.last_push.largest_bucket <= 8 * 2**20 or engine.last_push.largest_bucket == 49152 * 576 * 4
        assert not glob.glob("/dev/shm/patchgym-push-*")  # the segment is unlinked after the push
        pushed_scores = score(engine, prompt, before.token_ids)
        pushed = engine.generate(prompt, params)  # the prompt's KV blocks are in the prefix cache from `before`
        model.load_state_dict(perturbed)
        expected_scores = picked(torch.log_softmax(forward_logits(model, prompt, before.token_ids), -1),
                                 before.token_ids)
        expected_pushed = picked(torch.log_softmax(forward_logits(model, prompt, pushed.token_ids), -1),
                                 pushed.token_ids)
    finally:
        model.load_state_dict(original)
    assert max(abs(a - b) for a, b in zip(pushed_scores, before_scores)) > 0.05
    assert pushed_scores == pytest.approx(expected_scores, abs=1e-4)
    assert pushed.logprobs == pytest.approx(expected_pushed, abs=1e-4)

    engine.load_weights(gathered_weights(model))  # the trainer's path: a generator, one tensor at a time
    assert engine.last_push.tensors == len(original) - 1  # the tied lm_head is the embedding, sent once
    after = engine.generate(prompt, params)
    # The same tokens, and logprobs within float32 rounding: on some CPUs vLLM's reloaded weights take another
    # kernel layout than the first load did (measured: up to 2.3e-5 apart here, and only after the module's
    # earlier tests), while a push that did not restore them is off by more than 0.05 (asserted above).
    assert after.token_ids == before.token_ids
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-4)
    assert score(engine, prompt, before.token_ids) == pytest.approx(before_scores, abs=1e-4)
    assert engine.pid == pid and engine.process.poll() is None  # the same server, never restarted


def test_a_server_that_cannot_start_says_why(tmp_path):
    import shutil

    from patchgym.inference.models import smollm2_dir
    from patchgym.inference.vllm_engine import VLLMEngine, VLLMServerError

    # A model directory with a tokenizer (the engine loads it first) but without a model.
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_dir() / name, tmp_path / name)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VLLMServerError, match="its log ends"):
        VLLMEngine(str(tmp_path), start_timeout_s=120)


def test_a_model_directory_without_a_tokenizer_is_named(tmp_path):
    from patchgym.inference.vllm_engine import VLLMEngine, VLLMServerError

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VLLMServerError, match=f"cannot load the tokenizer of {tmp_path}"):
        VLLMEngine(str(tmp_path), start_timeout_s=120)
