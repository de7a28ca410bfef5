"""SFT on trajectories, as `patchgym sft` (rft.py) and the trainer's warm start (train.warm_start) both run it: the
sequences a trajectory trains (loss on sampled tokens, format-error turns masked), seeded batches per epoch, and the
epoch loop of `sft_update` steps. Demonstrations for a warm start are checked up front: a source without one
resolved, token-carrying trajectory is an error naming it.
"""

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from patchgym.agent.trajectory import Trajectory
from patchgym.agent.trajectory_files import read_trajectories
from patchgym.errors import UserError
from patchgym.train.batch import TrainSequence, sequences_from_trajectories
from patchgym.train.distributed import shard_sequences
from patchgym.train.progress import step_bar
from patchgym.train.update import sft_update

# epochs -> optimizer steps -> the step's sequences (one rank's share of them, under torchrun)
EpochPlan = list[list[list[TrainSequence]]]


class DemonstrationError(UserError, ValueError):
    """Demonstrations that hold nothing to fine-tune on; the message names the file."""


@dataclass
class Demonstrations:
    """What a warm start trains on, read from `source`."""

    source: str
    read: int  # trajectories in the source
    trajectories: int  # of them resolved with a sampled token to learn from
    sequences: list[TrainSequence]

    @property
    def tokens(self) -> int:
        return sum(s.policy_tokens for s in self.sequences)


@dataclass
class SFTResult:
    """Per-epoch token-mean NLL and policy tokens of an SFT run, its optimizer steps and seconds."""

    epoch_loss: list[float] = field(default_factory=list)
    epoch_tokens: list[int] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0


def sft_sequences(trajectories: Sequence[Trajectory]) -> list[TrainSequence]:
    """The sequences SFT trains on: every trajectory but infrastructure errors, loss on its sampled tokens with
    format-error turns masked (a trajectory left with none is dropped)."""
    usable = [t for t in trajectories if t.termination != "infra_error"]
    return sequences_from_trajectories(usable, [1.0] * len(usable), mask_format_errors=True)


def read_demonstrations(source: str | Path) -> Demonstrations:
    """The resolved, token-carrying trajectories of `source` (a trajectory file or run directory, read by
    patchgym.agent.trajectory_files); DemonstrationError naming it when there is none."""
    try:
        trajectories = read_trajectories(source)
    except UserError as exc:  # missing, or a line that is not a trajectory: named by the reader
        raise DemonstrationError(f"train.warm_start.trajectories: {exc}") from None
    kept = [sequences for t in trajectories if t.resolved and (sequences := sft_sequences([t]))]
    if not kept:
        unresolved = sum(not t.resolved for t in trajectories)
        raise DemonstrationError(
            f"train.warm_start.trajectories: '{source}' holds no usable demonstration: of its {len(trajectories)} "
            f"trajectories {unresolved} did not resolve their task and the rest have no sampled token to learn from "
            "(scripts such as --policy oracle record none; format-error turns are masked); record "
            "demonstrations with a model's tokenizer, e.g. `patchgym demos`")
    return Demonstrations(str(source), len(trajectories), len(kept), [s for sequences in kept for s in sequences])


def sft_batches(sequences: Sequence[TrainSequence], batch_size: int, epochs: int, seed: int) -> EpochPlan:
    """`epochs` passes over `sequences`, each in a fresh seeded order, cut into optimizer steps of `batch_size`."""
    rng = random.Random(seed)
    plan = []
    for _ in range(epochs):
        order = list(sequences)
        rng.shuffle(order)
        plan.append([order[i:i + batch_size] for i in range(0, len(order), batch_size)])
    return plan


def rank_plans(sequences: Sequence[TrainSequence], batch_size: int, epochs: int, seed: int,
               world: int) -> list[EpochPlan]:
    """sft_batches split over `world` ranks: one plan per rank, whose step k on every rank together is step k."""
    plan = sft_batches(sequences, batch_size, epochs, seed)
    shares = [[shard_sequences(step, 1, world) for step in steps] for steps in plan]
    return [[[step[rank] for step in steps] for steps in shares] for rank in range(world)]


def run_sft(model: torch.nn.Module, optimizer, scheduler, plan: EpochPlan, *, micro_token_budget: int,
            max_grad_norm: float | None, process_group=None, on_step=None, packing: bool = True,
            progress: str | None = None) -> SFTResult:
    """One `sft_update` per step of `plan`; under torchrun every rank passes its share of each step (the losses
    and token counts come back summed over the ranks). `on_step(epoch, step, update)` sees each step's metrics.
    `progress`: a label to show a progress bar of the steps under (with the last step's loss), or None."""
    began, result = time.perf_counter(), SFTResult()
    with step_bar(progress, sum(len(steps) for steps in plan)) as bar:
        for epoch, steps in enumerate(plan):
            loss = tokens = 0.0
            for step, batch in enumerate(steps):
                update = sft_update(model, optimizer, batch, micro_token_budget=micro_token_budget,
                                    max_grad_norm=max_grad_norm, scheduler=scheduler, process_group=process_group,
                                    packing=packing)
                loss += update["loss"] * update["tokens"]  # each step's loss is its token mean
                tokens += update["tokens"]
                result.steps += 1
                bar.update(bar.task_ids[0], advance=1, description=f"epoch {epoch + 1}/{len(plan)}, "
                           f"loss {update['loss']:.3f}")
                if on_step is not None:
                    on_step(epoch, step, update)
            result.epoch_loss.append(loss / max(tokens, 1))
            result.epoch_tokens.append(round(tokens))
    result.seconds = time.perf_counter() - began
    return result


def warm_start_line(demonstrations: Demonstrations, epochs: int, lr: float, result: SFTResult) -> dict:
    """The metrics.jsonl line of a warm start: iteration 0, its numbers under `warm_start`."""
    return {"iteration": 0, "warm_start": {
        "source": demonstrations.source, "epochs": epochs, "trajectories": demonstrations.trajectories,
        "trajectories_read": demonstrations.read, "tokens": demonstrations.tokens, "sft_loss": result.epoch_loss,
        "optimizer_steps": result.steps, "lr": lr, "time_training_s": result.seconds}}
