"""The `inference:` section of a patchgym config: which engine serves the policy, and on what."""

import importlib.util
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ENGINES = ("hf", "openai", "vllm")
RANDOM_MODELS = ("tiny", "tiny-qwen3", "tiny-qwen2.5")  # random-init test models, built in memory
# Most tokens a turn may sample where agent.sampling.max_new_tokens is null: SmolLM2-135M's tool calls take well
# under 300 tokens, and a turn it does not end by then has degenerated; any other model gets the common 1,024.
TURN_TOKENS = {"smollm2": 320}
DEFAULT_TURN_TOKENS = 1024


class InferenceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["auto", "hf", "openai", "vllm"] = Field("auto", description=(
        "hf (transformers in this process), openai (any OpenAI-compatible server) or vllm (a vLLM server this process "
        "starts and pushes weights into; pip install '.[vllm]'). auto: openai when base_url is set, vllm when it is "
        "installed and the model is a pretrained one, else hf (the random test models tiny* load in-process)"))
    model: str = Field("smollm2", description="smollm2 (offline default), tiny, tiny-qwen3, tiny-qwen2.5, a model "
                                              "directory, or a hub id")
    chat_template: str | None = Field(None, description=(
        "a Jinja chat template file, or a shipped name (qwen3, qwen3-thinking-2507, qwen2.5-instruct); null = the "
        "tokenizer's own. Every engine and the token builder render with it"))
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(default_factory=dict, description=(
        "variables set in the chat template, e.g. {enable_thinking: false}"))
    device: str = Field("cpu", description="hf: torch device")
    max_batch: int = Field(8, ge=1, description="hf, vllm: requests decoded together")
    threads: int = Field(1, ge=1, description="hf: torch intra-op threads (1 is fastest on a busy 2-core machine)")
    base_url: str | None = Field(None, description="openai: server URL, e.g. http://127.0.0.1:8000/v1")
    api: Literal["completions", "chat"] = Field("completions", description="openai: completions takes token ids "
                                                "(exact tokens); chat is for servers without it")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the API key")
    server_model: str | None = Field(None, description="openai: the model name the server knows (default: model)")
    vllm_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="vllm: weights and activations; float32 keeps logprobs within ~3e-5 of the fp32 "
                               "trainer's, bfloat16 is ~1.6x faster but up to ~0.3 nats off")
    vllm_kv_cache_gb: float = Field(1.0, gt=0, description="vllm: KV cache size in GiB (on CPU it is taken from RAM)")
    vllm_args: list[str] = Field(default_factory=list, description="vllm: extra `vllm serve` arguments, e.g. "
                                                                   "['--max-model-len', '4096']")
    vllm_cpu_cores: Annotated[int, Field(ge=1, strict=True)] | Literal["all", "vllm"] = Field("all", description=(
        "vllm on CPU: the cores the model runs on. all (or N): the worker's OpenMP threads bound one to each of "
        "this process's cores (or the first N), none reserved (1.5x the throughput of vLLM's layout on 2 cores); "
        "vllm: vLLM's own layout (the worker on all cores but one, the other reserved for its scheduler process). "
        "Parallelism or an executor in vllm_args, or VLLM_CPU_OMP_THREADS_BIND set, keep vLLM's layout"))
    vllm_start_timeout_s: float = Field(300.0, gt=0, description="vllm: seconds to wait for the server's /health")
    sync_bucket_mb: float = Field(256.0, gt=0, description=(
        "vllm: a weight push moves this many MB at a time (gathered shard by shard, through one reused /dev/shm "
        "segment on CPU or NCCL on CUDA); the push's memory beyond the model is about one bucket"))


def resolved_engine(config: InferenceConfig, *, next_token_logprobs: bool = False) -> str:
    """The engine `config` names; for auto, the fastest one that serves it here. `next_token_logprobs`: the caller
    scores candidates by their next-token logprobs (the verifier), which vllm's engine does not give."""
    if config.engine != "auto":
        return config.engine
    if config.base_url:
        return "openai"
    if next_token_logprobs or config.model in RANDOM_MODELS or importlib.util.find_spec("vllm") is None:
        return "hf"
    return "vllm"


def turn_token_budget(model: str) -> int:
    """The most tokens one agent turn samples on `model` unless agent.sampling.max_new_tokens says otherwise."""
    return TURN_TOKENS.get(model, DEFAULT_TURN_TOKENS)
