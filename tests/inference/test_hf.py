"""HFEngine on the tiny model: batching (and joining a running batch) does not change results, stops and lengths,
exact logprobs, threads."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import GenerationConfig

from patchgym.inference.base import SamplingParams
from patchgym.inference.hf import HFEngine

GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=24)


def seeded(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "seed": seed})


def run_alone(engine, prompts, params_list):
    return [engine.generate(p, params) for p, params in zip(prompts, params_list)]


def run_together(engine, prompts, params_list):
    futures = [engine.submit(p, params) for p, params in zip(prompts, params_list)]
    return [f.result() for f in futures]


def count_batches(engine, monkeypatch) -> list[int]:
    """The sizes of the groups of requests that were prefilled together."""
    sizes = []
    decode = engine._decode
    monkeypatch.setattr(engine, "_decode", lambda rows: (sizes.append(len(rows)), decode(rows))[1])
    return sizes


def count_rows(engine, monkeypatch, pause_after: int = 0) -> tuple[list[int], threading.Event, threading.Event]:
    """The rows of every forward pass (prefills and decode steps). With pause_after, the worker stops after that many
    passes: it sets `paused`, then waits for the test to set `resume`."""
    rows, paused, resume = [], threading.Event(), threading.Event()
    forward = engine._forward

    def watched(input_ids, *args):
        rows.append(input_ids.shape[0])
        if len(rows) == pause_after:
            paused.set()
            resume.wait(30)
        return forward(input_ids, *args)

    monkeypatch.setattr(engine, "_forward", watched)
    return rows, paused, resume


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_equals_alone(engine, prompts, params, monkeypatch):
    """Same ids whether a request runs alone or in a padded batch. Logprobs agree to float noise only: a batch
    runs other matmul shapes (and padding) than a single row, so the sums are not bit-identical."""
    params_list = [seeded(params, seed) for seed in range(len(prompts))]
    alone = run_alone(engine, prompts, params_list)
    sizes = count_batches(engine, monkeypatch)
    together = run_together(engine, prompts, params_list)
    assert max(sizes) > 1
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("newcomer_wider", [True, False], ids=["newcomer-wider", "running-wider"])
def test_a_request_joins_a_running_batch(engine, tiny, prompts, newcomer_wider, monkeypatch, reference_logprobs):
    """A request that arrives while another decodes joins it at the next step rather than waiting for it to end: it
    finishes first, and both give what they give alone. Joining early pads the running row's cache on the left,
    joining late pads the newcomer's."""
    model, _ = tiny
    first_prompt, second_prompt = prompts[0], prompts[2]
    join_after = 2 if newcomer_wider else 20  # forward passes of the first request before the second arrives
    running_width = len(first_prompt) + join_after - 1  # its prompt and the tokens fed back by then
    assert (running_width < len(second_prompt)) == newcomer_wider
    long = SamplingParams(temperature=0.8, max_new_tokens=80, seed=3)
    short = SamplingParams(temperature=0.8, max_new_tokens=10, seed=4)
    long_alone, short_alone = engine.generate(first_prompt, long), engine.generate(second_prompt, short)
    assert len(long_alone.token_ids) > join_after + len(short_alone.token_ids)  # so the first is still running

    rows, paused, resume = count_rows(engine, monkeypatch, pause_after=join_after)
    finished = []
    first = engine.submit(first_prompt, long)
    first.add_done_callback(lambda _: finished.append("first"))
    assert paused.wait(30)
    second = engine.submit(second_prompt, short)
    second.add_done_callback(lambda _: finished.append("second"))
    resume.set()
    results = first.result(timeout=60), second.result(timeout=60)

    assert finished == ["second", "first"]
    assert rows[: join_after + 2] == [1] * (join_after + 1) + [2] and max(rows) == 2  # its prefill, then together
    for gen, alone, prompt in zip(results, (long_alone, short_alone), (first_prompt, second_prompt)):
        assert gen.token_ids == alone.token_ids and gen.finish_reason == alone.finish_reason
        assert gen.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert gen.logprobs == pytest.approx(reference_logprobs(model, prompt, gen.token_ids, 0.8), abs=1e-4)


