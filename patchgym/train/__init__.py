"""The training stage: batches from trajectories, the optimizer steps of RL and SFT, and a synthetic environment
that proves the whole path learns."""

from patchgym.train.batch import TrainSequence, collate, pack_micro_batches, sequences_from_trajectories
from patchgym.train.update import policy_update, sft_update

__all__ = ["TrainSequence", "collate", "pack_micro_batches", "policy_update", "sequences_from_trajectories",
           "sft_update"]
