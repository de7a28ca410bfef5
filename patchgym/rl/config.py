"""The RL algorithm's config section (`algorithm:`): estimator, loss, filters and shaping, with paper-neutral
defaults; `load_preset` reads the named presets in patchgym/rl/presets/."""

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patchgym.rl.advantages import ADVANTAGE_ESTIMATORS
from patchgym.rl.losses import AGGREGATIONS, KL_ESTIMATORS
from patchgym.rl.shaping import COMPACT_TERMINATIONS
from patchgym.termination import Termination

PRESETS_DIR = Path(__file__).with_name("presets")


class Stage(BaseModel):
    """One training stage (Nebius: 40 turns at 65k, then 80 turns at 131k); a stage changes only these knobs."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(ge=1, description="the agent's max_steps, and T_max of the turn penalty")
    max_context_tokens: int = Field(ge=16, description="the agent's max_context_tokens")
    clip_high: float | None = Field(None, gt=0, description="replaces algorithm.clip_high; null = keep it")
    curriculum: bool = Field(False, description=(
        "before this stage, drop tasks solved more than curriculum_max_solve_rate of the time so far, and tasks "
        "never solved"))


class AlgorithmConfig(BaseModel):
    """Every knob of the RL math; the defaults are plain GRPO with PPO clipping and no shaping."""

    model_config = ConfigDict(extra="forbid")

    advantage: str = Field("grpo", description="advantage estimator: " + ", ".join(sorted(ADVANTAGE_ESTIMATORS)))
    advantage_eps: float = Field(1e-6, gt=0, description="added to the std (grpo, reinforce_pp_baseline)")
    invalid_as_zero: bool = Field(True, description=(
        "filtered trajectories stay in their group's statistics with reward 0 (rLLM); false = left out of them"))
    clip_low: float = Field(0.2, gt=0, lt=1, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, gt=0, description="ratio clipped above at 1 + clip_high (DAPO clip-higher: 0.28)")
    dual_clip: float | None = Field(None, gt=1, description="c of dual clip: loss of A < 0 capped at c|A|; null = off")
    loss_agg_mode: str = Field("token-mean", description="loss aggregation: " + ", ".join(sorted(AGGREGATIONS)))
    norm_constant: float | None = Field(None, gt=0, description="L_const of seq-mean-token-sum-norm (required there)")
    tis_cap: float | None = Field(2.0, gt=0, description=(
        "truncated importance sampling against the engine's logprobs: weight min(pi_old/pi_rollout, cap); null = off"))
    kl_coef: float = Field(0.0, ge=0, description="beta of the KL-to-reference term in the loss; 0 = off")
    kl_kind: str = Field("k3", description="KL estimator: " + ", ".join(sorted(KL_ESTIMATORS)))
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus coefficient; 0 = off")
    compact_filter: bool = Field(False, description="no loss on trajectories ending in compact_terminations (DeepSWE)")
    compact_terminations: list[Termination] = Field(sorted(COMPACT_TERMINATIONS), description=(
        "termination reasons compact filtering masks"))
    dynamic_sampling: bool = Field(False, description="DAPO: train only on groups with 0 < resolved < G, resampling")
    max_generation_rounds: int = Field(10, ge=0, description="dynamic sampling rounds before giving up; 0 = no limit")
    drop_zero_advantage: bool = Field(False, description="Nebius: drop samples whose advantage is 0")
    flip_advantages: bool = Field(False, description=(
        "a benchmark control (bench/learning.py): train on -A, so a run that learns with A must not with it"))
    turn_penalty_threshold: int | None = Field(None, ge=1, description=(
        "Nebius L_thr: from this many turns on, reward += (L_thr - T)/(T_max - L_thr), T_max = the stage's "
        "max_turns (or agent.max_steps); null = off"))
    curriculum_max_solve_rate: float = Field(2 / 3, gt=0, le=1, description="the curriculum's 'too easy' cut")
    stages: list[Stage] = Field([], description="training stages in order; empty = one stage, the agent's limits")

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, name: str) -> str:
        return _known(name, ADVANTAGE_ESTIMATORS, "advantage estimator")

    @field_validator("loss_agg_mode")
    @classmethod
    def _known_aggregation(cls, name: str) -> str:
        return _known(name, AGGREGATIONS, "loss aggregation")

    @field_validator("kl_kind")
    @classmethod
    def _known_kl(cls, name: str) -> str:
        return _known(name, KL_ESTIMATORS, "KL estimator")

    @model_validator(mode="after")
    def _consistent(self) -> "AlgorithmConfig":
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.norm_constant is None:
            raise ValueError("loss_agg_mode seq-mean-token-sum-norm needs norm_constant (say, the context length)")
        if self.turn_penalty_threshold is not None:
            for stage in self.stages:
                if stage.max_turns <= self.turn_penalty_threshold:
                    raise ValueError(f"a stage's max_turns ({stage.max_turns}) must exceed turn_penalty_threshold "
                                     f"({self.turn_penalty_threshold})")
        return self


def preset_names() -> list[str]:
    """The presets shipped in patchgym/rl/presets/."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The YAML file of a preset; it holds only an `algorithm:` section, so it can be given as a run config file."""
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(preset_names())}")
    return path


def load_preset(name: str) -> AlgorithmConfig:
    """The AlgorithmConfig of a preset (keys it does not set keep their defaults)."""
    data = yaml.safe_load(preset_path(name).read_text())
    return AlgorithmConfig.model_validate(data["algorithm"])


def _known(name: str, registry: dict, what: str) -> str:
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(registry))}")
    return name
