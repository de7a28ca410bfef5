"""Build the engine an `inference:` config names."""

import os

import torch

from patchgym.inference.config import InferenceConfig


def make_engine(config: InferenceConfig):
    """An Engine for `config`: hf loads the model here; openai connects to `base_url` and loads only a tokenizer;
    vllm starts a vLLM server (a subprocess) on the model."""
    if config.engine == "hf":
        from patchgym.inference.hf import HFEngine

        torch.set_num_threads(config.threads)
        return HFEngine.from_spec(config.model, device=config.device, max_batch=config.max_batch)
    if config.engine == "openai":
        from patchgym.inference.models import load_tokenizer
        from patchgym.inference.openai_engine import OpenAIEngine

        if not config.base_url:
            raise ValueError("inference.engine=openai needs inference.base_url (e.g. http://127.0.0.1:8000/v1)")
        return OpenAIEngine(config.base_url, config.server_model or config.model, load_tokenizer(config.model),
                            api_key=os.environ.get(config.api_key_env) or "EMPTY", api=config.api)
    if config.engine == "vllm":
        from patchgym.inference.vllm_engine import VLLMEngine

        return VLLMEngine.from_config(config)
    raise ValueError(f"unknown engine {config.engine!r}")
