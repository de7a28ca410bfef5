"""An Engine over any OpenAI-compatible server (vLLM, SGLang, llama.cpp, `patchgym serve`, hosted chat APIs) through
the official openai client: the exact sampled ids when the server returns them, else re-tokenised text, marked so."""

import asyncio
import math
import os
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import openai

from patchgym.inference.base import Generation, SamplingParams

NAN = float("nan")  # the logprob of a token the server did not report
TOKEN_ID_PREFIX = "token_id:"  # how vLLM's --return-tokens-as-token-ids spells a logprob's token


class OpenAIEngineError(RuntimeError):
    """The server answered with an error, or could not be reached after the client's retries."""


class OpenAIEngine:
    """api="completions" sends token ids and suits vLLM, SGLang, llama.cpp and `patchgym serve`; api="chat" is for
    hosted APIs that only have chat: the agent then calls generate_chat with its messages (needs_messages is True).

    vllm_extras sends vLLM's extra fields (return_token_ids, skip_special_tokens, and top_k, min_p, stop_token_ids
    when set); turn it off for strict hosted APIs, which reject fields they do not know. chat_template_kwargs go with
    every chat request (vLLM's and SGLang's field): the server renders the chat there, with its own template.
    """

    needs_messages = False  # True on an instance made with api="chat"

    def __init__(self, base_url: str, model: str, tokenizer, api_key: str | None = None, api: str = "completions",
                 timeout: float = 600.0, max_retries: int = 2, vllm_extras: bool = True,
                 chat_template_kwargs: dict | None = None):
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        self.base_url, self.model, self.tokenizer, self.api = base_url, model, tokenizer, api
        self.needs_messages = api == "chat"
        self.vllm_extras = vllm_extras
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_retries = max_retries
        self._client_args = {"base_url": base_url, "api_key": api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                             "timeout": timeout, "max_retries": max_retries}
        self._client = openai.OpenAI(**self._client_args)
        # An async client's connections belong to the event loop that opened them, so each loop gets its own.
        self._async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        params = params or SamplingParams()
        with self._errors():
            response = self._client.completions.create(**self._completion_request(prompt_ids, params))
        return self._completion(response, params)

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        params = params or SamplingParams()
        with self._errors():
            response = await self._async_client().completions.create(**self._completion_request(prompt_ids, params))
        return self._completion(response, params)

    def generate_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Generation:
        params = params or SamplingParams()
        with self._errors():
            response = self._client.chat.completions.create(**self._chat_request(messages, params))
        return self._chat(response, params)

    async def agenerate_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Generation:
        params = params or SamplingParams()
        with self._errors():
            response = await self._async_client().chat.completions.create(**self._chat_request(messages, params))
        return self._chat(response, params)

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError(f"OpenAIEngine cannot push weights: the server at {self.base_url} owns its weights "
                                  "(update them through the server itself, e.g. vLLM's /collective_rpc)")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "OpenAIEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _async_client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        if loop not in self._async_clients:
            self._async_clients[loop] = openai.AsyncOpenAI(**self._client_args)
        return self._async_clients[loop]

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except openai.APIStatusError as exc:
            raise OpenAIEngineError(f"{self.base_url} answered HTTP {exc.status_code}: {exc.message}") from exc
        except openai.APIConnectionError as exc:
            raise OpenAIEngineError(f"could not reach {self.base_url} "
                                    f"(after {self.max_retries} retries): {exc}") from exc

    def _completion_request(self, prompt_ids: list[int], params: SamplingParams) -> dict:
        if self.api != "completions":
            raise TypeError("this OpenAIEngine speaks chat: call generate_chat(messages) instead of generate(ids)")
        return {"model": self.model, "prompt": list(prompt_ids), "max_tokens": params.max_new_tokens, "logprobs": 1,
                **self._sampling(params)}

    def _chat_request(self, messages: list[dict], params: SamplingParams) -> dict:
        request = {"model": self.model, "messages": messages, "max_completion_tokens": params.max_new_tokens,
                   "logprobs": True, **self._sampling(params)}
        if self.chat_template_kwargs:
            request["extra_body"] = {**request.get("extra_body", {}), "chat_template_kwargs": self.chat_template_kwargs}
        return request

    def _sampling(self, params: SamplingParams) -> dict:
        """The request fields for params; "off" values are left out, since every server reads absence as off."""
        fields: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
        if params.seed is not None:
            fields["seed"] = params.seed
        extra = {"top_k": params.top_k or None, "min_p": params.min_p or None,
                 "stop_token_ids": list(params.stop_token_ids) or None}
        extra = {k: v for k, v in extra.items() if v is not None}
        if not self.vllm_extras:
            if extra:
                raise ValueError(f"{', '.join(extra)} need vllm_extras=True (plain OpenAI APIs have no such fields)")
            return fields
        return {**fields, "extra_body": {"return_token_ids": True, "skip_special_tokens": False, **extra}}

    def _completion(self, response, params: SamplingParams) -> Generation:
        choice = response.choices[0]
        logprobs = choice.logprobs
        tokens = logprobs.tokens if logprobs else None
        values = logprobs.token_logprobs if logprobs else None
        return self._generation(choice, tokens, values, choice.text or "", params)

    def _chat(self, response, params: SamplingParams) -> Generation:
        choice = response.choices[0]
        content = choice.logprobs.content if choice.logprobs else None
        tokens = [c.token for c in content] if content else None
        values = [c.logprob for c in content] if content else None
        return self._generation(choice, tokens, values, choice.message.content or "", params)

    def _generation(self, choice, tokens: list[str] | None, values: list[float | None] | None, text: str,
                    params: SamplingParams) -> Generation:
        """Ids from token_ids, else from vLLM's "token_id:N" tokens, else re-tokenised text (not exact); a stop
        that left no end-of-turn id in them gets the eos id, whose logprob is unknown."""
        ids = getattr(choice, "token_ids", None) or _ids_from_tokens(tokens)
        exact = ids is not None
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        logprobs = _align(values or [], len(ids), exact)
        ids = [int(i) for i in ids]
        end_ids = {*self.tokenizer.all_special_ids, *params.stop_token_ids}
        if choice.finish_reason == "stop" and (not ids or ids[-1] not in end_ids):
            ids.append(self.tokenizer.eos_token_id)
            logprobs.append(NAN)
        return Generation(ids, logprobs, choice.finish_reason, exact=exact)


def _ids_from_tokens(tokens: list[str] | None) -> list[int] | None:
    if tokens and all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
    return None


def _align(values: list[float | None], n: int, exact: bool) -> list[float]:
    """One logprob per id. Exact ids line up with the server's tokens (a missing tail is NaN); re-tokenised ids only
    when the counts agree, else every logprob is unknown."""
    if not exact and len(values) != n:
        return [NAN] * n
    known = [NAN if v is None or math.isnan(v) else float(v) for v in values[:n]]
    return known + [NAN] * (n - len(known))
