"""One RL iteration with inference.engine=vllm on the tiny task in Docker: rollouts through the vLLM server keep their
exact tokens (check-tokens), the trainer's fp32 logprobs agree with the engine's (the gap TIS corrects), the
trainer's weights are pushed, and the server is gone with its port free when the run ends."""

import importlib.util
import os
import socket

import pytest
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from patchgym.agent.check_tokens import check_run
from patchgym.config import load_config
from patchgym.inference.models import load_tokenizer
from patchgym.tasks import write_tasks
from patchgym.train.loop import Trainer
from patchgym.train.metrics_schema import read_metrics

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install '.[vllm]')")


@pytest.fixture
def small_model(tmp_path):
    """A random 2-layer Llama on SmolLM2's tokenizer with 32-wide heads: the narrowest vLLM's CPU attention takes
    (the `tiny` model's 8-wide heads are refused), so both engines are quick."""
    tokenizer = load_tokenizer("smollm2")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=8192,
                         tie_word_embeddings=True, initializer_range=0.5, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    path = tmp_path / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.timeout(600)
def test_an_iteration_through_vllm_keeps_tokens_exact_and_stops_the_server(backend, tiny_task, small_model, tmp_path):
    if backend != "docker":
        pytest.skip("the loop test runs on the docker backend")
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = load_config(overrides=[
        "inference.engine=vllm", f"inference.model={small_model}", "inference.vllm_kv_cache_gb=0.25",
        f"train.tasks={tasks_file}", "train.iterations=1", "train.tasks_per_iteration=1", "train.samples_per_task=2",
        "train.lr=0.01", "train.keep_checkpoints=1", "agent.max_steps=2", "agent.max_context_tokens=4096",
        "agent.sampling.max_new_tokens=8", "rollout.max_sandboxes=2", "algorithm.advantage=rloo",
        # Nothing is ever resolved, so every advantage is 0; an entropy term makes the update run its forward pass,
        # which is where the rollout-vs-trainer logprob gap is measured.
        "algorithm.entropy_coef=0.001"])
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.run()

    (line,) = read_metrics(tmp_path / "run")
    assert line["trajectories"] == 2 and line["policy_tokens"] > 0 and line["time_weight_sync_s"] > 0
    assert 0 <= line["rollout_logprob_gap"] < 1e-3  # fp32 vLLM vs the fp32 trainer, on the very same weights
    assert line["tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)  # TIS weighs by exp(trainer - engine logprob)

    check = check_run(tmp_path / "run" / "rollouts" / "iter-1", trainer.tokenizer)
    assert check.ok and check.summary()["sampled_segments"] > 0, [t.errors for t in check.trajectories]

    engine = trainer.engine
    assert engine.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(engine.pid, 0)  # EngineCore and the worker went with the server
    with pytest.raises(ConnectionRefusedError):  # nothing listens on its port any more
        socket.create_connection(("127.0.0.1", engine.port), timeout=5)
