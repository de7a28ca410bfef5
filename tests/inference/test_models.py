"""The models behind the engine: SmolLM2 from its GGUF (offline once cached) and the tiny test model."""

import json
import os
import subprocess
import sys
import time

import pytest

from patchgym.inference.base import SamplingParams
from patchgym.inference.hf import HFEngine
from patchgym.inference.models import load_model, load_tokenizer, smollm2_dir


@pytest.fixture(scope="module")
def smollm2_cached():
    """SmolLM2's converted directory, made once (or the test is skipped when it cannot be fetched)."""
    try:
        return smollm2_dir()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"SmolLM2 is not cached and cannot be fetched: {exc}")


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_cached):
    """SmolLM2's tokenizer alone (no weights): the one load_model("smollm2") returns."""
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def smollm2(smollm2_cached):  # the one-time conversion is not what we time
    start = time.perf_counter()
    model, tokenizer = load_model("smollm2")
    assert time.perf_counter() - start < 30
    return model, tokenizer


def test_smollm2_cache_is_plain_safetensors_without_sampling_defaults():
    config = json.loads((smollm2_dir() / "config.json").read_text())
    generation = json.loads((smollm2_dir() / "generation_config.json").read_text())
    assert "quantization_config" not in config and config["max_position_embeddings"] == 8192
    assert not {"temperature", "top_p", "top_k", "do_sample"} & generation.keys()
    assert list(smollm2_dir().glob("*.safetensors"))


def test_smollm2_tokens_and_template(smollm2_tokenizer):
    """What the GGUF carries matches SmolLM2-Instruct's own tokenizer: ChatML ids and special tokens."""
    tok = smollm2_tokenizer
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert (tok.bos_token_id, tok.eos_token_id, tok.model_max_length) == (1, 2, 8192)
    assert tok("hi")["input_ids"] == [6004]  # no BOS is prepended
    assert tok("<file_sep>x")["input_ids"][0] == 5  # the 17 StarCoder-style special tokens stay single tokens
    assert tok.convert_ids_to_tokens(tok("x 2024")["input_ids"]) == ["x", "Ġ", "2", "0", "2", "4"]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_answers_and_tokens_round_trip_through_the_template(smollm2):
    model, tok = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    with HFEngine(model, tok) as engine:
        gen = engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=40))
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == tok.eos_token_id
    answer = tok.decode(gen.token_ids, skip_special_tokens=True)
    assert "Paris" in answer
    # Token-in/token-out: the template re-rendering of the conversation is the same ids (plus its newline).
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": answer}], return_dict=False)
    assert full == prompt + gen.token_ids + tok("\n")["input_ids"]


def test_smollm2_loads_with_the_network_off(smollm2_cached):
    """Once cached, loading needs no hub and no PyPI: run it in a process where both are switched off."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1", "HTTPS_PROXY": "http://127.0.0.1:9"}
    code = "from patchgym.inference.models import load_model; m, t = load_model('smollm2'); print(t.eos_token)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("<|im_end|>")


def test_tiny_model_is_tiny_and_reproducible():
    a, tok = load_model("tiny")
    b, _ = load_model("tiny")
    params = sum(p.numel() for p in a.parameters())
    assert params < 2_000_000 and a.config.vocab_size == len(tok) == 49152
    assert all((x == y).all() for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def stage(directory, weights: bool) -> None:
    """What save_pretrained leaves: the tokenizer always; config and weights only on the rank that writes them."""
    directory.mkdir(parents=True)
    (directory / "tokenizer.json").write_text("{}")
    if weights:
        (directory / "config.json").write_text("{}")
        (directory / "model.safetensors").write_bytes(b"weights")


def test_a_rank_that_staged_only_the_tokenizer_waits_for_the_model_and_never_publishes_it(tmp_path):
    """Under torch.distributed transformers saves a model's files on rank 0 only: another rank's staging has the
    tokenizer alone. Published, it left a model directory with no model (and rank 0 then failed to rename over it)."""
    import threading

    from patchgym.inference.models import ModelSpecError, publish_model_dir

    target = tmp_path / "tiny"
    stage(tmp_path / "rank1", weights=False)
    stage(tmp_path / "rank0", weights=True)
    threading.Timer(0.5, publish_model_dir, (tmp_path / "rank0", target)).start()
    publish_model_dir(tmp_path / "rank1", target)  # returns once rank 0's directory is there
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (tmp_path / "rank1").exists()  # left to its temporary directory's clean-up

    stage(tmp_path / "late", weights=True)  # a complete directory is kept as it is
    publish_model_dir(tmp_path / "late", target)
    assert (target / "model.safetensors").read_bytes() == b"weights" and (tmp_path / "late").exists()

    with pytest.raises(ModelSpecError, match="no process wrote the model's weights within 0 s"):
        publish_model_dir(tmp_path / "rank1", tmp_path / "never", wait_s=0.3)


def test_a_tokenizer_only_model_directory_left_before_is_replaced(tmp_path):
    from patchgym.inference.models import publish_model_dir

    target = tmp_path / "tiny"
    stage(target, weights=False)  # what a rank without the weights published before
    stage(tmp_path / "rank0", weights=True)
    publish_model_dir(tmp_path / "rank0", target)
    assert (target / "config.json").exists() and (target / "model.safetensors").exists()
