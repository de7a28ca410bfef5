"""Getting a model and its optimizer ready to train: AdamW, the LR schedule, gradient checkpointing, LoRA (peft),
FSDP2 sharding, and the full weights back out (for the inference engine and Hugging Face checkpoints)."""

import math
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from patchgym.inference.weight_push import untied

SCHEDULES = ("constant", "cosine", "linear")


def make_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; norms and biases (1-D tensors) get no weight decay, as is usual."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(betas))


def make_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                   kind: str = "constant") -> LambdaLR:
    """LR factor per optimizer step: linear warmup over `warmup_steps` (the first step at lr/warmup), then
    constant, or a cosine or linear decay that reaches 0 at `total_steps`."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress

    return LambdaLR(optimizer, factor)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in the backward pass instead of keeping its activations (non-reentrant)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def maybe_lora(model: nn.Module, lora_config: Mapping | None) -> nn.Module:
    """`model` itself when `lora_config` is None, else a peft LoRA model that trains only the adapters.

    `lora_config` holds peft.LoraConfig fields (r, lora_alpha, lora_dropout, target_modules, ...).
    """
    if lora_config is None:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("LoRA needs peft: pip install 'patchgym[lora]'") from exc
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **dict(lora_config)))


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def shard_model(model: nn.Module, mesh=None, *, param_dtype: str = "fp32", reduce_dtype: str = "fp32",
                offload: str = "none") -> nn.Module:
    """FSDP2: shard each decoder layer, then the rest, over `mesh` (default: all ranks of the default group).

    `param_dtype` is what a layer's gathered parameters compute in and `reduce_dtype` what its gradients are
    reduce-scattered in (MixedPrecisionPolicy; the shards themselves keep their dtype, fp32); offload "params" is
    CPUOffloadPolicy: the shards of parameters and gradients live in CPU memory, so AdamW's states and step do too.
    Gradients are summed over ranks, not averaged (the losses carry global denominators; see update.py).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if offload not in ("none", "params"):
        raise ValueError(f"offload {offload!r} has no FSDP2 policy; known: none, params")
    policies = {"mp_policy": MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype]),
                "offload_policy": CPUOffloadPolicy() if offload == "params" else OffloadPolicy()}
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh, **policies)
    fully_shard(model, mesh=mesh, **policies)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return model


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The weights under the base model's own names, LoRA merged in and FSDP shards gathered (every rank must
    call it when sharded): what `load_weights` of an engine and `save_pretrained` of the base model expect."""
    if hasattr(model, "merge_adapter"):  # peft
        model.merge_adapter()
        try:
            base = model.get_base_model()
            return {_base_name(name): _full(t).detach().clone() for name, t in base.state_dict().items()
                    if "lora_" not in name}
        finally:
            model.unmerge_adapter()
    return {name: _full(t).detach() for name, t in model.state_dict().items()}


def gathered_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """full_state_dict's (name, tensor) pairs one at a time, for a weight push: an FSDP2 parameter is gathered
    (`full_tensor`) only when it is taken, so no rank ever holds more than one whole tensor, and a tied tensor comes
    once. Every rank of a sharded model must iterate it to the end, in step (each gather is a collective)."""
    if hasattr(model, "merge_adapter"):  # peft
        model.merge_adapter()
        try:  # cloned: the merge is undone in place when the last pair has been taken
            for name, tensor in untied(model.get_base_model().state_dict()):
                if "lora_" not in name:
                    yield _base_name(name), _full(tensor).detach().clone()
        finally:
            model.unmerge_adapter()
    else:
        for name, tensor in untied(model.state_dict()):
            yield name, _full(tensor).detach()


def _base_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


def _full(tensor: Tensor) -> Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