def test_a_full_batch_makes_newcomers_wait(tiny, prompts, monkeypatch):
    model, tokenizer = tiny
    params_list = [seeded(SAMPLED, seed) for seed in range(len(prompts))]
    with HFEngine(model, tokenizer, max_batch=2) as eng:
        alone = run_alone(eng, prompts, params_list)
        rows, _, _ = count_rows(eng, monkeypatch)
        together = run_together(eng, prompts, params_list)
    assert max(rows) == 2
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


def test_greedy_matches_model_generate(engine, tiny, prompts):
    model, tokenizer = tiny
    together = run_together(engine, prompts, [GREEDY] * len(prompts))
    for prompt, gen in zip(prompts, together):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=GREEDY.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
        assert gen.token_ids == out[0, len(prompt) :].tolist()


def test_same_seed_same_sample_other_seed_differs(engine, prompts):
    a, b, c = (engine.generate(prompts[1], seeded(SAMPLED, s)) for s in (7, 7, 8))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_match_a_separate_forward_pass(engine, tiny, prompts, temperature, reference_logprobs):
    model, _ = tiny
    params = SamplingParams(temperature=temperature, top_k=50, max_new_tokens=20, seed=3)
    futures = [engine.submit(p, params) for p in prompts]
    for prompt, future in zip(prompts, futures):
        gen = future.result()
        expected = reference_logprobs(model, prompt, gen.token_ids, temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)


def test_stop_tokens_and_max_new_tokens(engine, prompts):
    full = engine.generate(prompts[0], GREEDY)
    assert full.finish_reason == "length" and len(full.token_ids) == GREEDY.max_new_tokens
    stop = full.token_ids[5]
    first = full.token_ids.index(stop)
    cut = engine.generate(prompts[0], SamplingParams(temperature=0, max_new_tokens=24, stop_token_ids=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[: first + 1]  # the stop token is kept
    short = engine.generate(prompts[0], SamplingParams(temperature=0, max_new_tokens=3))
    assert short.token_ids == full.token_ids[:3] and short.finish_reason == "length"


def test_the_context_ends_a_request_and_its_batch_mate_goes_on(engine, prompts):
    """A prompt 3 tokens short of the context gets 3 tokens; the short row that shared its batch then decodes on a
    cache cut down to its own width, and still matches its solo run."""
    long_prompt = (prompts[1] * 100)[: engine.max_len - 3]
    params = seeded(SAMPLED, 5)
    alone = run_alone(engine, [long_prompt, prompts[0]], [params, params])
    together = run_together(engine, [long_prompt, prompts[0]], [params, params])
    assert alone[0].finish_reason == "length" and len(alone[0].token_ids) == 3
    assert len(alone[1].token_ids) > 3
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_eos_stops_without_being_asked(tiny, prompts):
    """The end-of-turn token always stops a request: force it by making <|im_end|> the model's argmax."""
    model, tokenizer = tiny
    eos = tokenizer.eos_token_id
    original = model.lm_head.weight.detach().clone()  # tied to the embeddings: restore it from a copy
    bias = original.clone()
    bias[eos] = model.model.norm.weight.detach().sign() * 50  # huge logit for eos from any hidden state
    try:
        with HFEngine(model, tokenizer) as eng:
            eng.load_weights({"lm_head.weight": bias})
            gen = eng.generate(prompts[0], GREEDY)
    finally:
        model.lm_head.weight.data.copy_(original)
    assert gen.token_ids[-1] == eos and gen.finish_reason == "stop"


def test_sampled_ids_decode_to_the_text(engine, tiny, prompts):
    _, tokenizer = tiny
    gen = engine.generate(prompts[2], seeded(SAMPLED, 1))
    text = tokenizer.decode(gen.token_ids)
    pieces = tokenizer.convert_ids_to_tokens(gen.token_ids)
    assert text == tokenizer.convert_tokens_to_string(pieces)
    assert tokenizer.decode(prompts[2] + gen.token_ids).endswith(text)


def test_eight_threads(engine, prompts, monkeypatch):
    jobs = [(prompts[i % len(prompts)], seeded(SAMPLED, i)) for i in range(8)]
    alone = [engine.generate(p, params) for p, params in jobs]
    sizes = count_batches(engine, monkeypatch)
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(lambda job: engine.generate(*job), jobs))
    assert [g.token_ids for g in threaded] == [g.token_ids for g in alone]
    assert sum(sizes) == 8 and max(sizes) > 1


def test_agenerate(engine, prompts):
    async def main():
        return await asyncio.gather(*(engine.agenerate(p, seeded(SAMPLED, 0)) for p in prompts))

    results = asyncio.run(main())
    assert [g.token_ids for g in results] == [engine.generate(p, seeded(SAMPLED, 0)).token_ids for p in prompts]


def test_defaults_ignore_the_models_generation_config(tiny, prompts, reference_logprobs):
    """A generation_config that says "nearly greedy" must not leak into SamplingParams() sampling."""
    model, tokenizer = tiny
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.05, top_k=1, top_p=0.1, eos_token_id=tokenizer.eos_token_id
    )
    try:
        with HFEngine(model, tokenizer) as eng:
            greedy = eng.generate(prompts[1], GREEDY).token_ids
            gens = [eng.generate(prompts[1], SamplingParams(max_new_tokens=24, seed=s)) for s in range(3)]
    finally:
        model.generation_config = saved
    assert any(g.token_ids != greedy[: len(g.token_ids)] for g in gens)
    for gen in gens:
        assert gen.logprobs == pytest.approx(reference_logprobs(model, prompts[1], gen.token_ids, 1.0), abs=1e-4)


