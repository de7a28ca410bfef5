"""Planting a grade's canaries in its sandbox: which tests get copied, and the graded test files rewritten with them
(by root, after the hidden tests are in place and before anything of the patch runs)."""

import random
import re
import secrets

from patchgym.env.grading.canaries import Canary, javascript, python
from patchgym.sandbox import Sandbox
from patchgym.tasks import Task

# Tests of FAIL_TO_PASS copied per grade (a twin and an inverse each), and PASS_TO_PASS tests of the same files given
# an inverse: enough to catch forgery, few enough that a grade costs little more than the suite.
MAX_SOURCES = 6
PASSING_INVERSES = 2


def _python_key(test: str) -> tuple[str, tuple]:
    parts = test.split("[", 1)[0].split("::")
    return parts[0], (tuple(parts[1:-1]), parts[-1])


def _javascript_key(test: str) -> tuple[str, tuple] | None:
    file, _, name = test.partition("::")
    return None if not name or re.search(r" #\d+$", name) else (file, (name,))


def targets(task: Task, javascript_tests: bool, rng: random.Random) -> dict[str, list[tuple]]:
    """file -> the tests to copy there: (key..., "both") for FAIL_TO_PASS ones, (key..., "inverse") for a few
    PASS_TO_PASS ones of the same files."""
    key_of = _javascript_key if javascript_tests else _python_key
    failing = sorted({k for k in map(key_of, task.FAIL_TO_PASS) if k is not None})
    failing = rng.sample(failing, min(len(failing), MAX_SOURCES))
    files = {file for file, _ in failing}
    passing = sorted({k for k in map(key_of, task.PASS_TO_PASS) if k is not None and k[0] in files} - set(failing))
    passing = rng.sample(passing, min(len(passing), PASSING_INVERSES))
    chosen: dict[str, list[tuple]] = {}
    for (file, key), which in [*((k, "both") for k in failing), *((k, "inverse") for k in passing)]:
        chosen.setdefault(file, []).append((*key, which))
    return chosen


def fallback_targets(task: Task, javascript_tests: bool, rng: random.Random) -> dict[str, list[tuple]]:
    """file -> PASS_TO_PASS tests of any file to give an inverse, when the graded files took none (their tests
    have no assertion whose negation is exact, or sit in a planned tape test)."""
    key_of = _javascript_key if javascript_tests else _python_key
    passing = sorted({k for k in map(key_of, task.PASS_TO_PASS) if k is not None})
    chosen: dict[str, list[tuple]] = {}
    for file, key in rng.sample(passing, min(len(passing), MAX_SOURCES)):
        chosen.setdefault(file, []).append((*key, "inverse"))
    return chosen


def plant_canaries(sandbox: Sandbox, task: Task, javascript_tests: bool) -> list[Canary]:
    """Rewrite the graded test files in `sandbox` with canaries; return them. There is always an inverse where any
    test of the task can take one."""
    rng = random.Random(secrets.randbits(64))
    planted = _plant(sandbox, task, targets(task, javascript_tests, rng), javascript_tests, rng)
    if not any(c.kind == "inverse" for c in planted):
        planted += _plant(sandbox, task, fallback_targets(task, javascript_tests, rng), javascript_tests, rng)
    return planted


def _plant(sandbox: Sandbox, task: Task, chosen_by_file: dict[str, list[tuple]], javascript_tests: bool,
           rng: random.Random) -> list[Canary]:
    planted = []
    for file, chosen in chosen_by_file.items():
        path = f"{task.workdir}/{file}"
        try:
            text = sandbox.read_file(path).decode("utf-8")
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            continue
        if javascript_tests:
            new, canaries = javascript.plant(file, text, chosen, rng)
        else:
            new, canaries = python.plant(file, text, chosen, rng)
        if canaries:
            sandbox.write_file(path, new)
            planted += canaries
    return planted
