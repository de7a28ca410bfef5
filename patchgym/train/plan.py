"""`patchgym plan`: the memory one device needs to train (and serve) the configured model, from its config.json alone.

Training, per device, FSDP2-sharded over N ranks when train.fsdp (else a full replica on each):
- parameters: P x 4 / N (the sharded fp32 master weights; train.param_dtype bf16 only changes the dtype each
  layer's *gathered* parameters compute in), plus FSDP's working set: the root module (embeddings, final norm,
  head; kept gathered through the forward) and two decoder layers (current + prefetched) in the compute dtype, and
  one layer's unsharded gradients before its reduce-scatter (train.reduce_dtype);
- gradients: T x 4 / N and AdamW's m and v: 2 x T x 4 / N (T = trainable parameters: P, or LoRA's adapters);
  train.offload=params moves parameters, gradients and AdamW states to CPU memory (FSDP2 CPUOffloadPolicy);
- activations: what autograd keeps for the backward pass of one micro-batch of S tokens (train.micro_token_budget,
  or agent.max_context_tokens when longer: a longer sequence goes alone), divided by train.sequence_parallel.

The per-layer formula counts, per token, the tensors a Hugging Face Llama/Qwen2/Qwen3 decoder layer saves, under a
flash/memory-efficient attention that keeps no S x S scores (the accounting of Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", Sec. 4, without its 5as/h attention-score term and with the
SwiGLU MLP and grouped KV heads of these models):
    A_layer = 6h + 4(a d) + 4(k d) + 4f   elements per token,
each RMSNorm keeping its input, normalised and scaled outputs (2 x 3h), RoPE q and k with their rotations
(2ad + 2kd), attention its rotated q, k, v and the output o_proj reads (2ad + 2kd), and the MLP gate, SiLU(gate),
up and their product (4f); Qwen3's q/k RMSNorms add 3(ad + kd). With gradient checkpointing a layer keeps only its
input (h per token) and one layer's activations are recomputed at a time. Outside the layers: the embedding output
and final norm (4h), and the vocabulary projection of the sampled tokens (patchgym.train.logprobs): their fp32
logits, S x V x 4 bytes, capped at one chunk of LOGIT_CHUNK_ELEMENTS (above it chunks are recomputed in backward).
Every token is counted as a sampled one: an upper bound. Not counted: the block-diagonal mask that attention without
varlen kernels keeps for packed rows (sdpa or eager, as on CPU), 4 S^2 bytes per micro-batch. Measured against this
on CPU (within 10% for the shapes there): tests/train/test_train_plan.py.

Inference (vLLM), per device with tensor parallelism TP (vllm_args --tensor-parallel-size): weights P x bytes / TP
and the KV cache of inference.max_batch sequences at agent.max_context_tokens, L x k x d x 2 (K and V) x bytes per
token / TP; it fits when both are within vLLM's --gpu-memory-utilization (0.9) share of the device. The trainer and
the engine are taken to hold the device at different times (the engine asleep during the update) or to run on
devices of their own; `colocated` says whether both fit at once.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from patchgym.config import Config
from patchgym.errors import UserError
from patchgym.files import read_json_object
from patchgym.inference.config import resolved_engine
from patchgym.train.logprobs import LOGIT_CHUNK_ELEMENTS

GB = 1e9
BYTES = {"fp32": 4, "bf16": 2, "float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(UserError):
    """A model shape or plan option that cannot be read; the message names the file or option."""


@dataclass(frozen=True)
class Shape:
    """What the memory depends on, read off a model's config.json."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: int  # P, exact: the model built on the meta device
    layer_params: int  # one decoder layer's
    root_params: int  # outside the layers: embeddings, final norm, head
    lora_params: int  # T under train.lora (0 without)

    def layer_activations(self) -> int:
        """A_layer: elements one decoder layer saves per token (module docstring)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        qk_norms = 3 * (q + kv) if self.model_type == "qwen3" else 0
        return 6 * self.hidden + 4 * q + 4 * kv + 4 * self.intermediate + qk_norms


@dataclass
class Plan:
    """Bytes per device (GB = 1e9 in the printout) of each part, and what was assumed."""

    model: str
    gpus: int
    gpu_gb: float
    tokens_per_micro_batch: int
    param_dtype: str
    offload: str
    gradient_checkpointing: bool
    sequence_parallel: int
    parameters: float
    fsdp_working_set: float
    gradients: float
    optimizer_states: float
    activations: float
    activations_without_checkpointing: float
    activations_with_checkpointing: float
    cpu_offloaded: float
    train_total: float
    engine_weights: float
    engine_kv_cache: float
    engine_total: float
    engine_budget: float
    fits_training: bool
    fits_engine: bool
    colocated: bool

    def as_json(self) -> str:
        return json.dumps(asdict(self))

    def rows(self) -> list[tuple[str, float]]:
        """(what, bytes per device) in the order the table prints them."""
        checkpointing = "with" if self.gradient_checkpointing else "without"
        return [("parameters (fp32 shards)", self.parameters), ("FSDP working set", self.fsdp_working_set),
                ("gradients", self.gradients), ("AdamW m and v", self.optimizer_states),
                (f"activations ({checkpointing} checkpointing)", self.activations),
                ("  without checkpointing", self.activations_without_checkpointing),
                ("  with checkpointing", self.activations_with_checkpointing),
                ("training total", self.train_total), ("offloaded to CPU memory", self.cpu_offloaded),
                ("engine weights", self.engine_weights), ("engine KV cache", self.engine_kv_cache),
                ("engine total", self.engine_total)]


def read_shape(raw: dict, source: str, lora: dict | None = None) -> Shape:
    """The Shape of the model a config.json's contents describe (`source`: where they came from, for errors),
    counting its parameters on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if "model_type" not in raw:
        raise PlanError(f"model config '{source}' has no model_type (a transformers config.json names one)")
    try:
        config = AutoConfig.for_model(**raw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"model config '{source}' does not describe a causal LM transformers knows: {exc}") from None
    hidden, heads = config.hidden_size, config.num_attention_heads
    layers = model.get_decoder().layers
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    params, layer_params = count(model), count(layers[0])
    return Shape(model_type=config.model_type, hidden=hidden, layers=config.num_hidden_layers, heads=heads,
                 kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                 head_dim=getattr(config, "head_dim", None) or hidden // heads,
                 intermediate=config.intermediate_size, vocab=config.vocab_size, params=params,
                 layer_params=layer_params, root_params=params - layer_params * len(layers),
                 lora_params=_lora_params(model, lora) if lora else 0)


