"""A train run's gain on the tasks of every iteration (patchgym.report.gain), against values computed by hand, and
where the report shows it."""

import pytest

from patchgym.report.gain import iteration_gain
from patchgym.report.html import summary_html
from patchgym.report.plots import RunData, task_gain


def rows(iteration: int, outcomes: dict[str, str], scored: bool = True) -> list[dict]:
    """Report rows of one iteration: task -> its attempts as a string of 1 (resolved) and 0."""
    return [{"iteration": iteration, "task_id": task, "resolved": c == "1", "scored": scored}
            for task, attempts in outcomes.items() for c in attempts]


def test_the_curve_and_paired_gain_over_the_tasks_of_every_iteration_match_hand_computed_values():
    before = (rows(1, {"a": "0010", "b": "0000", "c": "1010"})
              + rows(2, {"a": "0100", "b": "0000", "c": "1100", "d": "1111"})  # d: not in every iteration
              + rows(3, {"a": "1111"}, scored=False))  # infrastructure errors say nothing about the model
    result = iteration_gain(before + rows(3, {"a": "1101", "b": "0000", "c": "1110"}))
    assert result["tasks"] == ["a", "b", "c"]
    # iteration 1: rates 0.25, 0, 0.5 -> mean 0.25, sd 0.25, se 0.25 / sqrt(3)
    assert [p["iteration"] for p in result["curve"]] == [1, 2, 3]
    se = 3 ** -0.5 / 4
    assert result["curve"][0]["rate"] == pytest.approx(0.25) and result["curve"][0]["se"] == pytest.approx(se)
    assert result["curve"][2]["rate"] == pytest.approx(0.5)
    # per-task gains 0.5, 0, 0.25: mean 0.25, sd 0.25, se 0.1443, 2 se 0.2887 > 0.25
    gain = result["gain"]
    assert gain["mean"] == pytest.approx(0.25) and gain["se"] == pytest.approx(se) and not gain["significant"]
    assert result["verdict"] == ("iteration 1 -> 3: +25.0 ± 28.9 pts (2 standard errors) over 3 tasks, within noise "
                                 "(gain <= 2 standard errors)")

    # b resolved once in iteration 3: gains 0.5, 0.25, 0.25, mean 1/3, se 0.0833: above noise
    above = iteration_gain(before + rows(3, {"a": "1101", "b": "1000", "c": "1110"}))
    assert above["gain"]["mean"] == pytest.approx(1 / 3) and above["gain"]["se"] == pytest.approx(1 / 12)
    assert above["verdict"].endswith("+33.3 ± 16.7 pts (2 standard errors) over 3 tasks, above noise (gain > 2 "
                                     "standard errors)")


def test_runs_without_a_task_in_every_iteration_say_why_there_is_no_gain():
    assert "a gain needs the first and a later one" in iteration_gain(rows(1, {"a": "01"}))
    drawn = iteration_gain(rows(1, {"a": "01"}) + rows(2, {"b": "11"}))
    assert "tasks_per_iteration" in drawn and "no task was attempted in every iteration" in drawn


def test_a_train_report_plots_the_gain_and_states_its_verdict(tmp_path):
    trajectories = rows(1, {"a": "0010", "b": "0000", "c": "1010"}) + rows(2, {"a": "1101", "b": "0000", "c": "1110"})
    data = RunData(tmp_path, "train", metrics=[{"iteration": 1}, {"iteration": 2}], trajectories=trajectories)
    assert "iteration 1 -&gt; 2: +25.0 ± 28.9 pts" in summary_html(data)
    fig = task_gain(data)
    assert not isinstance(fig, str) and fig.axes[0].get_legend_handles_labels()[1][0].endswith("within noise (gain "
                                                                                                "<= 2 standard errors)")
    assert "only train runs" in task_gain(RunData(tmp_path, "eval"))
