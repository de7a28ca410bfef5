"""The built-in grading families, one module each, registered as this package is imported; `family_of` finds a
task's (patchgym.env.grading.family has the protocol and the registry)."""

from patchgym.env.grading.families import harbor, imported, log, pytest_report, tape_report  # noqa: F401
from patchgym.env.grading.family import FAMILIES, GradingFamily, implied_family
from patchgym.registry import UnknownName
from patchgym.tasks.task import Task, TaskError


def family_of(task: Task) -> GradingFamily:
    """The family that grades `task`: the one it names, else the one its fields imply; a TaskError names the task
    and the known families when the name is unknown."""
    try:
        return FAMILIES[task.grading or implied_family(task)]
    except UnknownName as exc:
        raise TaskError(f"task {task.instance_id}: field grading: {exc}") from None