def model_config(config: Config, path: str | Path | None = None) -> tuple[dict, str]:
    """(config.json contents, where from) of `path`, else of the configured policy (inference.model): a model
    directory's file, or a built-in model's config (the tiny ones have no directory)."""
    spec = config.inference.model
    if path is None and spec in ("tiny", "tiny-qwen3"):
        from patchgym.inference.models import TINY
        return TINY[spec]()[0].config.to_dict(), spec
    if path is None and spec == "smollm2":
        from patchgym.inference.models import smollm2_dir
        path = smollm2_dir() / "config.json"
    if path is None:
        if not Path(spec).is_dir():
            raise PlanError(f"inference.model '{spec}' is not a model directory here; pass its config.json with "
                            f"--model-config (plan reads shapes, never weights)")
        path = Path(spec) / "config.json"
    return read_json_object(path, "model config", PlanError), str(path)


def plan(config: Config, shape: Shape, gpus: int, gpu_gb: float, model: str = "") -> Plan:
    """The memory per device of training `shape` as `config` says, on `gpus` devices of `gpu_gb` GB each."""
    if gpus < 1 or gpu_gb <= 0:
        raise PlanError(f"--gpus must be >= 1 and --gpu-gb > 0, got {gpus} and {gpu_gb}")
    train, agent = config.train, config.agent
    param_dtype = getattr(train, "param_dtype", "fp32")
    reduce_dtype = getattr(train, "reduce_dtype", "fp32")
    offload = getattr(train, "offload", "none")
    sp = int(getattr(train, "sequence_parallel", 1))
    compute = BYTES["bf16" if train.bf16 else param_dtype]
    shards = gpus if train.fsdp else 1
    trainable = shape.lora_params if train.lora else shape.params

    parameters = shape.params * 4 / shards
    gradients = trainable * 4 / shards
    optimizer = 2 * trainable * 4 / shards
    working = 0.0
    if shards > 1:
        working = (shape.root_params + 2 * shape.layer_params) * compute + shape.layer_params * BYTES[reduce_dtype]
    offloaded = 0.0
    if offload == "params":
        offloaded, parameters, gradients, optimizer = parameters + gradients + optimizer, 0.0, 0.0, 0.0

    tokens = max(train.micro_token_budget, agent.max_context_tokens)
    full, checkpointed = (activation_bytes(shape, tokens, compute, ckpt) / sp for ckpt in (False, True))
    activations = checkpointed if train.gradient_checkpointing else full
    train_total = parameters + working + gradients + optimizer + activations

    inference = config.inference
    tp = _vllm_arg(inference.vllm_args, "--tensor-parallel-size", 1)
    utilization = _vllm_arg(inference.vllm_args, "--gpu-memory-utilization", 0.9)
    engine_bytes = BYTES[inference.vllm_dtype] if resolved_engine(inference) == "vllm" else compute
    engine_weights = shape.params * engine_bytes / tp
    kv = kv_cache_bytes(shape, inference.max_batch * agent.max_context_tokens, engine_bytes) / tp
    budget = gpu_gb * GB
    return Plan(
        model=model, gpus=gpus, gpu_gb=gpu_gb, tokens_per_micro_batch=tokens, param_dtype=param_dtype,
        offload=offload, gradient_checkpointing=train.gradient_checkpointing, sequence_parallel=sp,
        parameters=parameters, fsdp_working_set=working, gradients=gradients, optimizer_states=optimizer,
        activations=activations, activations_without_checkpointing=full, activations_with_checkpointing=checkpointed,
        cpu_offloaded=offloaded, train_total=train_total, engine_weights=engine_weights, engine_kv_cache=kv,
        engine_total=engine_weights + kv, engine_budget=utilization * budget, fits_training=train_total <= budget,
        fits_engine=engine_weights + kv <= utilization * budget, colocated=train_total + engine_weights + kv <= budget)


