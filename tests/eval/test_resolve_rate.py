"""patchgym.eval.metrics.mean_task_resolve_rate, which bench/learning.py and the train report share: the mean of
per-task resolve rates with its standard error over tasks, beside summary.json's resolve_rate over trajectories."""

import dataclasses
import math

import pytest

from patchgym.agent.trajectory import Trajectory
from patchgym.eval.metrics import MeanTaskRate, mean_task_resolve_rate, summarize


def test_the_rate_is_the_mean_over_tasks_and_its_error_is_over_tasks():
    # task rates 1, 0.5, 0 -> p = 0.5; se = sqrt((0.25 + 0 + 0.25) / (3 * 2)) = sqrt(1/12)
    result = mean_task_resolve_rate({"a": [True, True], "b": [True, False], "c": [False, False]})
    assert isinstance(result, MeanTaskRate)
    assert result.rate == pytest.approx(0.5)
    assert result.se == pytest.approx(math.sqrt(1 / 12))
    assert (result.tasks, result.attempts, result.resolved) == (3, 6, 3)
    assert mean_task_resolve_rate({"a": [True, False]}).se == 0.0
    assert result.as_dict() == {"rate": result.rate, "se": result.se, "tasks": 3, "attempts": 6, "resolved": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.rate = 1.0


def test_tasks_weigh_alike_where_summary_resolve_rate_weighs_trajectories_alike():
    # a: 1 of 1 attempts, b: 1 of 3: over tasks (1 + 1/3) / 2 = 2/3; over trajectories 2 / 4 = 1/2
    flags = {"a": [True], "b": [True, False, False]}
    assert mean_task_resolve_rate(flags).rate == pytest.approx(2 / 3)
    trajectories = [Trajectory(task_id=task, sample=i, grade={"resolved": resolved})
                    for task, outcomes in flags.items() for i, resolved in enumerate(outcomes)]
    assert summarize(trajectories, runs=3)["resolve_rate"] == pytest.approx(1 / 2)
