"""The algorithm config: defaults, validation, and the two presets."""

import pytest
import yaml
from pydantic import ValidationError

from patchgym.rl.config import AlgorithmConfig, load_preset, preset_names, preset_path


def test_defaults_are_plain_grpo_without_kl_or_entropy():
    cfg = AlgorithmConfig()
    assert (cfg.advantage, cfg.loss_agg_mode, cfg.clip_low, cfg.clip_high) == ("grpo", "token-mean", 0.2, 0.2)
    assert cfg.kl_coef == 0.0 and cfg.entropy_coef == 0.0
    assert not (cfg.compact_filter or cfg.dynamic_sampling or cfg.drop_zero_advantage)
    assert cfg.turn_penalty_threshold is None and cfg.stages == []
    assert cfg.compact_terminations == ["max_context", "max_steps", "timeout"]


def test_grpo_plus_plus():
    cfg = load_preset("grpo++")
    assert (cfg.advantage, cfg.clip_low, cfg.clip_high) == ("rloo", 0.2, 0.28)
    assert (cfg.kl_coef, cfg.entropy_coef) == (0.0, 0.0)
    assert cfg.compact_filter and cfg.invalid_as_zero
    assert cfg.loss_agg_mode == "seq-mean-token-sum-norm" and cfg.norm_constant == 8192


def test_nebius_dapo():
    cfg = load_preset("nebius-dapo")
    assert (cfg.advantage, cfg.clip_low, cfg.clip_high, cfg.loss_agg_mode) == ("grpo", 0.2, 0.30, "token-mean")
    assert cfg.turn_penalty_threshold == 10 and cfg.drop_zero_advantage and not cfg.compact_filter
    assert (cfg.kl_coef, cfg.entropy_coef) == (0.0, 0.0)
    assert [(s.max_turns, s.max_context_tokens) for s in cfg.stages] == [(40, 65536), (80, 131072)]
    assert cfg.stages[1].clip_high == 0.26 and cfg.stages[1].curriculum and not cfg.stages[0].curriculum


@pytest.mark.parametrize("name", ["grpo++", "nebius-dapo"])
def test_presets_hold_only_the_algorithm_section(name):
    assert name in preset_names()
    assert list(yaml.safe_load(preset_path(name).read_text())) == ["algorithm"]


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: grpo\\+\\+, nebius-dapo"):
        load_preset("ppo")


@pytest.mark.parametrize(("fields", "message"), [
    ({"advantage": "ppo"}, "known: dr_grpo, grpo, reinforce_pp_baseline, rloo"),
    ({"loss_agg_mode": "sum"}, "unknown loss aggregation"),
    ({"kl_kind": "k4"}, "unknown KL estimator"),
    ({"loss_agg_mode": "seq-mean-token-sum-norm"}, "needs norm_constant"),
    ({"dual_clip": 1.0}, "greater than 1"),
    ({"compact_terminations": ["oom"]}, "compact_terminations"),
    ({"turn_penalty_threshold": 40, "stages": [{"max_turns": 40, "max_context_tokens": 4096}]}, "must exceed"),
    ({"clip_hi": 0.3}, "Extra inputs are not permitted"),
])
def test_invalid_configs_are_rejected(fields, message):
    with pytest.raises(ValidationError, match=message):
        AlgorithmConfig(**fields)
