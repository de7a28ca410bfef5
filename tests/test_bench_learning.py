"""bench/learning_stats.py, the arithmetic of bench/learning.py: resolve rates with their standard error over tasks."""

import importlib.util
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("learning_stats", BENCH / "learning_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rate_is_the_mean_over_tasks_and_its_error_is_over_tasks(learning):
    # task rates 1, 0.5, 0 -> p = 0.5; se = sqrt((0.25 + 0 + 0.25) / (3 * 2)) = sqrt(1/12)
    result = learning.resolve_rate({"a": [True, True], "b": [True, False], "c": [False, False]})
    assert result["rate"] == pytest.approx(0.5)
    assert result["se"] == pytest.approx(math.sqrt(1 / 12))
    assert (result["tasks"], result["attempts"], result["resolved"]) == (3, 6, 3)
    assert learning.resolve_rate({"a": [True, False]})["se"] == 0.0