def test_load_weights_changes_the_policy(tiny, prompts):
    model, tokenizer = tiny
    original = {k: v.clone() for k, v in model.state_dict().items()}
    with HFEngine(model, tokenizer) as eng:
        before = eng.generate(prompts[1], GREEDY)
        eng.load_weights({k: v * 1.5 if "mlp" in k else v for k, v in original.items()})
        after = eng.generate(prompts[1], GREEDY)
        with pytest.raises(KeyError):
            eng.load_weights([("no.such.weight", original["lm_head.weight"])])
        eng.load_weights(original)
        again = eng.generate(prompts[1], GREEDY)
    assert before.logprobs != after.logprobs and again.token_ids == before.token_ids


def test_close_serves_what_was_queued(tiny, prompts):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer, max_batch=2)
    futures = [eng.submit(p, seeded(SAMPLED, seed)) for seed, p in enumerate(prompts)]  # two wait for room
    eng.close()
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(RuntimeError):
        eng.submit(prompts[0], SAMPLED)


def test_bad_requests_and_close(tiny):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer)
    for bad in ([], [len(tokenizer) + 5], [1] * model.config.max_position_embeddings):
        with pytest.raises(ValueError):
            eng.generate(bad)
    eng.close()
    with pytest.raises(RuntimeError):
        eng.generate([1, 2, 3])


def test_a_cancelled_generation_leaves_the_batch_at_once_and_its_batch_mates_are_untouched(tiny, prompts):
    """Ctrl-C cancels an agenerate. Its row must leave the batch at the next step, not decode on to its token budget
    (close() would wait for that), and its end must not touch the rows still decoding beside it (setting the result
    of a cancelled Future raises in the worker, which used to fail the whole batch)."""
    model, tokenizer = tiny
    mate = seeded(SamplingParams(temperature=1.0, max_new_tokens=400), 5)
    alone = HFEngine(model, tokenizer).generate(prompts[1], mate)
    eng = HFEngine(model, tokenizer, max_batch=4)
    cancelled = eng.submit(prompts[0], seeded(SamplingParams(temperature=1.0, max_new_tokens=120), 1))

    async def run():
        doomed = asyncio.wrap_future(cancelled)
        beside = asyncio.wrap_future(eng.submit(prompts[1], mate))
        await eng.agenerate(prompts[2], seeded(SAMPLED, 3))  # 24 steps in: the doomed row is mid-generation
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        deadline = time.monotonic() + 1.0
        while eng._batch is not None and any(r.future is cancelled for r in eng._batch.rows):
            assert time.monotonic() < deadline, "the cancelled row is still being decoded"
            await asyncio.sleep(0.001)
        return await beside  # decodes past the cancelled row's own end (120 tokens)

    beside = asyncio.run(run())
    assert cancelled.cancelled() and len(beside.token_ids) > 120
    assert beside.token_ids == alone.token_ids and beside.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    began = time.monotonic()
    eng.close()
    assert time.monotonic() - began < 1.0
