"""Warm starts computed once: the model a warm start made, kept under a key of everything that made it (the model,
the demonstrations' trained tokens, the SFT settings), and reused by every later run that asks for the same.

An entry is a directory `<warm_starts_dir()>/<key>/` holding `model/` (and `adapter/` with LoRA), the layout of a
checkpoint that `prepare_policy` reads, plus `line.json` (the warm start's metrics line) and `key.json` (the fields
the key hashes, for a person to read). It is written into a temporary directory and renamed into place, so an entry
is always whole. Its files are hard links to the checkpoint's where the file system allows (no second copy).
"""

import hashlib
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patchgym.config import Config
from patchgym.paths import warm_starts_dir
from patchgym.train.batch import TrainSequence
from patchgym.train.checkpoint import save_checkpoint

FORMAT = 1  # bump when what an entry means changes, so older entries stop matching
SAMPLE_BYTES = 1 << 20  # a weight file is fingerprinted by its size and its first and last MiB


@dataclass(frozen=True)
class WarmStartHit:
    """A cached warm start: the directory to load the policy from and the metrics line it was made with."""

    key: str
    path: Path
    line: dict


def warm_start_fields(config: Config, sequences: list[TrainSequence], world: int) -> dict:
    """What a warm start's result depends on: the model, the trained tokens and masks, and the SFT settings
    (schedule, batching, numerics, how many ranks split each step). Timing text and paths do not count."""
    train, warm = config.train, config.train.warm_start
    return {
        "format": FORMAT,
        "model": model_fingerprint(config.inference.model),
        "device": str(config.inference.device).split(":")[0],
        "demonstrations": sequences_digest(sequences),
        "sft": {"epochs": warm.epochs, "lr": warm.lr or train.lr, "batch_size": train.sft_batch_size,
                "seed": config.seed, "weight_decay": train.weight_decay, "betas": list(train.betas),
                "warmup_steps": train.warmup_steps, "lr_schedule": train.lr_schedule,
                "max_grad_norm": train.max_grad_norm, "micro_token_budget": train.micro_token_budget,
                "packing": train.packing, "lora": train.lora, "bf16": train.bf16, "sft_dtype": warm.dtype,
                "fsdp": train.fsdp, "param_dtype": train.param_dtype, "reduce_dtype": train.reduce_dtype,
                "sequence_parallel": train.sequence_parallel, "world": world},
    }


def key_of(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def sequences_digest(sequences: list[TrainSequence]) -> str:
    """The SHA-256 of the token ids and loss masks, in order: what SFT reads of the demonstrations."""
    digest = hashlib.sha256()
    for s in sequences:
        digest.update(struct.pack(f"<I{len(s.input_ids)}q", len(s.input_ids), *s.input_ids))
        digest.update(bytes(s.loss_mask))
    return digest.hexdigest()


def model_fingerprint(spec: str) -> str:
    """A model directory's config and weight files (names, sizes, first and last MiB); a named spec (smollm2, the
    tiny models, a hub id) is its name: the same name loads the same weights."""
    path = Path(spec)
    if not path.is_dir():
        return spec
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path)}\0{size}\0".encode())
        with open(file, "rb") as handle:
            if size <= 2 * SAMPLE_BYTES:
                digest.update(handle.read())
            else:
                digest.update(handle.read(SAMPLE_BYTES))
                handle.seek(-SAMPLE_BYTES, os.SEEK_END)
                digest.update(handle.read())
    return f"dir:{digest.hexdigest()}"


def find_warm_start(key: str, root: Path | None = None) -> WarmStartHit | None:
    entry = (root or warm_starts_dir()) / key
    try:
        line = json.loads((entry / "line.json").read_text())
    except (OSError, ValueError):
        return None
    return WarmStartHit(key, entry, line)


def store_warm_start(key: str, fields: dict, checkpoint: Path, line: dict, root: Path | None = None) -> Path:
    """Keep `checkpoint`'s model (and adapter) under `key`; an entry already there is left as it is."""
    return _place((root or warm_starts_dir()) / key, checkpoint, {"key.json": json.dumps(fields, indent=1,
                                                                                          sort_keys=True),
                                                                  "line.json": json.dumps(line)})


def link_warm_start(hit: WarmStartHit, target: Path) -> WarmStartHit:
    """`hit` placed at `target` (hard links where the file system allows): a run loads its cached warm start from
    its own directory, which its other ranks and a Ray trainer worker on another node see too, and the store may
    be local to this machine."""
    _place(target, hit.path, {"line.json": json.dumps(hit.line)})
    return WarmStartHit(hit.key, target, hit.line)


def _place(entry: Path, source: Path, texts: dict[str, str]) -> Path:
    """`source`'s model/ (and adapter/) and the `texts` files written as `entry`, whole or not at all; an entry
    already there is left as it is."""
    if (entry / "line.json").exists():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = entry.parent / f".tmp-{entry.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for part in ("model", "adapter"):
        if (source / part).is_dir():
            shutil.copytree(source / part, staging / part, copy_function=_link_or_copy)
    for name, text in texts.items():
        (staging / name).write_text(text)
    shutil.rmtree(entry, ignore_errors=True)  # an entry cut short before its line.json (a crash mid-copy)
    try:
        os.rename(staging, entry)
    except OSError:  # another run placed the same entry first
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def ensure_warm_start(config: Config, progress: bool = False) -> WarmStartHit:
    """The cached warm start of `config` (train.warm_start), trained here in one process first if no run made it
    yet: for a benchmark that measures the warm model before RL, and whose runs then start from the same entry."""
    from patchgym.train.distributed import Distributed
    from patchgym.train.policy import LocalPolicy
    from patchgym.train.sft import rank_plans, read_demonstrations, warm_start_line

    warm = config.train.warm_start
    if warm is None:
        raise ValueError("train.warm_start is not set: there is no warm start to make")
    demonstrations = read_demonstrations(warm.trajectories)
    fields = warm_start_fields(config, demonstrations.sequences, world=1)
    key = key_of(fields)
    if (hit := find_warm_start(key)) is not None:
        return hit
    policy = LocalPolicy(config, Distributed.from_env(str(config.inference.device)))
    plan = rank_plans(demonstrations.sequences, config.train.sft_batch_size, warm.epochs, config.seed, 1)[0]
    lr = warm.lr or config.train.lr
    result = policy.warm_start(plan, lr, progress=progress)
    line = warm_start_line(demonstrations, warm.epochs, lr, result)
    with tempfile.TemporaryDirectory(dir=_made(warm_starts_dir())) as tmp:  # the checkpoint layout, then its model
        saved = save_checkpoint(tmp, 0, policy.model, policy.tokenizer, state={"warm_started": True})
        store_warm_start(key, fields, saved, line)
    hit = find_warm_start(key)
    if hit is None:
        raise OSError(f"the warm start could not be kept in {warm_starts_dir() / key} (train.warm_start.cache)")
    return hit


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
