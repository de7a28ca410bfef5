"""The `inference:` section of a patchgym config: which engine serves the policy, and on what."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ENGINES = ("hf", "openai", "vllm")


class InferenceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["hf", "openai", "vllm"] = Field("hf", description="hf (transformers in this process), openai (any "
                                                    "OpenAI-compatible server) or vllm (a vLLM server this process "
                                                    "starts and pushes weights into; pip install '.[vllm]')")
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
        "vllm on CPU: the cores the model runs on. all (or N): the worker runs inside vLLM's engine process, one "
        "OpenMP thread bound to each of this process's cores (or the first N), none reserved, so no scheduler "
        "process spins beside it (1.5x the throughput of vLLM's layout on 2 cores); vllm: vLLM's own layout (a "
        "worker process on all cores but one, the other reserved for its scheduler). Parallelism or an executor "
        "in vllm_args, or VLLM_CPU_OMP_THREADS_BIND set, keep vLLM's layout"))
    vllm_start_timeout_s: float = Field(300.0, gt=0, description="vllm: seconds to wait for the server's /health")
    sync_bucket_mb: float = Field(256.0, gt=0, description=(
        "vllm: a weight push moves this many MB at a time (gathered shard by shard, through one reused /dev/shm "
        "segment on CPU or NCCL on CUDA); the push's memory beyond the model is about one bucket"))
