"""Tasks: the record every stage shares, loaders for public datasets, and the offline task factory."""

from patchgym.tasks.task import Task, TaskError, read_tasks, write_tasks

__all__ = ["Task", "TaskError", "read_tasks", "write_tasks"]
