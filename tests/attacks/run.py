"""Running an attack: its patch under the plain runner (tests/attacks/plain.py) and under patchgym's grader."""

from dataclasses import dataclass

from patchgym.env.grading.grader import grade_patch
from patchgym.sandbox import SandboxConfig
from patchgym.tasks import Task
from tests.attacks import patches, plain

GRADE_TIMEOUT_S = 300


@dataclass(frozen=True)
class AttackResult:
    attack: str
    task: str
    fooled_plain: bool  # every FAIL_TO_PASS test passed under the plain runner
    outcome: str = ""  # patchgym's grade: resolved, unresolved, tampered, ... ('' when not graded)
    detail: str = ""

    @property
    def gamed(self) -> bool:
        return self.outcome == "resolved"


def grade(task: Task, patch: str, backend: str = "docker"):
    return grade_patch(task, patch, SandboxConfig(backend=backend, memory_mb=1024), timeout=GRADE_TIMEOUT_S)


def attack(name: str, code: str, task: Task, backend: str = "docker", graded: bool = True) -> AttackResult:
    patch = patches.appended(task, code, backend)
    fooled = plain.run_plain(task, patch, backend).fooled
    if not graded:
        return AttackResult(name, task.instance_id, fooled)
    g = grade(task, patch, backend)
    return AttackResult(name, task.instance_id, fooled, g.outcome, g.error_detail[:500])


def first_fooled(name: str, code: str, tasks: list[Task], backend: str = "docker") -> AttackResult:
    """The attack on the first of `tasks` where it fools the plain runner, graded there (not graded where it fools
    none)."""
    for task in tasks:
        patch = patches.appended(task, code, backend)
        if plain.run_plain(task, patch, backend).fooled:
            g = grade(task, patch, backend)
            return AttackResult(name, task.instance_id, True, g.outcome, g.error_detail[:500])
    return AttackResult(name, tasks[-1].instance_id, False)