def activation_bytes(shape: Shape, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
    """What one micro-batch of `tokens` keeps for backward (module docstring), in bytes."""
    per_layer = shape.layer_activations()
    layers = shape.layers * shape.hidden + per_layer if checkpointing else shape.layers * per_layer
    logit_rows = min(tokens, max(1, LOGIT_CHUNK_ELEMENTS // shape.vocab))
    return tokens * (layers + 4 * shape.hidden) * dtype_bytes + logit_rows * shape.vocab * 4


def kv_cache_bytes(shape: Shape, tokens: int, dtype_bytes: int) -> float:
    """layers x kv heads x head_dim x 2 (K and V) x bytes, per token."""
    return shape.layers * shape.kv_heads * shape.head_dim * 2 * dtype_bytes * tokens


def _lora_params(model, lora: dict) -> int:
    """r x (in + out) for every Linear the adapter targets ("all-linear": all but the output head; none named: q_proj
    and v_proj, peft's default for Llama and Qwen)."""
    from torch import nn

    rank, targets = int(lora.get("r", 8)), lora.get("target_modules") or ["q_proj", "v_proj"]
    head = model.get_output_embeddings()
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is head:
            continue
        if targets == "all-linear" or name.split(".")[-1] in ([targets] if isinstance(targets, str) else targets):
            total += rank * (module.in_features + module.out_features)
    return total


def _vllm_arg(args: list[str], flag: str, default: float) -> float:
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return float(arg.split("=", 1)[1])
        if arg == flag and i + 1 < len(args):
            return float(args[i + 1])
    return default
