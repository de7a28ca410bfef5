"""The exact-token check of a run: what the model was shown is the template's rendering, and what it sampled is
what the record says it said.

Per trajectory, for every turn:
  (a) prompt_ids equal the chat template's rendering: on turn 0 the first prompt of the messages before the first
      assistant message, later the delta the observation message adds; close_ids equal the template's closing;
  (b) the sampled ids (minus a final end-of-turn token), with any thought closing inserted where the record says
      (agent.max_thinking_tokens), decode to exactly the stored assistant message, and that closing is the
      template's.
It also counts sampled segments that are not the tokenizer's canonical encoding of their own text: a pipeline that
re-tokenises the chat would silently train on other tokens than were sampled there. That count is information.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

from patchgym.agent import tokens
from patchgym.agent.trajectory import Trajectory
from patchgym.agent.trajectory_files import read_trajectories
from patchgym.files import read_json_object


@dataclass
class TrajectoryCheck:
    trajectory_id: str
    errors: list[str] = field(default_factory=list)
    sampled_segments: int = 0
    non_canonical: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass
class RunCheck:
    trajectories: list[TrajectoryCheck]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.trajectories)

    def summary(self) -> dict:
        return {
            "trajectories": len(self.trajectories),
            "failed": sum(not t.ok for t in self.trajectories),
            "sampled_segments": sum(t.sampled_segments for t in self.trajectories),
            "non_canonical_segments": sum(t.non_canonical for t in self.trajectories),
            "ok": self.ok,
        }


def check_trajectory(trajectory: Trajectory, tokenizer) -> TrajectoryCheck:
    """Check one trajectory's turns against its messages (see the module docstring)."""
    result = TrajectoryCheck(trajectory.trajectory_id or trajectory.task_id)
    messages, tools = trajectory.messages, trajectory.tools
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(assistant_at) != len(trajectory.turns):
        result.errors.append(f"{len(trajectory.turns)} turns but {len(assistant_at)} assistant messages")
        return result
    for n, (turn, at) in enumerate(zip(trajectory.turns, assistant_at)):
        before = messages[:at]
        where = f"turn {n}"
        try:
            if n == 0 or trajectory.history == "template":  # step-wise: every prompt is rendered whole
                expected = tokens.prompt_ids(tokenizer, before, tools, trajectory.history)
            else:
                expected = tokens.observation_ids(tokenizer, before[:-1], before[-1], tools)
        except tokens.TemplateMismatch as exc:
            result.errors.append(f"{where}: {exc}")
            continue
        if turn.prompt_ids != expected:
            result.errors.append(f"{where}: prompt segment differs from the template rendering "
                                 f"{_first_difference(turn.prompt_ids, expected)}")
        if len(turn.logprobs) != len(turn.completion_ids):
            result.errors.append(f"{where}: {len(turn.logprobs)} logprobs for {len(turn.completion_ids)} sampled ids")
        elif any(not (lp <= 0.0) for lp in turn.logprobs if not math.isnan(lp)):
            result.errors.append(f"{where}: a logprob above 0")
        if turn.thought_close_ids:
            closing = tokens.thought_closing_ids(tokenizer, before, tools)
            if turn.thought_close_ids != closing or not 0 < turn.thought_close_at <= len(turn.completion_ids):
                result.errors.append(f"{where}: thought closing {turn.thought_close_ids} after "
                                     f"{turn.thought_close_at} sampled ids, but the template closes a thought "
                                     f"with {closing}")
        content_ids, close = tokens.split_completion(tokenizer, before, turn.output_ids, tools)
        sampled = tokens.sampled_turn(tokenizer, before, turn.completion_ids, tools, turn.thought_close_at,
                                      turn.thought_close_ids)
        if sampled.content != messages[at]["content"] or sampled.action != turn.action:
            result.errors.append(f"{where}: the sampled ids decode to {sampled.content[-60:]!r}, the record says "
                                 f"{messages[at]['content'][-60:]!r}")
        if close != turn.close_ids:
            result.errors.append(f"{where}: close ids {turn.close_ids} but the template closes with {close}")
        result.sampled_segments += 1
        text = tokenizer.decode(content_ids, skip_special_tokens=False)
        if tokenizer.encode(text, add_special_tokens=False) != content_ids:
            result.non_canonical += 1
    return result


def _first_difference(got: list[int], expected: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return f"(first at position {at}: {got[at:at + 3]} vs {expected[at:at + 3]}; lengths {len(got)} vs {len(expected)})"


def run_model_spec(run_dir: Path) -> str | None:
    """The model a run was made with, from its run.json (written by the rollout engine)."""
    meta = run_dir / "run.json"
    return read_json_object(meta, "run record").get("model") if meta.exists() else None


def check_run(run_dir: Path, tokenizer) -> RunCheck:
    """Check every trajectory with turns in a run directory (every iteration of a train run) or a file, each with
    the chat template it was played with (recorded in its `engine`), else the tokenizer's."""
    default = tokenizer.chat_template
    checks = []
    for trajectory in read_trajectories(run_dir):
        if trajectory.turns:
            tokenizer.chat_template = trajectory.engine.get("chat_template", default)
            checks.append(check_trajectory(trajectory, tokenizer))
    tokenizer.chat_template = default
    return RunCheck(checks)
