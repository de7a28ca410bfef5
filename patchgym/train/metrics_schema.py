"""What a line of RUN/metrics.jsonl holds, and its reader: importable without torch, so `patchgym report` reads a
train run without loading the trainer (patchgym.train.metrics computes and writes the lines)."""

from pathlib import Path
from typing import Any

from patchgym.files import read_jsonl

METRICS_FILE = "metrics.jsonl"
# Keys of every line (the policy update's own metrics come on top); nested dicts are counts (termination_fractions:
# shares of the trajectories). resolve_rate is resolved / scored trajectories of the iteration.
KEYS = (
    "iteration", "stage", "optimizer_steps", "lr", "tasks", "trajectories", "rounds", "reward_mean", "reward_std",
    "reward_before_shaping", "resolve_rate", "resolved", "advantage_mean", "advantage_std", "advantage_min",
    "advantage_max", "advantage_zero_fraction", "groups", "nonzero_advantage_group_fraction", "trained_trajectories",
    "steps_per_trajectory", "sampled_tokens_per_trajectory", "tokens_per_trajectory", "stepwise_extra_tokens",
    "observations_cut", "thinking_truncated", "rollout_tokens_per_s", "terminations", "termination_fractions",
    "grade_outcomes", "filters", "time_rollout_s", "time_grading_s",
    "time_training_s", "time_weight_sync_s", "time_iteration_s", "time_rollout_wait_s", "policy_version_min",
    "staleness_mean", "staleness_max",
)
# Keys of a pivot stage's line (patchgym.pivot.train), stage "pivot", with UPDATE_KEYS (null where nothing was
# trained). reward_mean, reward_std, parsable_fraction (share of samples with a parsable tool call) and reasons
# (samples per local-reward rule) are over every sample of the iteration: the whole pool on a measuring iteration
# (states_measured > 0), the drawn kept states otherwise; trained_reward_mean over the trained states' samples.
# states_kept and kept_fraction: the kept set after the iteration, and its share of the last measured pool.
PIVOT_KEYS = (
    "iteration", "stage", "pivot_iteration", "optimizer_steps", "lr", "states_measured", "states_kept",
    "kept_fraction", "states_trained", "samples", "reward_mean", "reward_std", "trained_reward_mean",
    "parsable_fraction", "reasons", "advantage_mean", "advantage_std", "advantage_min", "advantage_max",
    "advantage_zero_fraction", "groups", "nonzero_advantage_group_fraction", "trained_sequences", "sampled_tokens",
    "sample_tokens_per_s", "time_sampling_s", "time_reward_s", "time_training_s", "time_weight_sync_s",
    "time_iteration_s",
)
# The policy update's numbers (patchgym.train.update.policy_update), renamed to say what they count; every line
# has UPDATE_KEYS, null where the update did not report one (nothing trained).
UPDATE_NAMES = {"tokens": "policy_tokens", "input_tokens": "train_input_tokens", "tokens_per_s": "train_tokens_per_s"}
UPDATE_KEYS = ("loss", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "rollout_logprob_gap", "entropy",
               "grad_norm", "policy_tokens", "train_tokens_per_s", "padding_fraction")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """RUN/metrics.jsonl's lines, in order (none when there is no such file; a last line cut by a crash is left
    out)."""
    return read_jsonl(Path(run_dir) / METRICS_FILE, what="metrics file").records
