"""The reward: grade a patch in a fresh sandbox, the way the task's grading family grades it.

Which family grades a row is the row's `grading` (patchgym.env.grading.family lists them, one module each under
families/). Every family's verdict reads per-test statuses: resolved iff every FAIL_TO_PASS and every PASS_TO_PASS
test passed by the family's rule (skipped or missing counts as failed). A patch that does not apply, a dead sandbox,
a timeout or a run with no sign that the suite ran is an `error`, reported as such, never a silent 0; a run that shows
forgery, where the family checks for it, is `tampered`.

A task whose family grades in place (Harbor) has no patch to grade here: its verifier runs in the agent's own sandbox
as the episode ends (`Env.verify`).
"""

import time

from patchgym.env.grading import steps
from patchgym.env.grading.families import family_of
from patchgym.env.grading.grade import Grade
from patchgym.sandbox import SandboxConfig, SandboxError, open_sandbox
from patchgym.sandbox.pool import PoolSet
from patchgym.tasks.task import Task, TaskError


def grade_patch(task: Task, patch: str, config: SandboxConfig | None = None, *, timeout: float = 300.0,
                retries: int = 1, pools: PoolSet | None = None) -> Grade:
    """Grade `patch` for `task` in a fresh sandbox (from `pools` when given, so warm ones skip the start).

    A dead sandbox is retried `retries` times before the grade is an `infra` error; a task graded in place is a
    TaskError.
    """
    family = family_of(task)
    if family.in_place:
        raise TaskError(f"task {task.instance_id} is graded in place ({family.name}): its verifier grades the agent's "
                        "sandbox as the episode ends, not a patch (check it with `patchgym eval --policy oracle`)")
    config = config or SandboxConfig()
    start = time.monotonic()
    image = task.image or None
    for _ in range(retries + 1):
        try:
            with pools.sandbox(image) if pools else open_sandbox(config, image=image) as sandbox:
                steps.make_grader_dir(sandbox)
                grade = family.grade(sandbox, task, patch, timeout)
            break
        except SandboxError as exc:
            grade = Grade(instance_id=task.instance_id, error="infra", error_detail=str(exc))
    grade.duration = time.monotonic() - start
    grade.tests_known_to_run = not task.imported or task.validated
    return grade
