"""The policy being trained, behind the few calls the Trainer makes: build it (from the model spec or a checkpoint),
restore its optimizer state, warm-start it with SFT, take K optimizer steps, push its weights into the engine, and
save a checkpoint.

`Policy` states those calls. `LocalPolicy` trains in this process (under torchrun every rank holds one: a full copy,
or its FSDP2 shards with train.fsdp). With cluster.backend=ray the Trainer holds a
`patchgym.train.ray_trainer.RayPolicy` instead, the same calls over a TrainerWorker actor (which is a LocalPolicy in a
process of its own), so the loop reads the same either way.
"""

import contextlib
from pathlib import Path
from typing import Protocol

import torch

from patchgym.config import Config
from patchgym.rl.config import AlgorithmConfig
from patchgym.train.async_rollouts import PolicyVersions
from patchgym.train.batch import TrainSequence
from patchgym.train.checkpoint import load_training_state
from patchgym.train.distributed import Distributed, prepare_policy, prepare_reference, save_run_checkpoint
from patchgym.train.prepare import gathered_weights
from patchgym.train.sequence_parallel import enable
from patchgym.train.sft import EpochPlan, SFTResult, run_sft
from patchgym.train.update import is_sharded, make_optimizer, make_scheduler, policy_update


class Policy(Protocol):
    """The model being trained, as the Trainer drives it (patchgym.train.loop)."""

    def restore(self, checkpoint: Path) -> dict:
        """Optimizer, scheduler and random states from `checkpoint`; its loop state."""

    def update(self, sequences: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        """K = train.mini_batches optimizer steps on `sequences`; their metrics."""

    def warm_start(self, plan: EpochPlan, lr: float, progress: bool = False) -> SFTResult:
        """SFT on `plan` with an optimizer of its own, before RL."""

    def lr(self) -> float:
        """The learning rate of the next optimizer step."""

    def sync(self, engine, versions: PolicyVersions | None = None) -> None:
        """Push the weights into the inference `engine` (through `versions`' swap when given)."""

    def save(self, run_dir: Path, iteration: int, state: dict, keep: int) -> Path | None:
        """RUN/checkpoints/iter-N with the loop's `state`, keeping the last `keep`; its path (None on ranks > 0)."""

    def close(self) -> None:
        """Free what it holds beyond this process's memory (a worker actor)."""


class LocalPolicy:
    """The model (a copy separate from the engine's), its optimizer and LR schedule, and the reference model when
    the algorithm's KL needs one (sharded like the policy; with LoRA the policy's own base); from `checkpoint`'s
    weights when given (restore() then loads the rest)."""

    def __init__(self, config: Config, place: Distributed, checkpoint: Path | None = None):
        train, spec = config.train, config.inference.model
        self.train, self.place = train, place
        # the update's logprobs are of the distribution the rollouts sampled (greedy, T = 0, has none: taken as 1)
        self.temperature = config.agent.sampling.temperature or 1.0
        self.warm_dtype = train.warm_start.dtype if train.warm_start is not None else "fp32"
        self.model, self.tokenizer = prepare_policy(spec, place.device, train, place, checkpoint)
        self.optimizer = make_optimizer(self.model, train.lr, train.weight_decay, train.betas)
        self.scheduler = make_scheduler(self.optimizer, train.warmup_steps, train.iterations * train.mini_batches,
                                        train.lr_schedule)
        kl = config.algorithm.kl_coef > 0
        self.ref_model = prepare_reference(spec, place.device, train, place, self.model) if kl else None
        if self.ref_model is not None and place.sp > 1:
            enable(self.ref_model, place.sp_group)  # its logprobs are cut over the SP group too

    def restore(self, checkpoint: Path) -> dict:
        """Optimizer, scheduler and random states from `checkpoint`; its loop state."""
        return load_training_state(checkpoint, self.optimizer, self.scheduler, model=self.model)

    def update(self, sequences: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        """K = train.mini_batches optimizer steps on `sequences` (this rank's shard under torchrun); its metrics."""
        with self._threads(), self._autocast():
            return policy_update(self.model, self.optimizer, sequences, algo,
                                 micro_token_budget=self.train.micro_token_budget,
                                 mini_batches=self.train.mini_batches, max_grad_norm=self.train.max_grad_norm,
                                 scheduler=self.scheduler, process_group=self.place.data_group,
                                 ref_model=self.ref_model, packing=self.train.packing, temperature=self.temperature)

    def warm_start(self, plan: EpochPlan, lr: float, progress: bool = False) -> SFTResult:
        """SFT on `plan` (this rank's share of each step) with an AdamW of its own, so that RL's optimizer and LR
        schedule start fresh after it; `progress`: a bar of its steps (on rank 0)."""
        train = self.train
        optimizer = make_optimizer(self.model, lr, train.weight_decay, train.betas)
        scheduler = make_scheduler(optimizer, train.warmup_steps, sum(len(steps) for steps in plan), train.lr_schedule)
        with self._threads(), self._autocast(self.warm_dtype):
            return run_sft(self.model, optimizer, scheduler, plan, micro_token_budget=train.micro_token_budget,
                           max_grad_norm=train.max_grad_norm, process_group=self.place.group, packing=train.packing,
                           progress="warm start" if progress and self.place.main else None)

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def sync(self, engine, versions: PolicyVersions | None = None) -> None:
        """Push the weights into `engine` (rank 0's; the other ranks pass None and only help gather the shards),
        through `versions`' swap when given: it waits for the generations in flight, each runs on one version.
        The weights go one tensor at a time (gathered_weights), never as a whole state dict on one rank."""
        weights = gathered_weights(self.model)
        if not self.place.main:
            if is_sharded(self.model):
                for _ in weights:  # rank 0's push takes the same tensors in the same order: each is a gather
                    pass
            return
        if versions is None:
            engine.load_weights(weights)
        else:
            versions.swap(lambda: engine.load_weights(weights))

    def save(self, run_dir: Path, iteration: int, state: dict, keep: int, *, rng: dict | None = None) -> Path | None:
        """RUN/checkpoints/iter-N (checkpoint.save_checkpoint's layout), written by rank 0; its path there."""
        return save_run_checkpoint(self.place, Path(run_dir), iteration, self.model, self.tokenizer, self.optimizer,
                                   self.scheduler, state=state, keep=keep, rng=rng)

    def close(self) -> None:
        pass  # nothing held beyond this process's memory

    @contextlib.contextmanager
    def _threads(self):
        """train.threads intra-op threads for the duration, then the previous count (the engine's, if in-process)."""
        before = torch.get_num_threads()
        if self.train.threads is not None:
            torch.set_num_threads(self.train.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _autocast(self, dtype: str = "fp32"):
        """bf16 autocast for the update with train.bf16 (CUDA), or for a warm start whose dtype is bf16 (any
        device: this CPU's AVX512-BF16 too); fp32 otherwise."""
        if self.train.bf16:
            return bf16_autocast("cuda")
        if dtype == "bf16":
            return bf16_autocast(torch.device(self.place.device).type)
        return contextlib.nullcontext()


def bf16_autocast(device_type: str):
    """bf16 autocast around fp32 master weights, for a region that also takes optimizer steps. Its cast cache is
    off: autocast keeps the bf16 copy of each weight it casts until the region exits, so with the cache on every
    forward after the first optimizer step would still compute with the weights from before it (the loss would not
    move while AdamW pushed the weights on along the first gradients)."""
    return torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False)
