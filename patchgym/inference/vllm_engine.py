"""The vllm engine: a `vllm serve` subprocess that this process starts, samples through (token ids in, exact ids and
logprobs out, via OpenAIEngine) and pushes new policy weights into without a restart.

A weight push streams the (name, tensor) pairs it is given into the server's worker in buckets of
`sync_bucket_mb` (patchgym.inference.weight_push: a /dev/shm segment on CPU, NCCL on CUDA), where
patchgym.inference.vllm_worker loads them in place through vLLM's layerwise reload (the one route that works on the
CPU backend, whose linear layers are prepacked); no checkpoint is written. It then empties the prefix cache, whose
KV blocks were computed with the old weights.
"""

import atexit
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch

import patchgym
from patchgym.inference.base import SamplingParams
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.models import load_tokenizer, smollm2_dir
from patchgym.inference.openai_engine import OpenAIEngine, OpenAIEngineError
from patchgym.inference.weight_push import NcclChannel, PushStats, push_shm, untied

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXTENSION = "patchgym.inference.vllm_worker.WeightSyncExtension"
LOG_TAIL_LINES = 40


class VLLMServerError(RuntimeError):
    """The vLLM server did not start, died, or refused a weight update; the message ends with its log's tail."""


class VLLMEngine(OpenAIEngine):
    """Engine over a vLLM server it owns (a context manager; close() stops it). `dtype` float32 keeps the sampled
    tokens' logprobs within ~3e-5 of an fp32 trainer's (bf16: up to ~0.3 nats off); `max_batch` caps the sequences
    decoded together (--max-num-seqs); a weight push moves `sync_bucket_mb` at a time. Unlike HFEngine, a request
    with top-k/top-p/min-p gets the logprobs of the
    truncated distribution; the default (unbiased) sampling is the same in both."""

    def __init__(self, spec: str = "smollm2", *, dtype: str = "float32", kv_cache_gb: float = 1.0,
                 max_batch: int = 8, extra_args: Iterable[str] = (), start_timeout_s: float = 300.0,
                 seed: int = 0, chat_template: str | None = None, chat_template_kwargs: dict | None = None,
                 sync_bucket_mb: float = 256.0, cpu_cores: int | str = "all"):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.model_dir, self.dtype = model_dir(spec), dtype
        self.workdir = Path(tempfile.mkdtemp(prefix="patchgym-vllm-"))
        self.log_path = self.workdir / "server.log"
        # The server renders chats with the same text the token builder uses (kwargs written into it).
        try:
            tokenizer = load_tokenizer(spec)
        except (OSError, ValueError) as exc:  # no tokenizer files, or ones transformers cannot read
            raise VLLMServerError(f"cannot load the tokenizer of {spec}: {str(exc).splitlines()[0]}") from None
        tokenizer = configure_tokenizer(tokenizer, chat_template, chat_template_kwargs or {})
        extra_args = list(extra_args)
        (self.workdir / "chat_template.jinja").write_text(tokenizer.chat_template)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket_bytes = max(1, int(sync_bucket_mb * 2**20))
        self.last_push: PushStats | None = None
        self._nccl: NcclChannel | None = None
        self._stopped = False
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
            "--served-model-name", spec, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype,
            "--kv-cache-memory-bytes", str(int(kv_cache_gb * 2**30)),  # else it reserves 90 % of RAM on CPU
            "--max-num-seqs", str(max_batch), "--seed", str(seed),
            # The model's generation_config.json must never set sampling defaults (it turned on top-k/min-p once).
            "--generation-config", "vllm",
            # log softmax(logits / T), as Generation.logprobs promises ("raw" would ignore T). With top-k/top-p/min-p
            # on, vLLM reports the truncated, renormalised distribution's logprob: what was really sampled from.
            "--logprobs-mode", "processed_logprobs",
            "--chat-template", str(self.workdir / "chat_template.jinja"),
            "--worker-extension-cls", EXTENSION,
            # On CPU, compiling takes a minute per start and gains little; on a GPU, CUDA graphs are worth it.
            *([] if torch.cuda.is_available() else ["--enforce-eager", *cpu_prefill_args(extra_args)]),
            *cpu_layout(cpu_cores, extra_args)[1],
            *extra_args,
        ]
        # DEV_MODE adds /collective_rpc and /reset_prefix_cache; the worker imports the extension from this patchgym.
        source = str(Path(patchgym.__file__).resolve().parents[1])
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **cpu_layout(cpu_cores, extra_args)[0],
               "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "wb") as log:
            # Its own process group: vLLM's EngineCore and worker processes must die with it.
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        atexit.register(self.close)  # the server is in its own session: it would outlive an interpreter that exits
        try:
            self._wait_ready(start_timeout_s)
            super().__init__(f"{self.url}/v1", spec, tokenizer)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, config) -> "VLLMEngine":
        """An engine for an InferenceConfig with engine=vllm."""
        return cls(config.model, dtype=config.vllm_dtype, kv_cache_gb=config.vllm_kv_cache_gb,
                   max_batch=config.max_batch, extra_args=config.vllm_args,
                   start_timeout_s=config.vllm_start_timeout_s, chat_template=config.chat_template,
                   chat_template_kwargs=config.chat_template_kwargs, sync_bucket_mb=config.sync_bucket_mb,
                   cpu_cores=config.vllm_cpu_cores)

    @property
    def pid(self) -> int:
        return self.process.pid

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the served weights in place, bucket by bucket, taking the pairs one at a time (a generator that
        gathers FSDP shards as it goes is never held whole). Push whole models, or whole fused groups (q, k, v
        together, gate and up together): a layer given only part of its tensors is rebuilt with the rest undefined.
        A generator must not repeat tied tensors (a state dict may: its ties are dropped here)."""
        items = untied(state_dict) if isinstance(state_dict, Mapping) else iter(state_dict)
        first = next(items, None)
        if first is None:
            return
        items = itertools.chain([first], items)
        try:
            if first[1].is_cuda:
                self.last_push = self._nccl_channel(first[1].device).push(self._rpc, items, self.bucket_bytes,
                                                                          DTYPES[self.dtype])
            else:
                self.last_push = push_shm(self._rpc, items, self.bucket_bytes, DTYPES[self.dtype])
        except VLLMServerError as exc:
            raise VLLMServerError(f"a weight push failed part-way; the served weights may be mixed until the next "
                                  f"full push: {exc}") from exc
        self._post("/reset_prefix_cache", None)

    def close(self) -> None:
        atexit.unregister(self.close)
        if hasattr(self, "_client"):
            super().close()
        self._stop_server()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The server log's last lines, after its first few exception lines (the root cause of a crash often
        scrolls out of the tail behind the shutdown messages)."""
        try:
            with open(self.log_path, errors="replace") as log:
                text = log.readlines()
        except OSError:
            return ""
        causes = list(dict.fromkeys(line for line in text if "Error: " in line))[:5]
        return "".join(causes + ["...\n"] + text[-lines:] if causes else text[-lines:])

    def _sampling(self, params: SamplingParams) -> dict:
        """Every sampling field spelled out, "off" values too: nothing is left to a server-side default."""
        fields = super()._sampling(params)
        fields["extra_body"].update({"top_k": params.top_k, "min_p": params.min_p, "repetition_penalty": 1.0})
        return {**fields, "presence_penalty": 0.0, "frequency_penalty": 0.0}

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """A request that failed because the server died says so, with the server's last words."""
        try:
            with super()._errors():
                yield
        except OpenAIEngineError as exc:
            if self.process.poll() is None:
                raise
            raise VLLMServerError(f"the vLLM server died (exit code {self.process.returncode}); its log ends:\n"
                                  f"{self.log_tail()}") from exc

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VLLMServerError(f"the vLLM server exited with code {self.process.returncode} while starting; "
                                      f"its log ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise VLLMServerError(f"the vLLM server was not healthy after {timeout_s:.0f} s "
                              f"(inference.vllm_start_timeout_s); its log ends:\n{self.log_tail()}")

    def _rpc(self, method: str, **kwargs: Any) -> list:
        """Call `method` of every worker (the extension's) through /collective_rpc; one result per worker."""
        return self._post("/collective_rpc", {"method": method, "kwargs": kwargs})["results"]

    def _nccl_channel(self, device: torch.device) -> NcclChannel:
        """The NCCL group with the workers, formed at the first CUDA push (untested: no GPU where this was written)."""
        if self._nccl is None:
            self._nccl = NcclChannel(self._rpc, workers=len(self._rpc("patchgym_rank")), device=device)
        return self._nccl

    def _post(self, route: str, body: Any) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(f"{self.url}{route}", data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise VLLMServerError(f"POST {route}: HTTP {exc.code} {exc.read()[:2000]!r}; log tail:\n"
                                  f"{self.log_tail()}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise VLLMServerError(f"POST {route}: {exc}; log tail:\n{self.log_tail()}") from exc
        return json.loads(payload) if payload.strip() else None

    def _stop_server(self) -> None:
        """SIGTERM the server's process group (EngineCore and the worker too) and wait until all of it is gone;
        SIGKILL what outlives 15 s."""
        process = getattr(self, "process", None)
        if process is not None and not self._stopped:  # once only: the group's id may be reused afterwards
            self._stopped = True
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            if not _group_gone(process.pid, timeout_s=15):
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
                _group_gone(process.pid, timeout_s=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def model_dir(spec: str) -> Path:
    """The HF safetensors directory vLLM loads for a spec (vLLM reads no GGUF: "smollm2" is the converted copy)."""
    if spec == "tiny":
        raise ValueError("inference.model=tiny: its 8-wide attention heads are narrower than vLLM's CPU attention "
                         "takes (32 and up); use smollm2 or a model directory with the vllm engine")
    return smollm2_dir() if spec == "smollm2" else Path(spec)


USER_LAYOUT_ARGS = ("--distributed-executor-backend", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size",
                    "-pp", "--data-parallel-size", "-dp")
USER_LAYOUT_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def cpu_prefill_args(extra_args: Iterable[str] = ()) -> list[str]:
    """Chunked prefill off on CPU: there a request with its own seed that is still in a partial prefill step crashes
    vLLM's engine (its sampler rewinds the request's generator, which a CPU generator cannot: "CPU Generator does not
    use offset"), and every request in flight with it. Prompts are then prefilled whole, at no cost in throughput
    measured here. Left alone where inference.vllm_args set chunking or the batched-token budget."""
    if any(a.split("=")[0] in ("--enable-chunked-prefill", "--no-enable-chunked-prefill", "--max-num-batched-tokens")
           for a in extra_args):
        return []
    return ["--no-enable-chunked-prefill"]


def cpu_layout(cores: int | str, extra_args: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """(environment, server arguments) that bind the CPU worker's OpenMP threads one per core to this process's
    cores ("all") or the first N, none reserved. vLLM's own layout ("vllm", and any GPU machine) binds the worker to
    one core and keeps the other for its scheduler process, which spins on a shared-memory queue while the worker
    computes. (vLLM's CPU platform always runs the worker in a process of its own: it turns a uni executor into mp.)
    A layout the user gave (parallelism or an executor in inference.vllm_args, or vLLM's binding variables) is left
    as is."""
    own = any(a.split("=")[0] in USER_LAYOUT_ARGS for a in extra_args) or any(v in os.environ for v in USER_LAYOUT_ENV)
    if cores == "vllm" or own or torch.cuda.is_available():
        return {}, []
    allowed = sorted(os.sched_getaffinity(0))
    count = len(allowed) if cores == "all" else int(cores)
    if not 1 <= count <= len(allowed):
        raise ValueError(f"inference.vllm_cpu_cores={cores}, but this process may use {len(allowed)} cores")
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, allowed[:count])), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}, []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no process of the group is left (orphans are reaped by init)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
