"""An in-memory Env for the fast test tier (`pytest -m "not sandbox"`): the agent loop and the rollout engine run
against it exactly as against SWEEnv, with no container, bubblewrap or process.

The repository is a dict of files. Tool calls are parsed by the real parser; `file_editor` view / create /
str_replace edit the dict, `execute_bash` answers "ok" (or what `bash` maps the command to), `finish` submits. The
patch is a unified diff of the changed files, and `memory_grade` resolves a patch iff it turns the task's files
into its fixed files.
"""

import difflib

from patchgym.env.base import StepResult
from patchgym.env.grading.grade import Grade
from patchgym.env.tools.calls import FormatError, parse_tool_call
from patchgym.sandbox import DiffFailed, DiffTooLarge, SandboxError, SandboxKilled
from patchgym.tasks import Task

BUGGY = {"calc.py": "def add(a, b):\n    return a - b\n"}
FIXED = {"calc.py": "def add(a, b):\n    return a + b\n"}


def diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style unified diff from `before` to `after`."""
    out = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path, ""), after.get(path, "")
        if old != new:
            out += difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")
    return "".join(out)


def memory_task(n: int = 0) -> Task:
    """A task whose repository is BUGGY and whose fix is FIXED."""
    return Task(instance_id=f"memory.calc.{n}", repo="memory", problem_statement="add subtracts",
                FAIL_TO_PASS=["test_calc.py::test_add"], patch=diff(BUGGY, FIXED), source="test")


def memory_grade(task: Task, patch: str, pools=None) -> Grade:
    """Resolved iff the patch is the task's fix."""
    resolved = patch == task.patch
    return Grade(instance_id=task.instance_id, resolved=resolved,
                 f2p={t: "PASSED" if resolved else "FAILED" for t in task.FAIL_TO_PASS})


class MemoryEnv:
    """The Env protocol over a dict of files. `die_on_step` makes that step (1-based) raise SandboxError, as a
    sandbox that died would; `killed_on_step` raises SandboxKilled, as one the agent's command killed; `bash` maps
    commands to (output, exit code); the command `break git` makes the patch fail as a broken git would."""

    def __init__(self, files: dict[str, str] | None = None, *, die_on_step: int | None = None,
                 killed_on_step: int | None = None, bash: dict[str, tuple[str, int]] | None = None):
        self.initial = dict(files or BUGGY)
        self.files: dict[str, str] = {}
        self.die_on_step, self.killed_on_step, self.bash = die_on_step, killed_on_step, bash or {}
        self.steps, self.closed, self.task, self.git_broken = 0, False, None, False

    def reset(self, task: Task) -> str:
        self.task, self.files, self.steps, self.closed = task, dict(self.initial), 0, False
        self.git_broken = False
        return task.problem_statement

    def step(self, action_text: str) -> StepResult:
        if self.closed:
            raise SandboxError("the memory env was closed")
        self.steps += 1
        if self.steps == self.die_on_step:
            raise SandboxError(f"the sandbox died at step {self.steps}")
        if self.steps == self.killed_on_step:
            raise SandboxKilled(f"the agent's command killed the sandbox at step {self.steps}")
        try:
            call = parse_tool_call(action_text)
        except FormatError as exc:
            return StepResult(str(exc), False, format_error=str(exc))
        if call.name == "finish":
            return StepResult("<<< Finished >>>", True, call=call)
        observation, code = self._run(call.name, call.arguments)
        return StepResult(observation, False, call=call, exit_code=code)

    def _run(self, name: str, args: dict) -> tuple[str, int]:
        if name == "execute_bash" and args["command"] == "break git":
            self.git_broken = True
        if name == "execute_bash":
            return self.bash.get(args["command"], ("ok", 0))
        if name == "search":
            hits = [p for p, text in self.files.items() if args["search_term"] in text]
            return "\n".join(hits) or "no matches", 0
        path = args.get("path", "").removeprefix("/testbed/")
        command = args.get("command")
        if command == "view":
            return (self.files[path], 0) if path in self.files else (f"no such file: {path}", 1)
        if command == "create":
            if path in self.files:
                return f"{path} exists", 1
            self.files[path] = args.get("file_text", "")
            return f"created {path}", 0
        if command == "str_replace":
            text = self.files.get(path, "")
            if text.count(args.get("old_str", "")) != 1:
                return "old_str must occur exactly once", 1
            self.files[path] = text.replace(args["old_str"], args.get("new_str", ""))
            return f"edited {path}", 0
        return f"unsupported: {name} {command}", 1

    def patch(self, max_bytes: int) -> str:
        if self.closed:
            raise SandboxError("the memory env was closed")
        if self.git_broken:
            raise DiffFailed("git diff failed: not a git repository")
        patch = diff(self.initial, self.files)
        if len(patch.encode()) > max_bytes:
            raise DiffTooLarge(len(patch.encode()), max_bytes)
        return patch

    def verify(self, threshold: float, score: str = "auto") -> None:
        return None  # its tasks are graded by their patch, afterwards

    def close(self) -> None:
        self.closed = True
