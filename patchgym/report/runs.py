"""What a run directory holds: its kind (train, eval or select), its summary and metrics, and compact facts per
trajectory, read tolerantly (missing files and keys are normal: runs are read while they are still being written).

- train: RUN/metrics.jsonl and RUN/rollouts/iter-N/trajectories.jsonl
- eval: RUN/trajectories.jsonl and RUN/summary.json
- select: SEL/summary.json with best@k keys
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from patchgym.errors import UserError

RunKind = Literal["train", "eval", "select"]

_CALL_START = re.compile(r"<function\s*=|<tool_call>")
_BARE_CALL = re.compile(r'\{\s*"(name|function)"\s*:')
_ITER = re.compile(r"iter-(\d+)$")


class RunError(UserError, ValueError):
    """The directory is not a run this package can read."""


def run_kind(run: Path) -> RunKind:
    """Which kind of run `run` is, from the files present."""
    summary = read_json(run / "summary.json") or {}
    if any(key.startswith("best@") for key in summary):
        return "select"
    if (run / "metrics.jsonl").exists() or (run / "rollouts").is_dir():
        return "train"
    if (run / "trajectories.jsonl").exists() or summary or (read_json(run / "run.json") or {}).get("kind") == "eval":
        return "eval"
    raise RunError(f"{run} holds none of metrics.jsonl, rollouts/, trajectories.jsonl or summary.json: "
                   "not a train, eval or select run")


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file; a line cut by a crash (or still being written) is skipped."""
    return [record for _, _, record in iter_jsonl(path) if record is not None]


def iter_jsonl(path: Path, offset: int = 0) -> Iterator[tuple[int, int, dict | None]]:
    """(start, end, object or None when the line is not a JSON object) per whole line from byte `offset` on."""
    try:
        f = open(path, "rb")
    except OSError:
        return
    with f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            yield offset, offset + len(line), record if isinstance(record, dict) else None
            offset += len(line)


def trajectory_files(run: Path) -> list[tuple[int | None, Path]]:
    """(iteration, file) for each trajectories.jsonl of the run, in iteration order (None for an eval run)."""
    files: list[tuple[int | None, Path]] = []
    if (run / "trajectories.jsonl").exists():
        files.append((None, run / "trajectories.jsonl"))
    rollouts = run / "rollouts"
    if rollouts.is_dir():
        for directory in rollouts.iterdir():
            match = _ITER.match(directory.name)
            if match and (directory / "trajectories.jsonl").exists():
                files.append((int(match.group(1)), directory / "trajectories.jsonl"))
    return sorted(files, key=lambda item: -1 if item[0] is None else item[0])


def read_trajectories(run: Path) -> list[dict]:
    """The facts of every trajectory of the run; a trajectory recorded twice (rerun on resume) counts once."""
    latest: dict[tuple, dict] = {}
    for iteration, path in trajectory_files(run):
        for _, _, record in iter_jsonl(path):
            if record is None:
                continue
            facts = trajectory_facts(record, iteration)
            latest[(iteration, facts["trajectory_id"])] = facts
    return list(latest.values())


def trajectory_facts(record: dict, iteration: int | None = None) -> dict:
    """The numbers report plots and the viewer's table need from one Trajectory record."""
    turns = [t for t in record.get("turns") or [] if isinstance(t, dict)]
    grade = record.get("grade") or {}
    split = [turn_tokens(t) for t in turns]
    return {
        "trajectory_id": record.get("trajectory_id") or record.get("task_id", ""),
        "task_id": record.get("task_id", ""),
        "iteration": iteration,
        "resolved": bool(grade.get("resolved")),
        "termination": record.get("termination") or "unfinished",
        "steps": len(turns),
        "tokens": sum(len(t.get("completion_ids") or []) for t in turns),
        "thinking_tokens": [s[0] for s in split],
        "call_tokens": [s[1] for s in split],
        "generate_s": sum(float(t.get("generate_s") or 0.0) for t in turns),
        "tool_s": sum(float(t.get("step_s") or 0.0) for t in turns),
        "grading_s": float(grade.get("duration") or 0.0),
        "seconds": float(record.get("seconds") or 0.0),
    }


def split_action(action: str, has_call: bool = True) -> tuple[str, str]:
    """(thought, tool call): the text before the call's start (`<function=`, `<tool_call>`, or a bare JSON call
    when one was parsed) is the model's thinking; the rest is the call."""
    start = _CALL_START.search(action) or (_BARE_CALL.search(action) if has_call else None)
    if start is None:
        return action, ""
    return action[: start.start()], action[start.start():]


def turn_tokens(turn: dict) -> tuple[int, int]:
    """(thinking, tool call) sampled tokens of a turn. The text does not say where the token boundary falls, so the
    turn's sampled tokens are split in proportion to the characters of each part."""
    sampled = len(turn.get("completion_ids") or [])
    action = turn.get("action") or ""
    if not sampled or not action:
        return 0, sampled
    thought, _ = split_action(action, turn.get("tool_call") is not None)
    thinking = round(sampled * len(thought) / len(action))
    return thinking, sampled - thinking
