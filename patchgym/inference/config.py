"""The `inference:` section of a patchgym config: which engine serves the policy, and on what."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ENGINES = ("hf", "openai")


class InferenceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["hf", "openai"] = Field("hf", description="hf (transformers in this process) or openai (any "
                                                              "OpenAI-compatible server)")
    model: str = Field("smollm2", description="smollm2 (offline default), tiny, a model directory, or a hub id")
    device: str = Field("cpu", description="hf: torch device")
    max_batch: int = Field(8, ge=1, description="hf: requests decoded together")
    threads: int = Field(1, ge=1, description="hf: torch intra-op threads (1 is fastest on a busy 2-core machine)")
    base_url: str | None = Field(None, description="openai: server URL, e.g. http://127.0.0.1:8000/v1")
    api: Literal["completions", "chat"] = Field("completions", description="openai: completions takes token ids "
                                                "(exact tokens); chat is for servers without it")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the API key")
    server_model: str | None = Field(None, description="openai: the model name the server knows (default: model)")
