"""Checkpoints in RUN/checkpoints/iter-N/: the model in Hugging Face format, optimizer and scheduler state, loop state.

Layout of one checkpoint:
  model/         save_pretrained + the tokenizer: `AutoModelForCausalLM.from_pretrained(.../model)` loads it
                 (with LoRA: the adapter merged into the base weights)
  adapter/       with LoRA only: the peft adapter, which resuming loads onto the base model
  optimizer.pt   {"optimizer": ..., "scheduler": ...} state dicts (a sharded run: "optimizer" None, see below)
  optimizer/     a sharded (FSDP2) run only: the optimizer state as a torch distributed checkpoint, each rank's
                 shards written by that rank and read back by it (or resharded to any world size, one process too)
  rng.pt         python, torch (and CUDA) random states
  state.json     the loop state (iteration, task order and cursor, stage, curriculum counts, ...)

A checkpoint is written into a temporary directory beside the others, fsync'd, and renamed into place, so an
`iter-N` directory is always whole: a crash leaves only a `.tmp-*` directory, which the next save removes.
"""

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from patchgym.train.prepare import full_state_dict

CHECKPOINT = re.compile(r"^iter-(\d+)$")
OPTIMIZER_SHARDS = "optimizer"  # the DCP directory of a sharded run's optimizer state


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, iteration: int, model, tokenizer, optimizer=None, scheduler=None, *,
                    state: dict[str, Any], keep: int = 2, model_state: dict | None = None,
                    optimizer_state: dict | None = None, rng: dict | None = None, staging: Path | None = None) -> Path:
    """Write RUN/checkpoints/iter-`iteration` atomically, then delete all but the newest `keep` checkpoints.

    `model_state` and `optimizer_state`, when given, are written instead of the model's and optimizer's own: the
    gathered states of a sharded (FSDP2) model, so that one process can load the checkpoint. `rng` entries replace
    this process's random states: those another process draws from (a Ray run's driver shuffles the batches, its
    TrainerWorker, which saves, holds the torch ones). `staging` is the staging_dir() that the ranks of a sharded run
    wrote its optimizer/ into, with `optimizer` None."""
    root = checkpoints_dir(run_dir)
    tmp = staging_dir(run_dir, iteration) if staging is None else staging
    _save_model(model, tokenizer, tmp, model_state)
    if optimizer_state is None and optimizer is not None and staging is None:
        optimizer_state = optimizer.state_dict()
    torch.save({"optimizer": optimizer_state,
                "scheduler": scheduler.state_dict() if scheduler is not None else None}, tmp / "optimizer.pt")
    torch.save({**_rng_state(), **(rng or {})}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"iteration": iteration, **state}, indent=1))
    _fsync_tree(tmp)
    final = root / f"iter-{iteration}"
    replaced = root / f".tmp-replaced-iter-{iteration}-{os.getpid()}"
    if final.exists():  # saved again (an sft rerun into the same directory): move the old one aside first
        os.rename(final, replaced)
    os.rename(tmp, final)
    _fsync_dir(root)
    shutil.rmtree(replaced, ignore_errors=True)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def staging_dir(run_dir: str | Path, iteration: int) -> Path:
    """A new empty directory where iter-`iteration` is written before its rename; those a crash left are removed."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-iter-{iteration}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def save_sharded_optimizer(model, optimizer, directory: Path) -> None:
    """Every rank writes its shards of the optimizer state (keyed by parameter name) into `directory` (DCP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=directory)


def load_sharded_optimizer(model, optimizer, directory: Path) -> None:
    """Read into `optimizer` its shards of a DCP optimizer state (any world size saved it; one process reads it
    whole); no rank gathers more than its own."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the shapes and shards to read into
    dcp.load(state, checkpoint_id=directory)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The whole checkpoints of a run, oldest first."""
    root = checkpoints_dir(run_dir)
    found = [(int(m.group(1)), p) for p in root.glob("iter-*") if (m := CHECKPOINT.match(p.name))
             and (p / "state.json").is_file()] if root.is_dir() else []
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(checkpoint: str | Path) -> dict[str, Any]:
    path = Path(checkpoint) / "state.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"checkpoint state '{path}' cannot be read: {exc}") from None


def load_training_state(checkpoint: str | Path, optimizer=None, scheduler=None, model=None) -> dict[str, Any]:
    """Restore optimizer, scheduler and random states from `checkpoint`; return its loop state. An optimizer state
    saved by a sharded run (gathered and keyed by parameter name, or shards in optimizer/) needs the `model`."""
    checkpoint = Path(checkpoint)
    if optimizer is not None or scheduler is not None:  # it can be as large as the model twice over
        saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=False)
        if optimizer is not None and saved["optimizer"] is not None:
            load_optimizer_state(model, optimizer, saved["optimizer"])
        elif optimizer is not None and (checkpoint / OPTIMIZER_SHARDS).is_dir():
            if model is None:
                raise ValueError(f"checkpoint '{checkpoint}' holds a sharded optimizer state: loading it needs the "
                                 "model")
            load_sharded_optimizer(model, optimizer, checkpoint / OPTIMIZER_SHARDS)
        if scheduler is not None and saved["scheduler"] is not None:
            scheduler.load_state_dict(saved["scheduler"])
    _set_rng_state(torch.load(checkpoint / "rng.pt", weights_only=False))
    return read_state(checkpoint)


def load_optimizer_state(model, optimizer, state: dict) -> None:
    """torch's own optimizer state (parameters by index), or a gathered one keyed by parameter name (from a sharded
    run: each rank then keeps its shard of it, or one process all of it)."""
    groups = state.get("param_groups", [])
    if not any(isinstance(p, str) for g in groups for p in g["params"]):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if model is None:
        raise ValueError("an optimizer state keyed by parameter name (from a sharded run) needs the model to load")
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def load_adapter(model, checkpoint: str | Path) -> None:
    """Put a checkpoint's LoRA adapter weights into a peft `model` built like the one that saved it."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(checkpoint) / "adapter" / "adapter_model.safetensors"
    if not path.is_file():
        raise ValueError(f"checkpoint '{checkpoint}' has no LoRA adapter ({path}), but train.lora is set")
    set_peft_model_state_dict(model, load_file(path))


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def _save_model(model, tokenizer, directory: Path, state: dict | None = None) -> None:
    if state is not None:
        model.save_pretrained(directory / "model", state_dict=state)
    elif is_peft(model):
        model.save_pretrained(directory / "adapter")
        base = model.get_base_model()
        base.save_pretrained(directory / "model", state_dict=full_state_dict(model))
    else:
        model.save_pretrained(directory / "model")
    tokenizer.save_pretrained(directory / "model")


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        else:
            _fsync_dir(path)
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
