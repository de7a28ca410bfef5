"""A sharded model without a full copy on any rank: build it on the meta device from its config.json, FSDP2-shard it,
then read into each rank's shard only the rows of the safetensors files it owns.

FSDP2 shards every parameter along dim 0 in torch.chunk's pieces (rank r holds rows [r*c, (r+1)*c) of
c = ceil(rows / world), the last ranks fewer or none), so a rank's shard is one contiguous slice of the tensor in the
file, read without touching the rest.
"""

import json
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from patchgym.errors import UserError


class ShardedLoadError(UserError, ValueError):
    """A model directory that cannot be loaded shard by shard (no config.json, a weight missing or misshapen)."""


def build_on_meta(directory: str | Path) -> nn.Module:
    """The causal LM of `directory`'s config.json with every parameter and buffer on the meta device (no memory)."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ShardedLoadError(f"model directory '{directory}' has no config.json: sharded loading (train.fsdp "
                               "under torchrun) builds the model from it")
    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()
    return model


def load_shards(model: nn.Module, directory: str | Path, device: str | torch.device,
                buffer_device: str | torch.device | None = None) -> nn.Module:
    """Allocate `model`'s (FSDP2-sharded, meta) parameters on `device` and fill each rank's shard from the
    safetensors of `directory`, in the parameters' dtype; rebuild the non-persistent buffers (rotary inv_freq) on
    `buffer_device` (default `device`; the compute device when the shards are offloaded to the CPU).

    The rows are read with plain file reads straight into the shard (through a buffer of the shard's size only when
    the file's dtype differs), not through a memory map, whose touched pages would count in the rank's memory."""
    directory = Path(directory)
    files = _weight_files(directory)
    sharded = any(hasattr(p, "device_mesh") for p in model.parameters())
    model.to_empty(device=device)
    if not sharded:  # to_empty gave each parameter its own tensor, tied ones too (FSDP2 holds a tied one once)
        model.tie_weights()
    headers: dict[str, tuple[int, dict]] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied weight once, under its first name
            if name not in files:
                raise ShardedLoadError(f"'{directory}' holds no weight '{name}' (it has e.g. {sorted(files)[:3]})")
            path = directory / files[name]
            if path.name not in headers:
                headers[path.name] = _read_header(path)
            data_start, header = headers[path.name]
            entry = header[name]
            if tuple(entry["shape"]) != tuple(param.shape):
                raise ShardedLoadError(f"'{directory}': weight '{name}' is {entry['shape']}, the config makes it "
                                       f"{list(param.shape)}")
            local = param.to_local() if hasattr(param, "to_local") else param
            if local.shape[0]:
                _read_rows(path, data_start + entry["data_offsets"][0], SAFETENSORS_DTYPES[entry["dtype"]],
                           _shard_start(param), local)
    rebuild_buffers(model, device if buffer_device is None else buffer_device)
    return model


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def _read_header(path: Path) -> tuple[int, dict]:
    """(where the tensor data of a safetensors file begins, its header: name -> dtype, shape, data_offsets)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return 8 + size, json.loads(f.read(size))


def _read_rows(path: Path, offset: int, dtype: torch.dtype, start: int, out: torch.Tensor) -> None:
    """Rows start .. start + len(out) of the row-major tensor at byte `offset` of `path`, into `out` (on any
    device, in any dtype)."""
    row = out[0].numel() * dtype.itemsize
    target = out if out.dtype == dtype and out.device.type == "cpu" and out.is_contiguous() else \
        torch.empty(out.shape, dtype=dtype)
    with open(path, "rb") as f:
        f.seek(offset + start * row)
        if f.readinto(memoryview(target.view(torch.uint8).numpy()).cast("B")) != target.numel() * dtype.itemsize:
            raise ShardedLoadError(f"'{path}' ends before the rows it lists")
    if target is not out:
        out.copy_(target)


def rebuild_buffers(model: nn.Module, device: str | torch.device) -> None:
    """The non-persistent buffers (in no file; to_empty left garbage in them), computed again by building each module
    that holds one anew from its config on `device`: for Llama and Qwen3 the rotary embedding's inv_freq."""
    for name, module in model.named_modules():
        if not module._non_persistent_buffers_set:
            continue
        if not hasattr(module, "config"):
            raise ShardedLoadError(f"module '{name}' ({type(module).__name__}) has non-persistent buffers but no "
                                   "config to build them from")
        with torch.device(device):
            fresh = type(module)(module.config)
        for buffer in module._non_persistent_buffers_set:
            setattr(module, buffer, getattr(fresh, buffer))


def _shard_start(param) -> int:
    """The first row of the file's tensor that this rank's shard of `param` holds (0 for a whole tensor)."""
    if not hasattr(param, "device_mesh"):
        return 0
    mesh = param.device_mesh
    rank, world = mesh.get_local_rank(), mesh.size()
    chunk = -(-param.shape[0] // world)
    return min(rank * chunk, param.shape[0])


def _weight_files(directory: Path) -> dict[str, str]:
    """{weight name: the safetensors file under `directory` holding it}, from the index of a split checkpoint."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    single = directory / "model.safetensors"
    if not single.is_file():
        raise ShardedLoadError(f"model directory '{directory}' has no model.safetensors (nor its index): sharded "
                               "loading reads safetensors only")
    return {name: single.name for name in _read_header(single)[1] if name != "__metadata__"}
