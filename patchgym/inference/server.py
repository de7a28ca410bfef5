"""An OpenAI-compatible HTTP server over any Engine (stdlib only) that, like vLLM with `return_token_ids`, can return
the exact sampled token ids and their logprobs. Each request gets a thread; the engine batches concurrent ones."""

import json
import logging
import math
import threading
import time
import uuid
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from typing import Any, NoReturn

import tokenizers

from patchgym.inference.base import Engine, Generation, SamplingParams

log = logging.getLogger(__name__)

# Fields this server does not implement: each must be absent or hold its neutral value, so that a client is told,
# rather than silently given something other than what it asked for.
NEUTRAL_ONLY = {
    "n": (1,), "best_of": (1,), "stop": (), "stream": (False,), "echo": (False,), "suffix": (), "logit_bias": ({},),
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "tools": ([],),
}
MAX_TOP_LOGPROBS = 5  # OpenAI's limit
NO_TOP_LOGPROBS = "top_logprobs is not supported by this engine: it reports only the sampled token's logprob"
MIN_LOGPROB = -9999.0  # vLLM's floor for -inf, which JSON cannot carry


class BadRequest(Exception):
    """A request the server refuses; `param` names the offending field, as OpenAI's error objects do."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind


class Api:
    """The routes as plain functions from a parsed JSON body to a JSON-ready dict (raising BadRequest)."""

    def __init__(self, engine: Engine, model_name: str):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.context_len = getattr(engine, "max_len", None) or self.tokenizer.model_max_length
        self.created = int(time.time())

    def models(self) -> dict:
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "patchgym",
                "max_model_len": self.context_len}
        return {"object": "list", "data": [card]}

    def chat(self, body: dict) -> dict:
        self._check_common(body)
        prompt_ids = self._render(_field(body, "messages", list, None))
        want_logprobs = _field(body, "logprobs", bool, False)
        top = _field(body, "top_logprobs", int, 0)
        _require(0 <= top <= MAX_TOP_LOGPROBS, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}",
                 "top_logprobs")
        _require(top == 0, NO_TOP_LOGPROBS, "top_logprobs")
        gen, text = self._generate(body, prompt_ids, "messages")
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": self._chat_logprobs(gen) if want_logprobs else None, "finish_reason": gen.finish_reason}
        return self._response(body, "chat.completion", "chatcmpl", choice, prompt_ids, gen)

    def completions(self, body: dict) -> dict:
        self._check_common(body)
        prompt_ids = self._prompt_ids(body.get("prompt"))
        # 0 and 1 both mean "the sampled token's logprob": its entry is the only one this engine can give truthfully.
        n_logprobs = _field(body, "logprobs", int, None)
        _require(n_logprobs is None or 0 <= n_logprobs <= 1,
                 f"logprobs must be 0 or 1 (this engine reports only the sampled token's logprob), got {n_logprobs}",
                 "logprobs")
        gen, text = self._generate(body, prompt_ids, "prompt")
        choice = {"index": 0, "text": text, "finish_reason": gen.finish_reason,
                  "logprobs": None if n_logprobs is None else self._completion_logprobs(gen)}
        return self._response(body, "text_completion", "cmpl", choice, prompt_ids, gen)

    def _check_common(self, body: dict) -> None:
        model = _field(body, "model", str, None)
        _require(model is not None, "model is required", "model")
        _require(model == self.model_name, f"the model {model!r} does not exist; this server has {self.model_name!r}",
                 "model", status=404, kind="model_not_found")
        for name, neutral in NEUTRAL_ONLY.items():
            value = body.get(name)
            only = f" (only {neutral[0]!r})" if neutral else ""
            _require(value is None or value in neutral, f"{name}={value!r} is not supported by this server{only}", name)
        for name in ("return_token_ids", "skip_special_tokens"):  # checked now, not after the generation is spent
            _field(body, name, bool, None)

    def _render(self, messages: list | None) -> list[int]:
        _require(bool(messages), "messages must be a non-empty list", "messages")
        for i, message in enumerate(messages):
            _require(isinstance(message, dict) and isinstance(message.get("role"), str),
                     f"messages[{i}] must be an object with a string role", f"messages[{i}].role")
            _require(message.get("content") is None or isinstance(message["content"], str),
                     f"messages[{i}].content must be a string", f"messages[{i}].content")
        try:
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault (roles, order)
            raise BadRequest(f"the chat template could not render messages: {exc}", "messages") from exc

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer(prompt)["input_ids"]
        _require(isinstance(prompt, list) and bool(prompt) and all(_is_int(t) for t in prompt),
                 "prompt must be a string or a non-empty list of token ids (one prompt per request)", "prompt")
        return prompt

    def _generate(self, body: dict, prompt_ids: list[int], prompt_field: str) -> tuple[Generation, str]:
        room = self.context_len - len(prompt_ids)
        _require(room >= 1, f"the prompt has {len(prompt_ids)} tokens; the model's context is {self.context_len}",
                 prompt_field)
        try:
            gen = self.engine.generate(prompt_ids, _sampling_params(body, room))
        except ValueError as exc:  # the engine's own prompt checks (e.g. ids outside the vocabulary)
            raise BadRequest(str(exc), prompt_field) from exc
        ids = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=_field(body, "skip_special_tokens", bool, True))
        return gen, text

    def _response(self, body: dict, kind: str, prefix: str, choice: dict, prompt_ids: list[int],
                  gen: Generation) -> dict:
        out = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
               "model": self.model_name, "choices": [choice],
               "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen.token_ids),
                         "total_tokens": len(prompt_ids) + len(gen.token_ids)}}
        if _field(body, "return_token_ids", bool, False):
            out["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(gen.token_ids)
        return out

    def _chat_logprobs(self, gen: Generation) -> dict:
        content = [{"token": self._token(t), "logprob": _finite(lp), "bytes": token_bytes(self.tokenizer, t),
                    "top_logprobs": []} for t, lp in zip(gen.token_ids, gen.logprobs)]
        return {"content": content}

    def _completion_logprobs(self, gen: Generation) -> dict:
        tokens = [self._token(t) for t in gen.token_ids]
        offsets = list(accumulate((len(t) for t in tokens[:-1]), initial=0))  # as vLLM: summed token lengths
        logprobs = [_finite(lp) for lp in gen.logprobs]
        return {"tokens": tokens, "token_logprobs": logprobs,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)], "text_offset": offsets}

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _sampling_params(body: dict, room: int) -> SamplingParams:
    """SamplingParams from the request, with the unbiased defaults (T = 1, no truncation) for anything absent."""
    temperature = _field(body, "temperature", float, 1.0)
    _require(temperature >= 0, f"temperature must be >= 0, got {temperature}", "temperature")
    top_p = _field(body, "top_p", float, 1.0)
    _require(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = _field(body, "top_k", int, 0)
    _require(top_k >= -1, f"top_k must be >= 0, or -1 or 0 for off; got {top_k}", "top_k")
    min_p = _field(body, "min_p", float, 0.0)
    _require(0 <= min_p < 1, f"min_p must be in [0, 1), got {min_p}", "min_p")
    stop_ids = _field(body, "stop_token_ids", list, [])
    _require(all(_is_int(t) for t in stop_ids), "stop_token_ids must be a list of token ids", "stop_token_ids")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, name, int, room)
    _require(1 <= max_tokens <= room, f"{name} must be in [1, {room}] (what is left of the model's context after "
             f"the prompt), got {max_tokens}", name)
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p,
                          max_new_tokens=max_tokens, seed=_field(body, "seed", int, None), stop_token_ids=stop_ids)


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}


def _field(body: dict, name: str, kind: type, default: Any) -> Any:
    """body[name] checked to be of `kind` (ints count as floats, bools never as numbers); `default` when absent/null."""
    value = body.get(name)
    if value is None:
        return default
    if kind is float:
        ok = (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
    elif kind is int:
        ok = _is_int(value)
    else:
        ok = isinstance(value, kind)
    _require(ok, f"{name} must be {_KINDS[kind]}, got {value!r}", name)
    return float(value) if kind is float else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, message: str, param: str | None, **kwargs: Any) -> None:
    if not ok:
        raise BadRequest(message, param, **kwargs)


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def token_bytes(tokenizer, token_id: int) -> list[int]:
    """The token's exact bytes: byte-level BPE pieces map back to bytes even when a piece is half a UTF-8 character."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    decoder = _byte_decoder()
    byte_level = isinstance(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None),
                            tokenizers.decoders.ByteLevel)
    if byte_level and all(c in decoder for c in piece):
        return [decoder[c] for c in piece]
    return list(tokenizer.decode([token_id], skip_special_tokens=False).encode())


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest for chars from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client that holds on to its connection must not keep the process alive

    def __init__(self, address: tuple[str, int], api: Api):
        super().__init__(address, _Handler)
        self.api = api


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client's connection pool expects

    def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
        api: Api = self.server.api
        routes = {"/v1/models": api.models, "/health": lambda: {}}
        self._answer(lambda: routes[self.path]() if self.path in routes else _not_found(self.path))

    def do_POST(self) -> None:  # noqa: N802
        api: Api = self.server.api
        routes = {"/v1/chat/completions": api.chat, "/v1/completions": api.completions}
        self._answer(lambda: routes[self.path](self._body()) if self.path in routes else _not_found(self.path))

    def _body(self) -> dict:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from exc
        _require(isinstance(body, dict), "the body must be a JSON object", None)
        return body

    def _answer(self, route) -> None:
        try:
            status, payload = 200, route()
        except BadRequest as exc:
            status, payload = exc.status, _error(str(exc), exc.kind, exc.param)
        except Exception as exc:  # noqa: BLE001 - the client gets a 500 with the reason; the server keeps serving
            log.exception("request to %s failed", self.path)
            status, payload = 500, _error(f"{type(exc).__name__}: {exc}", "server_error", None)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        log.debug("%s %s", self.address_string(), format % args)


def _not_found(path: str) -> NoReturn:
    raise BadRequest(f"no route {path}", None, status=404, kind="not_found")


def _error(message: str, kind: str, param: str | None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param}}


class ServerHandle:
    """A running server: `url` is its root (the OpenAI base URL is url + "/v1"); close() stops it, not the engine."""

    def __init__(self, httpd: _Server):
        self._httpd = httpd
        host, port = httpd.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=httpd.serve_forever, name="openai-server", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, model_name: str = "patchgym") -> ServerHandle:
    """Start serving `engine` in a background thread (port 0 = any free port); the engine stays the caller's."""
    return ServerHandle(_Server((host, port), Api(engine, model_name)))
