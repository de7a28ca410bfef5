"""vLLM serves a (random, small) Qwen3ForCausalLM with the configured chat template: the server renders a chat to
exactly the ids the token builder gives the hf engine, kwargs included, plays multi-turn episodes in both history
modes with exact tokens, and serves a train iteration with inference.engine=vllm whose episodes run in Docker.
One server for the module (a start costs ~40 s); the train test, which pushes new weights into it, runs last."""

import importlib.util
import json
import urllib.request

import pytest
import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from memory_env import MemoryEnv, memory_task
from patchgym.agent import tokens
from patchgym.agent.check_tokens import check_run, check_trajectory
from patchgym.agent.config import AgentConfig, SamplingConfig
from patchgym.agent.loop import run_agent
from patchgym.agent.trajectory_files import read_trajectories
from patchgym.config import load_config
from patchgym.inference.base import SamplingParams
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.models import qwen3_tokenizer
from patchgym.inference.vllm_engine import model_dir
from patchgym.tasks import write_tasks
from patchgym.train.loop import Trainer
from patchgym.train.metrics_schema import read_metrics

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install '.[vllm]')")

KWARGS = {"enable_thinking": False}
CHAT = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "calc.add subtracts."}]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tiny):
    """A saved random Qwen3 whose 32-wide heads vLLM's CPU attention takes, with Qwen3's tokenizer stand-in."""
    directory = tmp_path_factory.mktemp("qwen3-model")
    tokenizer = qwen3_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def server(qwen3_dir):
    from patchgym.inference.vllm_engine import VLLMEngine

    with VLLMEngine(str(qwen3_dir), kv_cache_gb=0.25, chat_template="qwen3", chat_template_kwargs=KWARGS,
                    extra_args=["--max-model-len", "2048"]) as engine:
        yield engine


# Both tests take the docker backend, so pytest keeps them together (its session-scoped backend parameter would
# otherwise split the module in two and start the server twice).
@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_the_vllm_server_renders_the_chat_as_the_token_builder_does(server, qwen3_dir, backend):
    engine = server
    ours = configure_tokenizer(qwen3_tokenizer(), "qwen3", KWARGS)
    expected = tokens.prompt_ids(ours, CHAT)
    assert ours.decode(expected).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tokens.prompt_ids(engine.tokenizer, CHAT) == expected
    body = {"model": str(qwen3_dir), "messages": CHAT, "add_generation_prompt": True}
    request = urllib.request.Request(f"{engine.url}/tokenize", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.loads(response.read())["tokens"] == expected  # the server's own chat rendering
    generation = engine.generate(expected, SamplingParams(max_new_tokens=5, seed=1))
    assert len(generation.token_ids) == len(generation.logprobs) >= 1
    # A multi-turn episode through the vLLM engine: its first prompt is the hf engine's, every token exact.
    for history in ("keep", "template"):
        config = AgentConfig(history=history, max_steps=3, max_format_errors=10,
                             sampling=SamplingConfig(max_new_tokens=8, seed=2))
        trajectory = run_agent(memory_task(), engine, MemoryEnv(), config)
        assert trajectory.steps == 3 and trajectory.turns[0].prompt_ids == tokens.prompt_ids(
            ours, trajectory.messages[:2])
        check = check_trajectory(trajectory, ours)
        assert check.ok, check.errors


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_a_train_iteration_with_engine_vllm_plays_in_real_sandboxes(server, qwen3_dir, backend, tiny_task, tmp_path,
                                                                    monkeypatch):
    """inference.engine=vllm through the trainer, on this module's server (the trainer would start its own: the
    same VLLMEngine, from the same inference settings): its episodes run in Docker with native tool calls, every
    token exact and the first prompt the hf engine's, and the trained weights are pushed into the server."""
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = load_config(overrides=[
        "inference.engine=vllm", f"inference.model={qwen3_dir}", "inference.chat_template=qwen3",
        "inference.chat_template_kwargs={enable_thinking: false}", f"train.tasks={tasks_file}", "train.iterations=1",
        "train.tasks_per_iteration=1", "train.samples_per_task=2", "train.lr=0.01", "train.keep_checkpoints=1",
        "agent.tool_format=native", "agent.max_steps=2", "agent.max_format_errors=10", "agent.max_context_tokens=2048",
        "agent.sampling.max_new_tokens=8", "rollout.max_sandboxes=2", "algorithm.advantage=rloo",
        "algorithm.entropy_coef=0.001"])  # every advantage is 0: the entropy term makes the update run
    assert server.model_dir == model_dir(config.inference.model)  # the server the trainer would have started
    monkeypatch.setattr("patchgym.train.loop.make_engine", lambda config: server)
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.run()
    (line,) = read_metrics(tmp_path / "run")
    assert line["trajectories"] == 2 and line["policy_tokens"] > 0 and line["time_weight_sync_s"] > 0
    assert 0 <= line["rollout_logprob_gap"] < 1e-3  # fp32 vLLM vs the fp32 trainer, on the very same weights
    check = check_run(tmp_path / "run" / "rollouts" / "iter-1", trainer.tokenizer)
    assert check.ok and check.summary()["sampled_segments"] > 0, [t.errors for t in check.trajectories]
    ours = configure_tokenizer(qwen3_tokenizer(), "qwen3", KWARGS)
    for trajectory in read_trajectories(tmp_path / "run" / "rollouts" / "iter-1"):
        assert [m["role"] for m in trajectory.messages][2:] == ["assistant", "tool", "assistant"]  # the sandbox's
        assert trajectory.turns[0].prompt_ids == tokens.prompt_ids(ours, trajectory.messages[:2], trajectory.tools)
