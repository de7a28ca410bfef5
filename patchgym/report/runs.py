"""What a run directory holds: its kind (train, eval or select), its summary and metrics, and compact facts per
trajectory. Missing files are normal (runs are read while they are still being written); trajectories are read
with patchgym.agent.trajectory_files like everywhere else.

- train: RUN/metrics.jsonl and RUN/rollouts/iter-N/trajectories.jsonl
- eval: RUN/trajectories.jsonl and RUN/summary.json
- select: SEL/summary.json with best@k keys
- learning: DIR/learning.json, the result of bench/learning.py (its stages' runs lie in DIR's subdirectories)
"""

import json
import re
from pathlib import Path
from typing import Literal

from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.agent.trajectory_files import files_of, key_of, read_file
from patchgym.errors import UserError

RunKind = Literal["train", "eval", "select", "learning"]

_CALL_START = re.compile(r"<function\s*=|<tool_call>")
_BARE_CALL = re.compile(r'\{\s*"(name|function)"\s*:')


class RunError(UserError, ValueError):
    """The directory is not a run this package can read."""


def run_kind(run: Path) -> RunKind:
    """Which kind of run `run` is, from the files present."""
    if (run / "learning.json").exists():
        return "learning"
    summary = read_json(run / "summary.json") or {}
    if any(key.startswith("best@") for key in summary):
        return "select"
    if (run / "metrics.jsonl").exists() or (run / "rollouts").is_dir():
        return "train"
    if (run / "trajectories.jsonl").exists() or summary or (read_json(run / "run.json") or {}).get("kind") == "eval":
        return "eval"
    raise RunError(f"{run} holds none of metrics.jsonl, rollouts/, trajectories.jsonl, summary.json or "
                   "learning.json: not a train, eval, select or learning run")


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def trajectory_rows(run: Path) -> list[dict]:
    """The facts of every trajectory of the run (read by patchgym.agent.trajectory_files, so a trajectory recorded
    twice counts once and a line still being written is left out)."""
    return [trajectory_facts(t, iteration) for iteration, path in files_of(run) for t in read_file(path).trajectories]


def trajectory_facts(trajectory: Trajectory, iteration: int | None = None) -> dict:
    """The numbers report plots and the viewer's table need from one trajectory."""
    t, grade = trajectory, trajectory.grade
    split = [turn_tokens(turn) for turn in t.turns]
    return {
        "trajectory_id": key_of(t),
        "task_id": t.task_id,
        "iteration": iteration,
        "resolved": t.resolved,
        "scored": t.scored,
        "termination": t.termination or "unfinished",
        "steps": t.steps,
        "tokens": t.sampled_tokens,
        "thinking_tokens": [s[0] for s in split],
        "call_tokens": [s[1] for s in split],
        "generate_s": sum(turn.generate_s for turn in t.turns),
        "tool_s": sum(turn.step_s for turn in t.turns),
        "grading_s": grade.duration if grade is not None else 0.0,
        "seconds": t.seconds,
    }


def split_action(action: str, has_call: bool = True) -> tuple[str, str]:
    """(thought, tool call): the text before the call's start (`<function=`, `<tool_call>`, or a bare JSON call
    when one was parsed) is the model's thinking; the rest is the call."""
    start = _CALL_START.search(action) or (_BARE_CALL.search(action) if has_call else None)
    if start is None:
        return action, ""
    return action[: start.start()], action[start.start():]


def turn_tokens(turn: Turn) -> tuple[int, int]:
    """(thinking, tool call) sampled tokens of a turn. The text does not say where the token boundary falls, so the
    turn's sampled tokens are split in proportion to the characters of each part."""
    sampled, action = len(turn.completion_ids), turn.action
    if not sampled or not action:
        return 0, sampled
    thought, _ = split_action(action, turn.tool_call is not None)
    thinking = round(sampled * len(thought) / len(action))
    return thinking, sampled - thinking
