"""The training stage: batches from trajectories (`batch`), the optimizer steps of RL and SFT (`update`), the loop
(`loop.Trainer`), and a synthetic environment that proves the whole path learns.

The package's names below are imported when first used, so its torch-free modules (`metrics_schema`, `config`) load
without torch."""

import importlib

_EXPORTS = {"TrainSequence": "batch", "collate": "batch", "pack_micro_batches": "batch",
            "sequences_from_trajectories": "batch", "policy_update": "update", "sft_update": "update"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'patchgym.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"patchgym.train.{_EXPORTS[name]}"), name)
