"""patchgym.eval.metrics.resolve_rate, which bench/learning.py and the train report share: resolve rates with their
standard error over tasks."""

import math

import pytest

from patchgym.eval.metrics import resolve_rate


def test_the_rate_is_the_mean_over_tasks_and_its_error_is_over_tasks():
    # task rates 1, 0.5, 0 -> p = 0.5; se = sqrt((0.25 + 0 + 0.25) / (3 * 2)) = sqrt(1/12)
    result = resolve_rate({"a": [True, True], "b": [True, False], "c": [False, False]})
    assert result["rate"] == pytest.approx(0.5)
    assert result["se"] == pytest.approx(math.sqrt(1 / 12))
    assert (result["tasks"], result["attempts"], result["resolved"]) == (3, 6, 3)
    assert resolve_rate({"a": [True, False]})["se"] == 0.0
