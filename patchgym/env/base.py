"""The environment contract the agent loop and the rollout engine are written against, and what one step returns.

`SWEEnv` (a sandbox per episode) is the real one; anything with these five methods can stand in for it, such as
the in-memory environment of the fast test tier.
"""

from dataclasses import dataclass
from typing import Protocol

from patchgym.env.grading.grade import Grade
from patchgym.env.tools.calls import ToolCall
from patchgym.tasks import Task


@dataclass(frozen=True)
class StepResult:
    """What one step did. `call` is the tool call parsed from the action (parsed once, here), or None when the
    action held no valid call: then `format_error` says why, and is also the observation."""

    observation: str
    done: bool
    call: ToolCall | None = None
    format_error: str | None = None
    exit_code: int | None = None


class Env(Protocol):
    """One episode at a time: reset, steps until done, the patch, close. A SandboxError from any of them makes the
    episode an infrastructure error."""

    def reset(self, task: Task) -> str:
        """Start an episode of `task`; returns the first observation (the problem statement)."""
        ...

    def step(self, action_text: str) -> StepResult:
        """Parse the one tool call in `action_text` and run it."""
        ...

    def patch(self, max_bytes: int) -> str:
        """The agent's change so far, as a git diff; patchgym.sandbox.DiffTooLarge when it is over `max_bytes`."""
        ...

    def verify(self, threshold: float, score: str = "auto") -> Grade | None:
        """The episode's grade, taken from its own sandbox before it closes, where the task's grading family grades
        in place (Harbor: its verifier; `score` picks the score among named rewards, and a score at or over
        `threshold` resolves); None where the patch is graded in a fresh sandbox afterwards."""
        ...

    def close(self) -> None:
        """Release what the episode holds; safe to call twice and from any thread."""
        ...
