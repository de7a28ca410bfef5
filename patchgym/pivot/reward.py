"""The local reward of one sampled action at a decision point: a check of what the action does at that state, not of
its text, in [0, 1]. `local_reward` gives it with the rule that decided it (`Verdict.reason`).

The rules (partial credits are patchgym.pivot.config.CreditConfig's):
- no parsable tool call (parse_tool_call's FormatError): 0 (format_error); another tool than the expert's: 0
  (other_tool). finish is the expert's tool only where the expert finished at that turn: there it earns 1 (finish).
- file_editor, where the expert edits (str_replace, insert, create) file F: the sampled edit is applied to F as it was
  at the state, with the editor's own rules (str_replace: old_str non-empty, different from new_str, found exactly
  once; insert: insert_line within the file; create: F must not exist). Leaving F exactly as the expert's edit left
  it earns 1 (edit_matches), whichever command did it; an edit of F that applies but leaves another text earns
  edit_valid (edit_valid); an edit that does not apply (edit_invalid), of another file (other_file) or another
  command such as view (other_command) earns 0.
- file_editor, where the expert views (or undoes an edit): the same command on the expert's path, or on the file the
  expert edits next, earns 1 (view_reaches); else 0. Paths are normalised against the workdir as the tools do.
- search: a search that would list the file the expert edits next (its term occurs in that file's text at the state
  and its path covers the file) earns 1 when its term contains the expert's term (search_reaches), search_finds_file
  for another term (search_finds_file); else 0 (search_misses). Where the expert edits no file later with the
  editor, the term must contain the expert's and the path cover the expert's.
- execute_bash: the command is run at the state in a real sandbox (patchgym.pivot.replay.SandboxBash, restored to
  the state after each sample). It runs when it exits 0, or with the expert's own status at that state (running the
  failing test before the fix exits 1 for the expert too) unless that status says the command could not run (124
  timed out, 126 not executable, 127 not found). Running with the expert's program (the first word, python's `-m`
  module included, version digits dropped: `python3 -m pytest` is `python -m pytest`) earns 1 (bash_same_program);
  running with another earns bash_runs; not running earns 0 (bash_fails).

How it could be gamed, and why that does not pay:
- Copying the expert's text is what imitation wants; the check only widens what counts as right (another old_str
  that gives the same file, another view range, another search term that reaches the file).
- A minimal edit that merely applies (a one-character old_str changed) earns edit_valid, never 1, and only on the
  expert's file; every other sample of the group that makes the expert's change earns more, so the advantage
  points at it. An edit elsewhere earns 0, so "edit anything that matches" is not rewarded.
- A generic search term ("def", "e") that happens to occur in the expert's file earns search_finds_file only.
- A command that always succeeds (`true`, `ls`) earns bash_runs, half; the full credit needs the expert's program
  to run, and `python -m pytest --version` would pass for it: the check cannot tell a test run from a trivial
  call of the same program. That gap is bounded: bash states are one or two of a trajectory's turns, and the
  agentic stage after this one is rewarded by the task's tests.
- A command that damages the workspace (`rm -rf .`) exits 0 and earns bash_runs; the next sample runs in a
  restored workspace, so it harms no other score, and nothing in the agentic stage rewards it.
- finish earns only where the expert finished; finishing early elsewhere is other_tool, 0.
- A reward needs the action to parse, so text that only looks like a call (a tool name in prose) earns 0.
"""

import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Protocol

from patchgym.env.tools.calls import FormatError, ToolCall, parse_tool_call
from patchgym.env.tools.text_edits import insert_after_line, occurrences, replace_at, split_lines
from patchgym.pivot.config import CreditConfig
from patchgym.pivot.states import EDITS, DecisionPoint

CANNOT_RUN = (124, 126, 127)  # timed out, not executable, not found


@dataclass(frozen=True)
class Verdict:
    """The reward of one sampled action and the rule that gave it (see the module docstring)."""

    reward: float
    reason: str


class BashCheck(Protocol):
    def exit_code(self, point: DecisionPoint, command: str) -> int | None:
        """The command's exit status at the point's state; None when it could not be run at all."""
        ...


class InvalidEdit(ValueError):
    """A file_editor edit the editor would refuse; the message says why."""


def local_reward(point: DecisionPoint, text: str, credit: CreditConfig | None = None,
                 bash: BashCheck | None = None) -> Verdict:
    """The reward of the action `text` sampled at `point`. `bash` runs commands at the state; it is needed only
    where the expert's call is execute_bash (a ValueError names the state otherwise)."""
    credit = credit or CreditConfig()
    try:
        call = parse_tool_call(text)
    except FormatError:
        return Verdict(0.0, "format_error")
    expert = point.call["name"]
    if call.name != expert:
        return Verdict(0.0, "other_tool")
    if expert == "finish":
        return Verdict(1.0, "finish")
    if expert == "file_editor":
        return _editor(point, call, credit)
    if expert == "search":
        return _search(point, call, credit)
    if bash is None:
        raise ValueError(f"state {point.key}: the expert runs a command there, and no bash check was given")
    return _bash(point, call, credit, bash)


