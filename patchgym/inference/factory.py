"""Build the engine an `inference:` config names."""

import os

import torch

from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.config import InferenceConfig, resolved_engine


def make_engine(config: InferenceConfig, *, next_token_logprobs: bool = False):
    """An Engine for `config`: hf loads the model here; openai connects to `base_url` and loads only a tokenizer;
    vllm starts a vLLM server (a subprocess) on the model; auto picks one (inference.config.resolved_engine). Every
    engine's tokenizer carries the configured chat template (patchgym.inference.chat_template)."""
    name = resolved_engine(config, next_token_logprobs=next_token_logprobs)
    if name == "hf":
        from patchgym.inference.hf import HFEngine

        torch.set_num_threads(config.threads)
        engine = HFEngine.from_spec(config.model, device=config.device, max_batch=config.max_batch)
        configure_tokenizer(engine.tokenizer, config.chat_template, config.chat_template_kwargs)
        return engine
    if name == "openai":
        from patchgym.inference.models import load_tokenizer
        from patchgym.inference.openai_engine import OpenAIEngine

        if not config.base_url:
            raise ValueError("inference.engine=openai needs inference.base_url (e.g. http://127.0.0.1:8000/v1)")
        tokenizer = configure_tokenizer(load_tokenizer(config.model), config.chat_template,
                                        config.chat_template_kwargs)
        return OpenAIEngine(config.base_url, config.server_model or config.model, tokenizer,
                            api_key=os.environ.get(config.api_key_env) or "EMPTY", api=config.api,
                            chat_template_kwargs=config.chat_template_kwargs)
    if name == "vllm":
        from patchgym.inference.vllm_engine import VLLMEngine

        return VLLMEngine.from_config(config)
    raise ValueError(f"unknown engine {config.engine!r}")
