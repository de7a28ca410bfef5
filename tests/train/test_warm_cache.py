"""train.warm_start.cache in the fast tier: a warm start is trained once per key (model, demonstration tokens, SFT
settings) and every later run that asks for the same starts from its model, with its metrics line marked cached;
any change of what it depends on trains anew."""

import dataclasses
import json
import shutil

import pytest
import torch

from patchgym.train.checkpoint import list_checkpoints
from patchgym.train.loop import Trainer
from patchgym.train.metrics_schema import read_metrics
from patchgym.train.policy import LocalPolicy
from patchgym.train.sft import read_demonstrations
from patchgym.train.warm_cache import find_warm_start, key_of, model_fingerprint, warm_start_fields
from tests.train.test_train_warm_start import config, demos, memory_rollouts, weights  # noqa: F401

torch.set_num_threads(1)


def fields(cfg, demos_path, world=1):
    return warm_start_fields(cfg, read_demonstrations(demos_path).sequences, world)


def test_the_key_follows_what_the_warm_start_depends_on_and_nothing_else(tiny, demos, tmp_path):
    cfg = config(tmp_path, demos)
    key = key_of(fields(cfg, demos))
    assert key == key_of(fields(config(tmp_path, demos), demos))
    moved = tmp_path / "elsewhere"
    shutil.copytree(demos, moved)  # the same demonstrations under another path: the same tokens
    assert key == key_of(fields(config(tmp_path, moved), moved))
    assert key == key_of(fields(config(tmp_path, demos, "train.iterations=7", "train.lr=0.5"), demos))  # RL only
    changed = [config(tmp_path, demos, "train.warm_start.lr=0.02"), config(tmp_path, demos, "train.sft_batch_size=1"),
               config(tmp_path, demos, "train.warm_start.epochs=3"), config(tmp_path, demos, "seed=1"),
               config(tmp_path, demos, "train.warm_start.dtype=bf16"),
               config(tmp_path, demos, "inference.model=tiny-qwen3")]
    keys = {key_of(fields(c, demos)) for c in changed}
    assert len(keys) == len(changed) and key not in keys
    assert key != key_of(fields(cfg, demos, world=2))
    sequences = read_demonstrations(demos).sequences
    edited = [dataclasses.replace(sequences[0], input_ids=[*sequences[0].input_ids[:-1], 7]), *sequences[1:]]
    assert key != key_of(warm_start_fields(cfg, edited, 1))


def test_a_model_directory_is_fingerprinted_by_its_files(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 20000)  # over 2 MiB: sampled at both ends
    first = model_fingerprint(str(model))
    assert first.startswith("dir:") and first == model_fingerprint(str(model))
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 19999 + bytes(reversed(range(256))))
    assert model_fingerprint(str(model)) != first
    assert model_fingerprint("smollm2") == "smollm2"


def test_a_second_run_reuses_the_warm_start_and_a_changed_setting_trains_it_again(tiny, demos, tmp_path, monkeypatch):
    cfg = config(tmp_path, demos, "train.iterations=1")
    Trainer(cfg, tmp_path / "first", progress=False, make_rollouts=memory_rollouts).run()
    trained = read_metrics(tmp_path / "first")[0]["warm_start"]
    assert "cached" not in trained
    key = key_of(fields(cfg, demos))
    hit = find_warm_start(key)
    assert hit is not None and (hit.path / "model" / "config.json").exists()

    def no_sft(*args, **kwargs):
        raise AssertionError("the warm start ran again")

    with monkeypatch.context() as patched:
        patched.setattr(LocalPolicy, "warm_start", no_sft)
        Trainer(cfg, tmp_path / "second", progress=False, make_rollouts=memory_rollouts).run()
    reused = read_metrics(tmp_path / "second")
    assert [m["iteration"] for m in reused] == [0, 1]
    assert reused[0]["warm_start"] == {**trained, "cached": key}
    first, second = (list_checkpoints(tmp_path / run)[0] for run in ("first", "second"))
    assert first.name == second.name == "iter-0"
    a, b = weights(first), weights(second)
    assert all(torch.equal(a[k], b[k]) for k in a)

    calls = []
    monkeypatch.setattr(LocalPolicy, "warm_start", lambda self, *a, **k: calls.append(1) or no_sft())
    for name, extra in (("other-lr", "train.warm_start.lr=0.02"), ("uncached", "train.warm_start.cache=false")):
        with pytest.raises(AssertionError, match="ran again"):
            Trainer(config(tmp_path, demos, "train.iterations=1", extra), tmp_path / name, progress=False,
                    make_rollouts=memory_rollouts).run()
    assert len(calls) == 2


def test_ensure_warm_start_makes_the_entry_a_trainer_then_reuses(tiny, demos, tmp_path, monkeypatch):
    from patchgym.train.warm_cache import ensure_warm_start

    cfg = config(tmp_path, demos, "train.iterations=1")
    made = ensure_warm_start(cfg)
    assert made.key == key_of(fields(cfg, demos)) and made.line["warm_start"]["optimizer_steps"] == 2
    assert ensure_warm_start(cfg) == made  # found, not trained again
    uncached = config(tmp_path, demos, "train.iterations=1", "train.warm_start.cache=false")
    Trainer(uncached, tmp_path / "trained", progress=False, make_rollouts=memory_rollouts).run()
    a, b = weights(made.path), weights(list_checkpoints(tmp_path / "trained")[0])
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same warm start as the Trainer's own
    monkeypatch.setattr(LocalPolicy, "warm_start", lambda *a, **k: pytest.fail("the warm start ran again"))
    Trainer(cfg, tmp_path / "run", progress=False, make_rollouts=memory_rollouts).run()
    assert read_metrics(tmp_path / "run")[0]["warm_start"]["cached"] == made.key
    # loaded from the run's own directory (what other ranks and nodes see), not from this machine's store
    linked = tmp_path / "run" / "warm-start"
    assert (linked / "model" / "config.json").exists() and json.loads((linked / "line.json").read_text()) == made.line
    c = weights(list_checkpoints(tmp_path / "run")[0])
    assert all(torch.equal(a[k], c[k]) for k in a)
