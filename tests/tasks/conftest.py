"""Fixtures for the task tests: the classic harness worker's answers, kept for the session by their exact input."""

import copy
import json

import pytest

from patchgym.env.grading import harness_venv


@pytest.fixture(scope="session")
def harness_answers() -> dict[str, list[dict]]:
    """What swebench 4.1.0's worker answered, by the request it was sent (kind and rows, as JSON)."""
    return {}


@pytest.fixture(autouse=True)
def same_rows_derived_once(harness_answers, monkeypatch):
    """`harness_venv.derive` starts the classic harness worker, 3-6 s a call (it imports swebench and swesmith), and
    several tests send it the very same request: a row read from JSONL and the same row read from Parquet, the same
    row in test_loaders.py and test_specs.py. The worker's answer is a function of its request alone, so a request
    already answered in this session gets a copy of that answer; every distinct request still goes to the real
    worker, once. (The venv itself and the worker's failures are not cached: a call that raises keeps nothing.)"""
    real = harness_venv.derive

    def derive(kind: str, rows: list[dict]) -> list[dict]:
        key = json.dumps({"kind": kind, "rows": rows})  # the request derive sends the worker
        if key not in harness_answers:
            harness_answers[key] = real(kind, rows)
        return copy.deepcopy(harness_answers[key])  # callers fill in the answers' specs (the image, for one)

    monkeypatch.setattr(harness_venv, "derive", derive)
