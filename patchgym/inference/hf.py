"""The transformers engine: a worker thread merges concurrent requests into left-padded batches and runs its own
KV-cached decode loop, so every request gets back its exact sampled ids and their logprobs."""

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch
from transformers import DynamicCache

from patchgym.inference.base import Generation, SamplingParams
from patchgym.inference.models import load_model
from patchgym.inference.sampling import sample_token

_CLOSE = object()  # queued by close(): serve what came before it, then stop


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator
    future: Future = field(default_factory=Future)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class HFEngine:
    """Engine over a transformers causal LM (CPU or GPU). `generate` blocks the calling thread; many threads (or
    `agenerate` coroutines) at once are decoded together, up to max_batch rows per forward pass.

    A batch runs until all its rows finish; rows that finish leave it (their KV rows are dropped) and their callers
    return at once. Requests that arrive meanwhile wait for the next batch. load_weights swaps weights between two
    decode steps, so a request in flight continues on the new weights (as vLLM's in-flight updates do).
    """

    def __init__(self, model, tokenizer, max_batch: int = 8, batch_wait_s: float = 0.005):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s  # after the first request, how long to wait for others to join its batch
        self.device = next(model.parameters()).device
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids)
        self.max_len = model.config.max_position_embeddings
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._step_lock = threading.Lock()  # one forward pass or one weight swap at a time
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._worker.start()

    @classmethod
    def from_spec(cls, spec: str = "smollm2", device: str = "cpu", **kwargs) -> "HFEngine":
        model, tokenizer = load_model(spec, device)
        return cls(model, tokenizer, **kwargs)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Future:
        """Queue one request; the Future resolves to its Generation."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        self._check_prompt(prompt_ids)
        generator = torch.Generator(device=self.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        stop_ids = frozenset(self.eos_token_ids) | frozenset(params.stop_token_ids)
        request = _Request(list(prompt_ids), params, stop_ids, generator)
        self._pending.put(request)
        return request.future

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        return self.submit(prompt_ids, params or SamplingParams()).result()

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        return await asyncio.wrap_future(self.submit(prompt_ids, params or SamplingParams()))

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new values into the model's tensors in place; all names are checked before any is written."""
        items = list(state_dict.items() if isinstance(state_dict, Mapping) else state_dict)
        targets = self.model.state_dict()
        unknown = [name for name, _ in items if name not in targets]
        if unknown:
            raise KeyError(f"weights the model does not have: {unknown[:5]}")
        with self._step_lock, torch.no_grad():
            for name, tensor in items:
                targets[name].copy_(tensor)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending.put(_CLOSE)
            self._worker.join()
            self._fail_leftovers()

    def __enter__(self) -> "HFEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _fail_leftovers(self) -> None:
        """A submit that raced close() may have queued behind the stop marker; its caller must not wait forever."""
        while True:
            try:
                item = self._pending.get_nowait()
            except queue.Empty:
                return
            if item is not _CLOSE:
                item.future.set_exception(RuntimeError("the engine is closed"))

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.max_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {self.max_len}")
        vocab = self.model.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def _serve(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._decode(batch)
            except BaseException as exc:  # noqa: BLE001 - the caller, not this thread, decides what an error means
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)

    def _next_batch(self) -> list[_Request] | None:
        """Block for one request, then take whatever else is queued (up to max_batch) within batch_wait_s."""
        first = self._pending.get()
        if first is _CLOSE:
            return None
        batch = [first]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            try:
                item = self._pending.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is _CLOSE:
                self._pending.put(_CLOSE)  # stop after this batch
                break
            batch.append(item)
        return batch

    def _decode(self, rows: list[_Request]) -> None:
        input_ids, attention_mask, positions = self._left_pad([r.prompt_ids for r in rows])
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(input_ids, attention_mask, positions, cache, logits_to_keep=1)
        positions = positions[:, -1:] + 1
        while rows:
            next_ids, keep = [], []
            for i, request in enumerate(rows):
                token, logprob = sample_token(logits[i], request.params, request.generator)
                request.token_ids.append(token)
                request.logprobs.append(logprob)
                if (reason := self._finish_reason(request)) is not None:
                    request.future.set_result(Generation(request.token_ids, request.logprobs, reason))
                else:
                    keep.append(i)
                    next_ids.append(token)
            if len(keep) < len(rows):
                index = torch.tensor(keep, device=self.device, dtype=torch.long)
                cache.batch_select_indices(index)
                attention_mask, positions = attention_mask[index], positions[index]
                rows = [rows[i] for i in keep]
            if not rows:
                return
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(rows), 1)], dim=1)
            token_ids = torch.tensor(next_ids, device=self.device, dtype=torch.long)[:, None]
            logits = self._forward(token_ids, attention_mask, positions, cache)
            positions = positions + 1

    def _forward(self, input_ids, attention_mask, positions, cache, **kwargs) -> torch.Tensor:
        with self._step_lock, torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **kwargs,
            )
        return out.logits[:, -1].float()

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left padding puts every prompt's last token in the last column, where decoding continues for all rows."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # each row counts from 0 at its first real token
        return ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def _finish_reason(self, request: _Request) -> str | None:
        if request.token_ids[-1] in request.stop_ids:
            return "stop"
        if len(request.token_ids) >= request.params.max_new_tokens:
            return "length"
        if len(request.prompt_ids) + len(request.token_ids) >= self.max_len:
            return "length"
        return None


def _eos_token_ids(model, tokenizer) -> list[int]:
    """End-of-turn ids: the tokenizer's eos plus the generation_config's (an int or a list)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)
