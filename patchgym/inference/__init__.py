"""Inference stage: engines that take prompt token ids and return the exact sampled ids with their logprobs."""

from patchgym.inference.base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams"]
