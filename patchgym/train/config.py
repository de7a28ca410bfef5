"""The `train:` section of a patchgym config: what the trainer samples, how it optimises, and how often it saves.

The RL math itself is the `algorithm:` section (patchgym.rl.config.AlgorithmConfig); both sit in the top-level Config.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Logger = Literal["jsonl", "tensorboard", "wandb"]


class WarmStartConfig(BaseModel):
    """SFT on demonstrations before the first RL iteration (patchgym.train.sft, run by the Trainer)."""

    model_config = ConfigDict(extra="forbid")

    trajectories: str = Field(..., min_length=1, description=(
        "demonstrations: a trajectory .jsonl/.json file or a run directory (e.g. of `patchgym demos`); only "
        "resolved trajectories with sampled tokens are trained on"))
    epochs: int = Field(1, ge=1, description="passes over the demonstrations (train.sft_batch_size per step)")
    lr: float | None = Field(None, gt=0, description="peak SFT learning rate (AdamW); null = train.lr")
    dtype: Literal["fp32", "bf16"] = Field("fp32", description=(
        "the warm start's compute dtype: bf16 autocast (CPU or CUDA) around fp32 master weights, or fp32; the RL "
        "update keeps its own dtype, the one whose logprobs match the engine's. bf16 pays on a GPU or a CPU with "
        "native bf16 (AVX512-BF16, AMX); elsewhere the CPU emulates it"))
    cache: bool = Field(True, description=(
        "reuse the model of an identical warm start made before (same model, demonstration tokens and SFT "
        "settings), kept under the store's warm-starts/ ($PATCHGYM_WARM_STARTS); false = always train it"))


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: str | None = Field(None, description="tasks JSONL to train on (required by train)")
    iterations: int = Field(10, ge=1, description="RL iterations: rollouts, then one policy update each")
    tasks_per_iteration: int = Field(8, ge=1, description="tasks drawn per iteration (DAPO: groups kept per batch)")
    samples_per_task: int = Field(8, ge=2, description="G: rollouts per task; the group its advantages compare")
    shuffle_tasks: bool = Field(True, description="draw tasks in an order seeded by `seed` (reshuffled each pass "
                                                   "over the pool); false = file order")
    stage_iterations: list[int] = Field([], description=(
        "iterations of each algorithm.stages entry but the last, which runs until `iterations`"))
    lr: float = Field(1e-6, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (Nebius: 0.1)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warmup")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description=(
        "after warmup: constant, or decay to 0 by the last optimizer step (cosine or linear)"))
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping (global L2 norm)")
    mini_batches: int = Field(1, ge=1, description="K: optimizer steps per iteration, each on 1/K of the batch")
    micro_token_budget: int = Field(8192, ge=16, description=(
        "tokens per forward/backward pass (sequences are packed up to it; a longer one goes alone)"))
    packing: bool = Field(True, description=(
        "pack each micro-batch's sequences into one row with no padding (positions restart per sequence, attention "
        "kept inside each); false = padded rows, rows x longest <= micro_token_budget"))
    threads: int | None = Field(None, ge=1, description=(
        "torch intra-op threads while this process trains (warm start, update), restored after; null: leave them "
        "(OMP_NUM_THREADS). On CPU with a vLLM server, which is idle while the trainer trains, the trainer can "
        "take every core"))
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, "
                                                            "about 30% more time")
    fsdp: bool = Field(False, description="under torchrun (WORLD_SIZE > 1): FSDP2-shard the policy over the ranks; "
                                          "false = plain data parallelism, a full copy on each")
    param_dtype: Literal["fp32", "bf16"] = Field("fp32", description=(
        "with train.fsdp: the dtype each layer's gathered parameters compute in (FSDP2 MixedPrecisionPolicy); the "
        "sharded master weights and AdamW states stay fp32"))
    reduce_dtype: Literal["fp32", "bf16"] = Field("fp32", description=(
        "with train.fsdp: the dtype gradients are reduce-scattered in (FSDP2 MixedPrecisionPolicy)"))
    offload: Literal["none", "params", "optimizer"] = Field("none", description=(
        "with train.fsdp on CUDA: 'params' keeps the shards of parameters and gradients, hence the AdamW states and "
        "step, in CPU memory (FSDP2 CPUOffloadPolicy); 'optimizer' alone has no FSDP2 equivalent and is refused"))
    sequence_parallel: int = Field(1, ge=1, description=(
        "under torchrun: cut each sequence over this many ranks (Ulysses: all-to-all over attention heads); it must "
        "divide WORLD_SIZE and the model's attention and key/value heads; the batch is split over the other factor"))
    lora: dict | None = Field(None, description=(
        "peft LoraConfig keys (e.g. {r: 16, lora_alpha: 32, target_modules: all-linear}); null = full fine-tuning"))
    bf16: bool = Field(False, description="bfloat16 autocast for the update; needs a CUDA inference.device")
    checkpoint_every: int = Field(1, ge=1, description="save a checkpoint every N iterations (and after the last)")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk; older ones are deleted")
    sft_batch_size: int = Field(64, ge=1, description=(
        "sft/rft/warm start: trajectories per optimizer step (Nebius RFT: 64)"))
    warm_start: WarmStartConfig | None = Field(None, description=(
        "{trajectories: PATH, epochs: E}: SFT on demonstrations before the first RL iteration, checkpointed as "
        "iter-0; null = start RL from inference.model"))
    loggers: list[Logger] = Field(["jsonl", "tensorboard"], description=(
        "where metrics go: jsonl (RUN/metrics.jsonl, always), tensorboard (RUN/tensorboard/), wandb (Weights & "
        "Biases; WANDB_MODE=offline logs into RUN/wandb/ without a network)"))

    @field_validator("loggers")
    @classmethod
    def _jsonl_is_kept(cls, loggers: list[str]) -> list[str]:
        if "jsonl" not in loggers:
            raise ValueError("must include jsonl: metrics.jsonl is the run's record, which --resume and "
                             "`patchgym report` read (add tensorboard or wandb beside it)")
        return list(dict.fromkeys(loggers))
