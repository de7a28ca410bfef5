"""Loading a model shard by shard from its safetensors, in one process (the whole tensor is rank 0's only shard):
built on the meta device, its weights and rebuilt rotary buffers give exactly from_pretrained's logprobs; a directory
that cannot be loaded so is named in the error. The two-rank path is tests/train/test_train_fsdp_loop.py's."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from patchgym.inference.models import ModelSpecError, weights_dir
from patchgym.train.logprobs import sequence_logprobs
from patchgym.train.sharded_load import ShardedLoadError, build_on_meta, load_shards


def test_meta_build_then_load_gives_from_pretrained_logprobs(tiny):
    directory = weights_dir("tiny-qwen3")
    model = build_on_meta(directory)
    assert all(p.is_meta for p in model.parameters()) and model.model.rotary_emb.inv_freq.is_meta
    load_shards(model, directory, "cpu")
    full = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert torch.equal(model.model.rotary_emb.inv_freq, full.model.rotary_emb.inv_freq)
    ids = torch.randint(0, 400, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(sequence_logprobs(model, ids, torch.ones_like(ids)),
                           sequence_logprobs(full, ids, torch.ones_like(ids)))


def test_a_directory_that_cannot_be_loaded_by_shards_is_named(tiny, tmp_path):
    with pytest.raises(ShardedLoadError, match=f"'{tmp_path}' has no config.json"):
        build_on_meta(tmp_path)
    model = build_on_meta(weights_dir("tiny-qwen3"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ShardedLoadError, match=f"'{tmp_path}' has no model.safetensors"):
        load_shards(model, tmp_path, "cpu")
    with pytest.raises(ModelSpecError, match="inference.model 'no-such-model'"):
        weights_dir("no-such-model")
