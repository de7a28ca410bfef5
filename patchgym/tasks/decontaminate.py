"""Decontamination: drop training tasks whose repository appears in an evaluation set (as DeepSWE did)."""

import re
from collections.abc import Iterable

from patchgym.tasks.task import Task

# SWE-smith names its mirrors swesmith/<owner>__<repo>.<first 8 hex of the commit>.
_SMITH_MIRROR = re.compile(r"^swesmith/(?P<owner>[^/]+?)__(?P<name>[^/]+)\.[0-9a-f]{8}$")
_URL_PREFIX = re.compile(r"^(?:https?://|ssh://|git://)?(?:git@)?(?:www\.)?github\.com[/:]")


def repo_key(repo: str) -> str:
    """`owner/name` (or just `name` when no owner is known), lower case, from any common spelling of a repo."""
    key = _URL_PREFIX.sub("", repo.strip().lower()).strip("/").removesuffix(".git")
    if mirror := _SMITH_MIRROR.match(key):
        return f"{mirror['owner']}/{mirror['name']}"
    return key


def exclude_repos(tasks: Iterable[Task], eval_tasks: Iterable[Task]) -> tuple[list[Task], list[Task]]:
    """(kept, dropped): a task is dropped when its repo is one of the evaluation set's repos.

    A repo known only by name (R2E-Gym says `sympy`) matches any owner's repo of that name, and the other way round.
    """
    eval_keys = {repo_key(t.repo) for t in eval_tasks}
    eval_names = {k.rsplit("/", 1)[-1] for k in eval_keys}
    bare_eval_names = {k for k in eval_keys if "/" not in k}
    kept, dropped = [], []
    for task in tasks:
        key = repo_key(task.repo)
        name = key.rsplit("/", 1)[-1]
        hit = key in eval_keys or name in bare_eval_names or ("/" not in key and name in eval_names)
        (dropped if hit else kept).append(task)
    return kept, dropped
