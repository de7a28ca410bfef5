"""configs/deepswe.yaml: DeepSWE's limits and GRPO++, and its template renders a prompt that fits history keep."""

from pathlib import Path

from patchgym.agent import tokens
from patchgym.agent.template_check import check_history
from patchgym.config import load_config
from patchgym.inference.chat_template import configure_tokenizer
from patchgym.inference.models import qwen3_tokenizer
from patchgym.rl.config import load_preset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_deepswe_has_deepswes_limits_and_grpo_pp():
    config = load_config([CONFIGS / "deepswe.yaml"])
    agent = config.agent
    assert (agent.max_steps, agent.max_context_tokens, agent.max_seconds, agent.command_timeout_s) == \
        (50, 4096 + 32768, 5400.0, 90.0)
    assert (agent.history, config.inference.chat_template, config.inference.chat_template_kwargs) == \
        ("keep", "qwen3", {"enable_thinking": True})
    assert config.algorithm == load_preset("grpo++").model_copy(update={"norm_constant": agent.max_context_tokens})


def test_deepswe_renders_a_prompt_with_its_template(tiny):
    config = load_config([CONFIGS / "deepswe.yaml"])
    tokenizer = configure_tokenizer(qwen3_tokenizer(), config.inference.chat_template,
                                    config.inference.chat_template_kwargs)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tokenizer.decode(tokens.prompt_ids(tokenizer, messages))
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    check_history(tokenizer, config.agent)
