"""The OpenAI-compatible server over HFEngine on the tiny model, driven by the official openai client and by
OpenAIEngine: exact ids and logprobs, batching of concurrent clients, 400s that name the field, and the CLI."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import openai
import pytest
import torch

from patchgym.inference.base import SamplingParams
from patchgym.inference.hf import HFEngine
from patchgym.inference.models import tiny_model
from patchgym.inference.openai_engine import OpenAIEngine, OpenAIEngineError
from patchgym.inference.server import serve, token_bytes

torch.set_num_threads(1)

MODEL = "tiny"
EXACT = {"return_token_ids": True, "skip_special_tokens": False}
HI = [{"role": "user", "content": "Fix the bug in foo.py"}]


@pytest.fixture(scope="module")
def hf(tiny):
    model, tokenizer = tiny
    with HFEngine(model, tokenizer, max_batch=8) as engine:
        yield engine


@pytest.fixture(scope="module")
def server(hf):
    with serve(hf, port=0, model_name=MODEL) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0) as c:
        yield c


def chat_ids(tokenizer, messages=HI) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
        assert response.status == 200


def test_chat_equals_the_engine_and_a_forward_pass(client, hf, tiny, reference_logprobs):
    model, tokenizer = tiny
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=16, temperature=0.7, seed=5,
                                       logprobs=True, top_logprobs=0, extra_body={**EXACT, "top_k": 50})
    choice = r.choices[0]
    prompt_ids = chat_ids(tokenizer)
    direct = hf.generate(prompt_ids, SamplingParams(temperature=0.7, top_k=50, max_new_tokens=16, seed=5))
    logprobs = [c.logprob for c in choice.logprobs.content]
    assert r.prompt_token_ids == prompt_ids
    assert choice.token_ids == direct.token_ids and choice.finish_reason == direct.finish_reason == "length"
    assert logprobs == pytest.approx(direct.logprobs, abs=1e-5)
    assert logprobs == pytest.approx(reference_logprobs(model, prompt_ids, direct.token_ids, 0.7), abs=1e-4)
    assert choice.message.content == tokenizer.decode(choice.token_ids)
    assert [c.token for c in choice.logprobs.content] == [tokenizer.decode([t]) for t in choice.token_ids]
    assert (r.object, choice.message.role, r.model) == ("chat.completion", "assistant", MODEL)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt_ids), 16)


def test_completions_on_token_ids_use_unbiased_defaults(client, hf, tiny, reference_logprobs):
    model, tokenizer = tiny
    prompt_ids = chat_ids(tokenizer)
    r = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=12, logprobs=1, seed=9, extra_body=EXACT)
    choice = r.choices[0]
    direct = hf.generate(prompt_ids, SamplingParams(max_new_tokens=12, seed=9))  # T = 1, no truncation
    assert r.prompt_token_ids == prompt_ids and choice.token_ids == direct.token_ids
    assert choice.logprobs.token_logprobs == pytest.approx(direct.logprobs, abs=1e-5)
    assert choice.logprobs.token_logprobs == pytest.approx(
        reference_logprobs(model, prompt_ids, direct.token_ids, 1.0), abs=1e-4)
    assert choice.text == tokenizer.decode(direct.token_ids) == "".join(choice.logprobs.tokens)
    assert choice.logprobs.text_offset == [len("".join(choice.logprobs.tokens[:i])) for i in range(12)]


def test_token_bytes_are_exact_even_for_half_characters(tiny):
    _, tokenizer = tiny
    text = "naïve 日本語 — ✓"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [token_bytes(tokenizer, i) for i in ids]
    assert any(bytes(p).decode(errors="replace") != bytes(p).decode(errors="ignore") for p in pieces)  # a split char
    assert b"".join(bytes(p) for p in pieces) == text.encode()
    assert token_bytes(tokenizer, tokenizer.eos_token_id) == list(b"<|im_end|>")


def test_a_stop_token_is_in_token_ids_and_logprobs_but_not_in_the_text(client, hf, tiny):
    _, tokenizer = tiny
    prompt_ids = chat_ids(tokenizer)
    greedy = hf.generate(prompt_ids, SamplingParams(temperature=0, max_new_tokens=12)).token_ids
    stop = greedy[4]
    r = client.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=12, temperature=0,
                                       logprobs=True, extra_body={**EXACT, "stop_token_ids": [stop]})
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.token_ids == greedy[: greedy.index(stop) + 1]
    assert len(choice.logprobs.content) == len(choice.token_ids)
    assert choice.message.content == tokenizer.decode(choice.token_ids[:-1])


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_engine_gives_the_engines_exact_ids(server, hf, tiny, api):
    _, tokenizer = tiny
    params = SamplingParams(temperature=0.9, top_p=0.95, min_p=0.01, max_new_tokens=16, seed=11)
    direct = hf.generate(chat_ids(tokenizer), params)
    with OpenAIEngine(server.base_url, MODEL, tokenizer, api=api) as remote:
        assert remote.needs_messages == (api == "chat")
        gen = remote.generate(chat_ids(tokenizer), params) if api == "completions" else remote.generate_chat(HI, params)
    assert gen.exact and gen.token_ids == direct.token_ids and gen.finish_reason == direct.finish_reason
    assert gen.logprobs == pytest.approx(direct.logprobs, abs=1e-5)


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999}])
def test_each_truncation_reaches_the_engine(server, hf, tiny, truncation):
    """Each of these leaves only the argmax, so T = 1 sampling must give the greedy ids: a dropped field would not."""
    _, tokenizer = tiny
    greedy = hf.generate(chat_ids(tokenizer), SamplingParams(temperature=0, max_new_tokens=12)).token_ids
    with OpenAIEngine(server.base_url, MODEL, tokenizer) as remote:
        gen = remote.generate(chat_ids(tokenizer), SamplingParams(max_new_tokens=12, seed=0, **truncation))
    assert gen.token_ids == greedy


def test_eight_concurrent_agenerate_calls_are_batched(server, hf, tiny, prompts, monkeypatch):
    _, tokenizer = tiny
    jobs = [(prompts[i % len(prompts)], SamplingParams(temperature=0.8, max_new_tokens=16, seed=i)) for i in range(8)]
    alone = [hf.generate(p, params) for p, params in jobs]
    sizes = []
    decode = hf._decode
    monkeypatch.setattr(hf, "_decode", lambda rows: (sizes.append(len(rows)), decode(rows))[1])

    async def main():
        return await asyncio.gather(*(remote.agenerate(p, params) for p, params in jobs))

    with OpenAIEngine(server.base_url, MODEL, tokenizer) as remote:
        together = asyncio.run(main())
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert sum(sizes) == 8 and max(sizes) > 1


def test_without_token_ids_the_text_is_retokenised_and_marked_inexact(server, hf, tiny):
    _, tokenizer = tiny
    params = SamplingParams(max_new_tokens=10, seed=2)
    direct = hf.generate(chat_ids(tokenizer), params)
    with OpenAIEngine(server.base_url, MODEL, tokenizer, vllm_extras=False) as remote:
        gen = remote.generate(chat_ids(tokenizer), params)
        with pytest.raises(ValueError, match="top_k"):
            remote.generate(chat_ids(tokenizer), SamplingParams(top_k=5))
    assert not gen.exact and gen.finish_reason == "length" and len(gen.logprobs) == len(gen.token_ids)
    assert tokenizer.decode(gen.token_ids) == tokenizer.decode(direct.token_ids, skip_special_tokens=True)


def test_a_stop_without_its_token_gets_the_eos_appended(hf, tiny):
    """The model's generation_config makes a common token a stop; a server that returns only text drops it, so the
    client must close the turn with the eos itself, its logprob unknown."""
    _, tokenizer = tiny
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    expected = hf.generate(chat_ids(tokenizer), greedy).token_ids
    model, _ = tiny_model()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, expected[3]]
    with HFEngine(model, tokenizer) as engine, serve(engine, port=0, model_name=MODEL) as handle, \
            OpenAIEngine(handle.base_url, MODEL, tokenizer, vllm_extras=False) as remote:
        gen = remote.generate(chat_ids(tokenizer), greedy)
    cut = expected[: expected.index(expected[3])]
    assert gen.finish_reason == "stop" and not gen.exact
    assert gen.token_ids == tokenizer.encode(tokenizer.decode(cut), add_special_tokens=False) + [tokenizer.eos_token_id]
    assert len(gen.logprobs) == len(gen.token_ids) and gen.logprobs[-1] != gen.logprobs[-1]  # NaN: never reported


@pytest.mark.parametrize("change, param", [
    ({"n": 2}, "n"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"messages": None}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0].role"),
    ({"stop": ["\n"]}, "stop"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"seed": 1.5}, "seed"),
])
def test_bad_chat_fields_get_a_400_naming_them(server, change, param):
    body = {"model": MODEL, "messages": HI, "max_tokens": 4, **change}
    status, payload = post(f"{server.base_url}/chat/completions", {k: v for k, v in body.items() if v is not None})
    assert status == 400, payload
    assert payload["error"]["param"] == param and payload["error"]["type"] == "invalid_request_error"
    assert param.split("[")[0] in payload["error"]["message"]


def test_other_bad_requests(server):
    status, payload = post(f"{server.base_url}/chat/completions", b"{not json")
    assert status == 400 and "JSON" in payload["error"]["message"]
    status, payload = post(f"{server.base_url}/completions", {"model": MODEL, "prompt": [[1, 2]], "max_tokens": 2})
    assert status == 400 and payload["error"]["param"] == "prompt"
    status, payload = post(f"{server.base_url}/completions", {"model": MODEL, "prompt": [1], "logprobs": 3})
    assert status == 400 and payload["error"]["param"] == "logprobs"
    status, payload = post(f"{server.base_url}/chat/completions", {"model": MODEL, "messages": HI, "top_logprobs": 1})
    assert status == 400 and "top_logprobs is not supported by this engine" in payload["error"]["message"]
    status, payload = post(f"{server.base_url}/chat/completions", {"model": "gpt-9", "messages": HI})
    assert status == 404 and payload["error"]["param"] == "model"
    assert post(f"{server.base_url}/nowhere", {})[0] == 404


def test_openai_engine_errors_name_the_url(server, tiny):
    _, tokenizer = tiny
    with OpenAIEngine(server.base_url, "gpt-9", tokenizer, max_retries=0) as remote:
        with pytest.raises(OpenAIEngineError, match=re.escape(server.base_url) + ".*404"):
            remote.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        with pytest.raises(NotImplementedError, match="weights"):
            remote.load_weights({})
    with OpenAIEngine("http://127.0.0.1:9/v1", MODEL, tokenizer, max_retries=0) as remote:
        with pytest.raises(OpenAIEngineError, match="could not reach http://127.0.0.1:9/v1"):
            remote.generate([1, 2, 3], SamplingParams(max_new_tokens=2))


@pytest.mark.timeout(90)
def test_cli_serve_answers_then_stops_on_sigterm(tiny):
    command = [sys.executable, "-c", "from patchgym.cli import app; app()", "serve", "--model", "tiny", "--port", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://\S+/v1", line)
        assert match, (line, proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
        with urllib.request.urlopen(f"{match.group(0)}/models", timeout=10) as response:
            assert json.loads(response.read())["data"][0]["id"] == "tiny"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