def _editor(point: DecisionPoint, call: ToolCall, credit: CreditConfig) -> Verdict:
    expert, sampled = point.call["arguments"], call.arguments
    path = point.path(expert.get("path"))
    own = point.path(sampled.get("path"))
    if expert.get("command") not in EDITS:
        if sampled.get("command") == expert.get("command") and own is not None and own in (path, point.target):
            return Verdict(1.0, "view_reaches")
        return Verdict(0.0, "other_command" if sampled.get("command") != expert.get("command") else "other_file")
    if sampled.get("command") not in EDITS:
        return Verdict(0.0, "other_command")
    if own != path:
        return Verdict(0.0, "other_file")
    try:
        result = apply_edit(point.files.get(path), sampled)
    except InvalidEdit:
        return Verdict(0.0, "edit_invalid")
    if result == point.after.get(path):
        return Verdict(1.0, "edit_matches")
    return Verdict(credit.edit_valid, "edit_valid")


def apply_edit(text: str | None, args: dict) -> str:
    """The file's text after the editor's str_replace, insert or create (`text` None: the file does not exist), by
    the rules of the in-sandbox editor (patchgym/env/tools/sandbox_tools.py, whose text edits these are:
    env/tools/text_edits.py); InvalidEdit where it would refuse."""
    command = args.get("command")
    if command == "create":
        if text is not None:
            raise InvalidEdit("the file exists")
        new = args.get("file_text")
        if not isinstance(new, str):
            raise InvalidEdit("no file_text")
        return new if not new or new.endswith("\n") else new + "\n"
    if text is None:
        raise InvalidEdit("the file does not exist")
    if command == "str_replace":
        old, new = args.get("old_str"), args.get("new_str") or ""
        if not old or old == new:
            raise InvalidEdit("old_str is empty or the same as new_str")
        starts = occurrences(text, old)
        if len(starts) != 1:
            raise InvalidEdit("old_str does not occur exactly once")
        return replace_at(text, starts[0], old, new)
    if command == "insert":
        line, new = args.get("insert_line"), args.get("new_str")
        if not isinstance(line, int) or not isinstance(new, str) or not 0 <= line <= len(split_lines(text)):
            raise InvalidEdit("insert_line out of the file or new_str missing")
        return insert_after_line(text, line, new)
    raise InvalidEdit(f"{command!r} is no edit")


def _covers(scope: str, path: str) -> bool:
    return path == scope or path.startswith(scope.rstrip("/") + "/")


def _search(point: DecisionPoint, call: ToolCall, credit: CreditConfig) -> Verdict:
    term = call.arguments.get("search_term")
    expert_term = point.call["arguments"]["search_term"]
    scope = point.path(call.arguments.get("path")) or point.workdir
    if not isinstance(term, str) or not term or "\n" in term:
        return Verdict(0.0, "search_misses")
    if point.target is None:  # nothing to reach but the expert's own search
        expert_scope = point.path(point.call["arguments"].get("path")) or point.workdir
        if expert_term in term and _covers(scope, expert_scope):
            return Verdict(1.0, "search_reaches")
        return Verdict(0.0, "search_misses")
    text = point.files.get(point.target)
    if text is None or term not in text or not _covers(scope, point.target):
        return Verdict(0.0, "search_misses")
    if expert_term in term:
        return Verdict(1.0, "search_reaches")
    return Verdict(credit.search_finds_file, "search_finds_file")


def program(command: str) -> str | None:
    """The program a command line runs first: its first word's name without version digits (and a leading `env`
    or VAR=value words skipped), with python's `-m` module; None when it does not split as shell words."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return None
    while words and (words[0] == "env" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
        words = words[1:]
    if not words:
        return None
    name = re.sub(r"[\d.]+$", "", posixpath.basename(words[0])) or words[0]
    if name == "python" and "-m" in words[1:-1]:
        return f"python -m {words[words.index('-m') + 1]}"
    return name


def _bash(point: DecisionPoint, call: ToolCall, credit: CreditConfig, bash: BashCheck) -> Verdict:
    command = call.arguments["command"]
    code = bash.exit_code(point, command)
    expert_code = point.exit_code
    runs = code == 0 or (code is not None and code == expert_code and code not in CANNOT_RUN)
    if not runs:
        return Verdict(0.0, "bash_fails")
    if program(command) is not None and program(command) == program(point.call["arguments"]["command"]):
        return Verdict(1.0, "bash_same_program")
    return Verdict(credit.bash_runs, "bash_runs")
