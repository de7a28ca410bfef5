"""Inference stage: engines that take prompt token ids and return the exact sampled ids with their logprobs."""

import importlib

from patchgym.inference.base import Engine, Generation, SamplingParams

# Imported on first use: the openai client alone takes half a second to import.
_LAZY = {"OpenAIEngine": "patchgym.inference.openai_engine", "serve": "patchgym.inference.server"}

__all__ = ["Engine", "Generation", "OpenAIEngine", "SamplingParams", "serve"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
