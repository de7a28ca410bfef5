"""Canaries: tests the grader plants in a task's graded test files, with outcomes it knows from those of the tests
they copy, named and placed like the tests around them, so that code forging results inside the test process gives
itself away.

- A *twin* is a copy of a test under another name: it must pass exactly when its source passes. Forging a result
  by test name leaves the twin's honest one beside it.
- An *inverse* is a copy whose last top-level assertion is negated: when its source passes, it must fail. Forging
  every result, hollowing test bodies, neutering assertions, swallowing failures or marking tests xfail makes both
  pass.
- A *mismatch* (Python) is a copy whose last equality assertion expects `[R]` where its source expects `R`: when
  the source passes it must fail, unless what the code returned says it equals anything.

Canaries are planted fresh at every grade, with random names; planting is a text edit of the test file (Python's
`ast`, tree-sitter's JavaScript grammar), so the file keeps its own code, and a canary runs what its source runs.
"""

from dataclasses import dataclass
from typing import Literal

PASSING = ("PASSED", "XFAIL")
JUDGED = ("PASSED", "XFAIL", "FAILED", "ERROR")


@dataclass(frozen=True)
class Canary:
    """One planted test: `planted` is the id of the test it copies (`source`) with the canary's name instead."""

    kind: Literal["twin", "inverse", "mismatch"]
    source: str
    planted: str


def _runs_of(test_id: str, statuses: dict[str, str]) -> dict[str, str]:
    """Every result of `test_id` in `statuses`, by the suffix after it ('' itself; '[a-1]' a parameter set)."""
    return {key[len(test_id):]: status for key, status in statuses.items()
            if key == test_id or (key.startswith(test_id) and key[len(test_id)] == "[")}


def is_planted(test_id: str, canaries: list[Canary]) -> bool:
    """Whether `test_id` is a canary's (a parameter set of one, or a test nested in one, included)."""
    return any(test_id == c.planted or test_id.startswith((c.planted + "[", c.planted + " > ")) for c in canaries)


def judge(canaries: list[Canary], statuses: dict[str, str]) -> list[str]:
    """What the canaries' results say about the run, one line per broken expectation; [] when none is."""
    problems = []
    for canary in canaries:
        planted = _runs_of(canary.planted, statuses)
        for suffix, source in _runs_of(canary.source, statuses).items():
            if source not in JUDGED:
                continue
            mine = planted.get(suffix, "MISSING")
            if canary.kind == "twin":
                broken = mine not in JUDGED or (mine in PASSING) != (source in PASSING)
            else:
                broken = source in PASSING and mine not in ("FAILED", "ERROR")
            if broken:
                problems.append(f"{canary.planted}{suffix}, a planted {canary.kind} of {canary.source}{suffix}, "
                                f"gave {mine} where its source gave {source}: the tests' process does not report what "
                                "its tests do")
    return problems


def without_planted(statuses: dict[str, str], canaries: list[Canary]) -> dict[str, str]:
    """`statuses` without the canaries' results."""
    return {test: status for test, status in statuses.items() if not is_planted(test, canaries)}
