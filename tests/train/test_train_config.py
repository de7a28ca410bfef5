"""The train and algorithm config sections, the preset config files, and the seeded task and stage schedule."""

from pathlib import Path

import pytest
import yaml

from patchgym.agent.config import AgentConfig
from patchgym.config import ConfigError, load_config
from patchgym.rl.config import AlgorithmConfig, load_preset, preset_path
from patchgym.train.schedule import (
    LoopState,
    StageSettings,
    draw_tasks,
    enter_stage,
    pass_order,
    record_outcomes,
    stage_of,
    stage_settings,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_bad_train_values_name_the_key():
    with pytest.raises(ConfigError, match=r"train.samples_per_task \(from override .*\): got 1, .*greater than or "
                                          r"equal to 2"):
        load_config(overrides=["train.samples_per_task=1"])
    with pytest.raises(ConfigError, match="train.iteration .*did you mean 'iterations'"):
        load_config(overrides=["train.iteration=3"])
    with pytest.raises(ConfigError, match="train.lr_schedule .*'constant', 'cosine' or 'linear'"):
        load_config(overrides=["train.lr_schedule=step"])
    with pytest.raises(ConfigError, match="algorithm.advantage .*unknown advantage estimator 'ppo'"):
        load_config(overrides=["algorithm.advantage=ppo"])


def test_fsdp_policies_need_fsdp_and_optimizer_only_offload_is_refused():
    with pytest.raises(ConfigError, match="train.param_dtype, train.reduce_dtype and train.offload .*train.fsdp"):
        load_config(overrides=["train.param_dtype=bf16"])
    with pytest.raises(ConfigError, match="offload: optimizer has no FSDP2 equivalent"):
        load_config(overrides=["train.fsdp=true", "train.offload=optimizer"])
    with pytest.raises(ConfigError, match="offload: params needs a CUDA inference.device"):
        load_config(overrides=["train.fsdp=true", "train.offload=params"])
    assert load_config(overrides=["train.fsdp=true", "train.param_dtype=bf16"]).train.param_dtype == "bf16"


@pytest.mark.parametrize("name", ["grpo++", "nebius-dapo"])
def test_preset_config_files_hold_the_preset_algorithm(name):
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    assert raw["algorithm"] == yaml.safe_load(preset_path(name).read_text())["algorithm"]
    config = load_config([CONFIGS / f"{name}.yaml"])
    assert config.algorithm == load_preset(name)
    assert {"train", "agent", "inference"} <= set(raw)


def test_preset_configs_are_consistent():
    grpo = load_config([CONFIGS / "grpo++.yaml"])
    assert grpo.algorithm.norm_constant == grpo.agent.max_context_tokens
    nebius = load_config([CONFIGS / "nebius-dapo.yaml"])
    assert len(nebius.train.stage_iterations) == len(nebius.algorithm.stages) - 1
    assert nebius.train.samples_per_task == 10 and nebius.train.weight_decay == 0.1


def test_demo_config_is_grpo_plus_plus_on_smollm2_with_short_limits():
    demo = load_config([CONFIGS / "demo.yaml"])
    expected = load_preset("grpo++").model_copy(update={"norm_constant": demo.agent.max_context_tokens})
    assert demo.algorithm == expected
    assert (demo.inference.model, demo.inference.device) == ("smollm2", "cpu")
    # epochs over the demo's 6 tasks: every iteration attempts each of them, all its episodes decoding at once
    assert (demo.train.iterations, demo.train.tasks_per_iteration, demo.train.samples_per_task) == (3, 6, 2)
    assert demo.rollout.max_generations == demo.inference.max_batch == 12 and demo.train.warm_start.dtype == "bf16"
    assert demo.agent.max_steps == 6 and demo.agent.sampling.max_new_tokens == 320  # room for the expert demos


def test_draws_are_seeded_distinct_and_cover_the_pool_each_pass():
    pool = [f"t{i}" for i in range(5)]
    state = LoopState(pool=pool)
    batches = [draw_tasks(state, 2, seed=3) for _ in range(5)]
    again = LoopState(pool=pool)
    assert [draw_tasks(again, 2, seed=3) for _ in range(5)] == batches  # same seed, same stream
    assert all(len(set(b)) == 2 for b in batches)
    assert sorted(batches[0] + batches[1] + [batches[2][0]]) == pool  # pass 0 holds each task once
    assert pass_order(pool, 3, 0) != pass_order(pool, 3, 1)
    assert draw_tasks(LoopState(pool=pool), 5, seed=0, shuffle=False) == pool
    with pytest.raises(ValueError, match="cannot draw 6 distinct tasks from a pool of 5"):
        draw_tasks(LoopState(pool=pool), 6, seed=0)


def test_stage_boundaries():
    assert [stage_of(n, [2, 3], 3) for n in range(1, 8)] == [0, 0, 1, 1, 1, 2, 2]
    assert [stage_of(n, [], 1) for n in (1, 100)] == [0, 0]
    assert stage_of(5, [], 0) == 0


def test_a_stage_runs_with_its_limits_and_clip_high():
    algo = AlgorithmConfig(stages=[{"max_turns": 4, "max_context_tokens": 64, "clip_high": 0.28},
                                   {"max_turns": 8, "max_context_tokens": 128}])
    agent = AgentConfig()
    first, second = stage_settings(agent, algo, 0), stage_settings(agent, algo, 1)
    assert (first.agent.max_steps, first.agent.max_context_tokens, first.algorithm.clip_high) == (4, 64, 0.28)
    assert first.max_turns == 4 and second.max_turns == 8 and second.algorithm.clip_high == algo.clip_high
    assert stage_settings(agent, AlgorithmConfig(), 0) == StageSettings(agent, AlgorithmConfig(), agent.max_steps)


def test_curriculum_stage_keeps_tasks_neither_too_easy_nor_never_solved():
    algo = AlgorithmConfig(stages=[{"max_turns": 4, "max_context_tokens": 64},
                                   {"max_turns": 8, "max_context_tokens": 64, "curriculum": True}])
    state = LoopState(pool=["easy", "hard", "mid", "new"], drawn=7)
    record_outcomes(state, [("easy", True)] * 3 + [("hard", False)] * 3 + [("mid", True), ("mid", False)])
    counts = enter_stage(state, 1, algo)
    assert state.pool == ["mid", "new"] and state.stage == 1 and state.drawn == 0
    assert counts == {"kept": 2, "too_easy": 1, "never_solved": 1}
    assert LoopState.from_dict(state.to_dict()) == state


@pytest.mark.parametrize(("files", "overrides", "message"), [
    ([CONFIGS / "nebius-dapo.yaml"], ["train.stage_iterations=[]"], r"train.stage_iterations needs 1 entries"),
    ([], ["train.stage_iterations=[3]"], "algorithm.stages is empty"),
    ([], ["algorithm.turn_penalty_threshold=10", "agent.max_steps=10"],
     r"agent.max_steps \(10\) must exceed algorithm.turn_penalty_threshold"),
    ([CONFIGS / "nebius-dapo.yaml"], ["rollout.max_staleness=1"], "max_staleness > 0 with algorithm.stages"),
    ([], ["rollout.max_staleness=1", "algorithm.tis_cap=null"], "max_staleness > 0 needs algorithm.tis_cap"),
    ([], ["rollout.max_staleness=1", "cluster.backend=ray"], "not supported with cluster.backend=ray"),
    ([], ["train.bf16=true"], "train.bf16 needs a CUDA"),
])
def test_settings_that_clash_are_refused_when_the_config_loads(files, overrides, message):
    """So that `patchgym doctor` names them too, before a run starts."""
    with pytest.raises(ConfigError, match=message):
        load_config(files, overrides)
