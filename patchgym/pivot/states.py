"""Decision points: every assistant turn of an expert demonstration or a resolved trajectory, as one state of the
pivot stage, with what its local reward needs.

A `DecisionPoint` holds the chat messages before the turn, the tool schemas and history mode they were rendered
with (`prompt_ids` renders the prompt token ids exactly as the agent loop builds them), the expert's action and its
parsed call, and the files the local check reads AS THEY WERE at that state: the file the expert's call names and
the file its next editor edit changes (`target`), before the turn, and that file after the expert's own edit. The
files come from a replay of the trajectory in the task's sandbox (patchgym.pivot.replay.SandboxReplay, or any
`Replay`): reset as the agent loop does, the expert's actions stepped one by one, the files read before and after
each; a step whose outcome differs from the record (another exit status) is a `StateError`.

Turns that are not expert actions are left out: format errors, and editor or search calls that failed.
States are written as JSONL atomically and read back with errors naming the file and the row.
"""

import json
import posixpath
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from patchgym.agent import tokens
from patchgym.agent.trajectory import Trajectory
from patchgym.env.base import StepResult
from patchgym.errors import UserError
from patchgym.files import write_atomic
from patchgym.tasks import Task

EDITS = ("str_replace", "insert", "create")  # the file_editor commands that change a file


class StateError(UserError, ValueError):
    """A trajectory that gives no decision points, or a state file that holds something else; the message says which
    trajectory, turn, file or row."""


class DecisionPoint(BaseModel):
    """One assistant turn of an expert trajectory, as a state to sample actions at."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str
    task_id: str
    turn: int = Field(ge=0, description="the turn's index in its trajectory")
    workdir: str = Field(description="the task's working directory: relative paths in calls are relative to it")
    messages: list[dict[str, str]] = Field(description="the chat before the turn, as the model saw it")
    tools: list[dict] | None = Field(None, description="the tool schemas the template rendered (native tool calls)")
    history: Literal["keep", "template"] = "keep"
    action: str = Field(description="the expert's action text at this turn")
    call: dict = Field(description="the expert's tool call as parsed: {name, arguments}")
    exit_code: int | None = Field(None, description="the expert's call's exit status (execute_bash: its command's)")
    target: str | None = Field(None, description=(
        "absolute path of the file the expert's next file_editor edit (this turn's or a later one) changes"))
    files: dict[str, str | None] = Field(default_factory=dict, description=(
        "absolute path -> text before this turn (null: absent or not a regular file), for the call's file and "
        "the target"))
    after: dict[str, str | None] = Field(default_factory=dict, description=(
        "on an edit turn: the edited file's text after the expert's edit"))
    earlier_actions: list[str] = Field(default_factory=list, description=(
        "the action texts of the turns before this one: replayed, they restore this state in a fresh sandbox"))

    @property
    def key(self) -> str:
        """Unique among the states of one pool: the trajectory and the turn."""
        return f"{self.trajectory_id}@{self.turn}"

    @property
    def finished(self) -> bool:
        return self.call["name"] == "finish"

    def path(self, raw: object) -> str | None:
        """A call's path argument as the tools resolve it: absolute, normalised against the workdir."""
        if not isinstance(raw, str) or not raw.strip():
            return None
        return posixpath.normpath(posixpath.join(self.workdir, raw.strip()))


class Replay(Protocol):
    """An environment that can play a trajectory again and show its files between steps."""

    def reset(self, task: Task) -> str: ...

    def step(self, action_text: str) -> StepResult: ...

    def read(self, paths: list[str]) -> dict[str, str | None]:
        """Each absolute path's text now; None where it is absent or not a regular file."""
        ...

    def close(self) -> None: ...


def unusable(trajectory: Trajectory) -> str | None:
    """Why the trajectory's turns are no expert actions, or None: it must be resolved (a demo is) and have turns."""
    if not trajectory.turns:
        return "it has no turns"
    if not trajectory.resolved:
        return "it did not resolve its task"
    return None


def expert_turns(trajectory: Trajectory) -> list[int]:
    """The turns that are expert actions: a parsed call that did not fail as a tool (a command may exit non-zero)."""
    keep = []
    for n, turn in enumerate(trajectory.turns):
        call = turn.tool_call
        if call is None or turn.format_error:
            continue
        if call["name"] in ("file_editor", "search") and turn.exit_code not in (0, None):
            continue
        keep.append(n)
    return keep


