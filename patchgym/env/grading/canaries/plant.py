"""Planting a grade's canaries in its sandbox: which tests get copied, and the graded test files rewritten with them
(by root, after the hidden tests are in place and before anything of the patch runs)."""

import random
import re
import secrets

from patchgym.env.grading.canaries import Canary, javascript, python
from patchgym.sandbox import Sandbox
from patchgym.tasks.task import Task

# Tests of FAIL_TO_PASS copied per grade (a twin, an inverse and a mismatch each), and PASS_TO_PASS tests of the same
# files given an inverse and a mismatch: enough to catch forgery, cheap enough that a grade costs little more than the
# suite. A source is copied with all its parameter sets, so sources are taken quickest first (their time in the clean
# runs, where the task records it) within a budget of test time the copies may add.
MAX_SOURCES = 6
PASSING_INVERSES = 6
COPY_BUDGET_S = 0.15
UNTIMED_S = 0.005  # what a test whose time the task does not record is taken to cost
PER_COPY_S = 0.002  # what running one copied test costs besides its own time (collection, its result)


def _python_key(test: str) -> tuple[str, tuple]:
    parts = test.split("[", 1)[0].split("::")
    return parts[0], (tuple(parts[1:-1]), parts[-1])


def _javascript_key(test: str) -> tuple[str, tuple] | None:
    file, _, name = test.partition("::")
    return None if not name or re.search(r" #\d+$", name) else (file, (name,))


def _quickest_first(keys, cost: dict, rng: random.Random, most: int, copies: int, budget: list[float]) -> list:
    """Up to `most` of `keys`, quickest first (ties in `rng`'s order), while each one's `copies` copies fit in what
    is left of `budget` (a one-item list, spent as it goes)."""
    keys = sorted(keys)
    rng.shuffle(keys)
    keys.sort(key=lambda k: cost[k])
    taken = []
    for key in keys[:most]:
        if copies * cost[key] > budget[0]:
            break
        taken.append(key)
        budget[0] -= copies * cost[key]
    return taken


def targets(task: Task, javascript_tests: bool, rng: random.Random) -> dict[str, list[tuple]]:
    """file -> the tests to copy there: (key..., "both") for FAIL_TO_PASS ones, (key..., "inverse") for a few
    PASS_TO_PASS ones of the same files. When no failing test fits the budget, the quickest gets a twin alone (a
    copy that passes where it passes), and the passing tests take the budget."""
    key_of = _javascript_key if javascript_tests else _python_key
    cost: dict = {}
    for test in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]:
        key = key_of(test)
        if key is not None:
            cost[key] = cost.get(key, 0.0) + task.test_seconds.get(test, UNTIMED_S) + PER_COPY_S
    budget = [COPY_BUDGET_S]
    failing_keys = {k for k in map(key_of, task.FAIL_TO_PASS) if k is not None}
    failing = [(k, "both") for k in _quickest_first(failing_keys, cost, rng, MAX_SOURCES, 3, budget)]
    if not failing and failing_keys:
        failing = [(min(sorted(failing_keys), key=lambda k: cost[k]), "twin")]
    files = {file for (file, _), _ in failing}
    passing = _quickest_first({k for k in map(key_of, task.PASS_TO_PASS) if k is not None and k[0] in files}
                              - {k for k, _ in failing}, cost, rng, PASSING_INVERSES, 2, budget)
    chosen: dict[str, list[tuple]] = {}
    for (file, key), which in [*failing, *((k, "inverse") for k in passing)]:
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
    test of the task can take one.

    Which tests are copied is fixed by the task (so the factory, grading a task's gold patch once, knows that its
    copies behave); their names and order are drawn anew at every grade."""
    chooser, names = random.Random(task.instance_id), random.Random(secrets.randbits(64))
    planted = _plant(sandbox, task, targets(task, javascript_tests, chooser), javascript_tests, names)
    if not any(c.kind == "inverse" for c in planted):
        planted += _plant(sandbox, task, fallback_targets(task, javascript_tests, chooser), javascript_tests, names)
    return planted


def known_names(task: Task, javascript_tests: bool) -> frozenset[str]:
    """The names of the task's tests (a test method a class inherits is named only there): no canary takes one."""
    tests = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    if javascript_tests:
        return frozenset(t.split("::", 1)[-1].rsplit(" > ", 1)[-1] for t in tests)
    return frozenset(t.split("[", 1)[0].rsplit("::", 1)[-1] for t in tests)


def _plant(sandbox: Sandbox, task: Task, chosen_by_file: dict[str, list[tuple]], javascript_tests: bool,
           rng: random.Random) -> list[Canary]:
    planted = []
    known = known_names(task, javascript_tests)
    for file, chosen in chosen_by_file.items():
        path = f"{task.workdir}/{file}"
        try:
            text = sandbox.read_file(path).decode("utf-8")
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            continue
        if javascript_tests:
            new, canaries = javascript.plant(file, text, chosen, rng, known)
        else:
            new, canaries = python.plant(file, text, chosen, rng, known)
        if canaries:
            sandbox.write_file(path, new)
            planted += canaries
    return planted
