"""`patchgym plan` against what a training step of tiny random Llama and Qwen3 models holds on CPU (within 20%),
the published parameter counts of the two shapes in the README, the options other branches add (read with
defaults), and the errors for a model config that is missing or not a model's."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.config import Config, load_config
from patchgym.train.batch import TrainSequence, collate
from patchgym.train.logprobs import batch_logprobs
from patchgym.train.plan import PlanError, kv_cache_bytes, model_config, plan, read_shape
from patchgym.train.prepare import enable_gradient_checkpointing, make_optimizer

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"
SHAPES = {
    "llama, small vocabulary": LlamaConfig(vocab_size=2000, hidden_size=64, intermediate_size=160,
                                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
    "qwen3, logits dominate": Qwen3Config(vocab_size=12000, hidden_size=48, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=16),
}


def saved_for_backward(model, batch, layers) -> tuple[int, int, int]:
    """(bytes autograd saves for backward outside the parameters, the part saved inside decoder layer 0, the
    bytes of the tensors handed to the decoder layers) of one forward pass, each storage counted once."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved, first_layer, inputs, inside = {}, {}, {}, []

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
            if inside == [True]:
                first_layer[storage.data_ptr()] = storage.nbytes()
        return tensor

    def enter(module, args, kwargs):
        for value in [*args, *kwargs.values(), *kwargs.get("position_embeddings", ())]:
            if isinstance(value, torch.Tensor):
                inputs[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        inside[:] = [module is layers[0]]

    hooks = [layer.register_forward_pre_hook(enter, with_kwargs=True) for layer in layers]
    hooks += [layer.register_forward_hook(lambda *_: inside.clear()) for layer in layers]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logprobs = batch_logprobs(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    (-logprobs.sum()).backward()
    return sum(saved.values()), sum(first_layer.values()), sum(inputs.values())


def measure(shape_config, tokens: int) -> dict[str, float]:
    """Bytes of one training step: parameters, gradients and AdamW states from the tensors themselves; activations
    from saved-tensor hooks. With checkpointing a layer keeps only its inputs (they stay alive for its recompute)
    and recomputes its activations in backward, one layer at a time."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(shape_config).train()
    layers = model.get_decoder().layers
    batch = collate([TrainSequence(list(range(3, tokens + 3)), [1] * tokens, [0.0] * tokens, 1.0)], 0)
    full, one_layer, _ = saved_for_backward(model, batch, layers)
    gradients = sum(p.grad.nbytes for p in model.parameters())
    optimizer = make_optimizer(model, lr=1e-3)
    optimizer.step()
    states = sum(t.nbytes for state in optimizer.state.values() for k, t in state.items() if k != "step")
    model.zero_grad()
    enable_gradient_checkpointing(model)
    outside, _, layer_inputs = saved_for_backward(model, batch, layers)
    return {"parameters": sum(p.nbytes for p in model.parameters()), "gradients": gradients,
            "optimizer_states": states, "activations_without_checkpointing": full,
            "activations_with_checkpointing": outside + layer_inputs + one_layer}


@pytest.mark.parametrize("name, tokens", [("llama, small vocabulary", 96), ("llama, small vocabulary", 320),
                                          ("qwen3, logits dominate", 256)])
def test_plan_agrees_with_a_measured_training_step(name, tokens):
    torch.set_num_threads(1)
    shape_config = SHAPES[name]
    measured = measure(shape_config, tokens)
    config = load_config(overrides=[f"train.micro_token_budget={tokens}", f"agent.max_context_tokens={tokens}"])
    planned = plan(config, read_shape(shape_config.to_dict(), name), gpus=1, gpu_gb=1.0)
    for part, value in measured.items():
        assert getattr(planned, part) == pytest.approx(value, rel=0.2), part
    step = ("parameters", "gradients", "optimizer_states", "activations_without_checkpointing")
    assert planned.train_total == pytest.approx(sum(measured[part] for part in step), rel=0.2)


def test_the_published_shapes_have_their_published_sizes():
    qwen3 = read_shape(*model_config(Config(), FIXTURES / "qwen3-32b.json"))
    qwen25 = read_shape(*model_config(Config(), FIXTURES / "qwen2.5-72b.json"))
    assert qwen3.params == pytest.approx(32.8e9, rel=0.01)  # Qwen3-32B: 32.8B parameters
    assert qwen25.params == pytest.approx(72.7e9, rel=0.01)  # Qwen2.5-72B: 72.7B
    assert kv_cache_bytes(qwen3, 1, 2) == 64 * 8 * 128 * 2 * 2  # 256 KiB of bf16 K and V per token


def test_options_of_the_sharding_and_sequence_parallel_branches_change_the_plan():
    """train.param_dtype, train.offload and train.sequence_parallel are read where the config has them."""
    shape = read_shape(*model_config(Config(), FIXTURES / "qwen3-32b.json"))
    config = load_config(overrides=["train.fsdp=true", "train.gradient_checkpointing=true"])
    with_train = lambda **fields: config.model_copy(update={"train": config.train.model_copy(update=fields)})  # noqa
    base = plan(config, shape, 8, 80)
    bf16 = plan(with_train(param_dtype="bf16"), shape, 8, 80)
    other = plan(with_train(param_dtype="bf16", offload="params", sequence_parallel=4), shape, 8, 80)
    assert bf16.activations < base.activations and bf16.parameters == base.parameters  # fp32 master shards
    assert other.activations == pytest.approx(bf16.activations / 4)  # each rank holds a quarter of the tokens
    assert other.parameters == other.gradients == other.optimizer_states == 0
    assert other.cpu_offloaded == pytest.approx(base.parameters + base.gradients + base.optimizer_states)


def test_plan_command_prints_json(tmp_path):
    result = CliRunner().invoke(app, ["plan", "--gpus", "8", "--gpu-gb", "80", "--json", "--model-config",
                                      str(FIXTURES / "qwen3-32b.json"), "train.fsdp=true"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["gpus"] == 8 and printed["parameters"] == pytest.approx(32.8e9 * 4 / 8, rel=0.01)
    assert isinstance(printed["fits_training"], bool)


@pytest.mark.parametrize("content, says", [(None, "not found|No such|does not exist|cannot"),
                                           ("{not json", "not valid JSON"),
                                           ('{"hidden_size": 8}', "no model_type"),
                                           ('{"model_type": "no-such-model"}', "does not describe")])
def test_a_bad_model_config_is_a_user_error_naming_the_file(tmp_path, content, says):
    import re

    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PlanError) as error:
        read_shape(*model_config(Config(), path))
    assert str(path) in str(error.value) and re.search(says, str(error.value))
    result = CliRunner().invoke(app, ["plan", "--model-config", str(path)])
    assert result.exit_code == 2 and str(path) in result.output.replace("\n", "")


def test_lora_trains_only_its_adapters():
    """LoRA's trainable count is that of peft itself on the real model; gradients and AdamW states follow it."""
    from peft import LoraConfig, get_peft_model

    shape_config = SHAPES["llama, small vocabulary"]
    lora = {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    shape = read_shape(shape_config.to_dict(), "llama", lora)
    peft_model = get_peft_model(AutoModelForCausalLM.from_config(shape_config), LoraConfig(**lora))
    assert shape.lora_params == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    planned = plan(load_config(overrides=[f"train.lora={json.dumps(lora)}"]), shape, 1, 1.0)
    assert planned.gradients == shape.lora_params * 4 and planned.parameters == shape.params * 4