def decision_points(trajectory: Trajectory, task: Task, replay: Replay) -> list[DecisionPoint]:
    """The states of one usable trajectory, its files read in `replay` (reset here; closing it is the caller's)."""
    name = trajectory.trajectory_id or trajectory.task_id
    if (why := unusable(trajectory)) is not None:
        raise StateError(f"trajectory {name}: {why}, so its turns are no expert actions")
    if task.instance_id != trajectory.task_id:
        raise StateError(f"trajectory {name} is of task {trajectory.task_id}, not {task.instance_id}")
    assistant_at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    if len(assistant_at) != len(trajectory.turns):
        raise StateError(f"trajectory {name}: {len(trajectory.turns)} turns but {len(assistant_at)} assistant "
                         "messages")
    keep = set(expert_turns(trajectory))
    targets = _targets(trajectory, task.workdir)
    replay.reset(task)
    points = []
    for n, (turn, at) in enumerate(zip(trajectory.turns, assistant_at)):
        point = None
        if n in keep:
            point = DecisionPoint(
                trajectory_id=name, task_id=task.instance_id, turn=n, workdir=task.workdir,
                messages=trajectory.messages[:at], tools=trajectory.tools, history=trajectory.history,
                action=turn.action, call=turn.tool_call, exit_code=turn.exit_code, target=targets[n],
                earlier_actions=[t.action for t in trajectory.turns[:n]])
            editor = turn.tool_call["name"] == "file_editor"
            own = point.path(turn.tool_call["arguments"].get("path")) if editor else None
            point.files = replay.read(sorted({p for p in (own, point.target) if p is not None}))
        result = replay.step(turn.action)
        if (result.call is None) != turn.format_error or (result.exit_code != turn.exit_code and n in keep):
            raise StateError(f"trajectory {name}, turn {n}: the replay differs from the record (exit status "
                             f"{result.exit_code}, recorded {turn.exit_code}): {result.observation[-300:]}")
        if point is not None:
            if point.call["name"] == "file_editor" and point.call["arguments"].get("command") in EDITS:
                edited = point.path(point.call["arguments"].get("path"))
                point.after = replay.read([edited])
            points.append(point)
    return points


def _targets(trajectory: Trajectory, workdir: str) -> list[str | None]:
    """Per turn, the absolute path the expert's next editor edit (at that turn or later) changes."""
    out: list[str | None] = []
    following: str | None = None
    for turn in reversed(trajectory.turns):
        call = turn.tool_call
        if (call is not None and call["name"] == "file_editor" and call["arguments"].get("command") in EDITS
                and turn.exit_code == 0 and isinstance(call["arguments"].get("path"), str)):
            following = posixpath.normpath(posixpath.join(workdir, call["arguments"]["path"].strip()))
        out.append(following)
    return out[::-1]


def build_states(trajectories: Iterable[Trajectory], tasks: Mapping[str, Task],
                 open_replay) -> tuple[list[DecisionPoint], list[str]]:
    """(every decision point of the usable trajectories, why each other one gave none). `open_replay()` gives a
    fresh Replay per trajectory (closed here)."""
    points: list[DecisionPoint] = []
    skipped: list[str] = []
    for trajectory in trajectories:
        name = trajectory.trajectory_id or trajectory.task_id
        if (why := unusable(trajectory)) is not None:
            skipped.append(f"{name}: {why}")
            continue
        if trajectory.task_id not in tasks:
            skipped.append(f"{name}: its task {trajectory.task_id} is not among the tasks given")
            continue
        replay = open_replay()
        try:
            points += decision_points(trajectory, tasks[trajectory.task_id], replay)
        finally:
            replay.close()
    _check_unique(points, "the states built")
    return points, skipped


def _check_unique(points: list[DecisionPoint], where: str) -> None:
    seen: set[str] = set()
    twice = [p.key for p in points if p.key in seen or seen.add(p.key)]
    if twice:
        raise StateError(f"{where}: states {', '.join(twice[:5])} appear twice (trajectories from several runs or "
                         "iterations share ids: give each source its own state file)")


def write_states(path: str | Path, points: list[DecisionPoint]) -> None:
    """Replace `path` with the states, one JSON record a line, atomically."""
    _check_unique(points, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(p.model_dump_json() + "\n" for p in points))


def read_states(path: str | Path) -> list[DecisionPoint]:
    """The states of a file written by write_states; anything else is a StateError naming the file and the row."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise StateError(f"state file {path} cannot be read: {exc.strerror}") from None
    points = []
    for row, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            points.append(DecisionPoint.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as exc:
            problem = " ".join(str(exc).split())[:300]
            raise StateError(f"{path}:{row}: not a decision point: {problem}") from None
    _check_unique(points, str(path))
    return points


def prompt_ids(point: DecisionPoint, tokenizer) -> list[int]:
    """The token ids the model is given at this state, built as the agent loop builds them (patchgym.agent.loop):
    with history "template" the template's rendering of the whole chat; with "keep" the first prompt, then per
    earlier turn the assistant's text tokenised (what a model sampling it canonically gives) and the template's
    closing, then the observation's segment."""
    messages, tools = point.messages, point.tools
    if point.history == "template":
        return tokens.prompt_ids(tokenizer, messages, tools, "template")
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    first = assistant_at[0] if assistant_at else len(messages)
    ids = tokens.prompt_ids(tokenizer, messages[:first], tools, "keep")
    for at in assistant_at:
        opened, closing = tokens.assistant_frame(tokenizer, messages[:at], tools)
        content = messages[at]["content"]
        if not content.startswith(opened):
            raise StateError(f"state {point.key}: assistant message {at} does not begin with what the template's "
                             f"generation prompt opens ({opened!r}), so it was not sampled with this template")
        ids += tokenizer.encode(content[len(opened):], add_special_tokens=False) + closing
        if at + 1 < len(messages):
            ids += tokens.observation_ids(tokenizer, messages[:at + 1], messages[at + 1], tools)
    return ids
