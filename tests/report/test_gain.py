"""A train run's gain on the tasks of every iteration (patchgym.report.gain), against values computed by hand, and
where the report shows it."""

from pathlib import Path

import pytest

from patchgym.report.gain import IterationGain, NoIterationGain, iteration_gain
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
    assert isinstance(result, IterationGain) and list(result.gain.per_task) == ["a", "b", "c"]
    # iteration 1: rates 0.25, 0, 0.5 -> mean 0.25, sd 0.25, se 0.25 / sqrt(3)
    assert list(result.curve) == [1, 2, 3] and (result.first, result.last) == (1, 3)
    se = 3 ** -0.5 / 4
    assert result.curve[1].rate == pytest.approx(0.25) and result.curve[1].se == pytest.approx(se)
    assert result.curve[3].rate == pytest.approx(0.5) and result.curve[3].attempts == 12
    # per-task gains 0.5, 0, 0.25: mean 0.25, sd 0.25, se 0.1443, 2 se 0.2887 > 0.25; t(0.975, 2) se = 0.6211
    gain = result.gain
    assert gain.mean == pytest.approx(0.25) and gain.se == pytest.approx(se)
    assert not gain.two_se_significant and not gain.t_significant
    assert result.verdict == ("iteration 1 -> 3: +25.0 pts over 3 tasks (standard error 14.4), within noise by "
                              "Student's t at 95 % (gain <= 4.30 standard errors = 62.1 pts at 2 degrees of freedom)")
    assert result.two_se_verdict == ("iteration 1 -> 3: +25.0 ± 28.9 pts (2 standard errors) over 3 tasks, within "
                                     "noise by the 2-standard-error rule (gain <= 2 standard errors)")


def test_with_three_tasks_the_report_calls_noise_what_the_2_se_rule_calls_a_gain():
    # b resolved once in iteration 3: gains 0.5, 0.25, 0.25, mean 1/3, se 1/12: 2 se = 0.1667 < 1/3, but
    # t(0.975, 2 df) se = 4.3027 / 12 = 0.3586 > 1/3
    trajectories = rows(1, {"a": "0010", "b": "0000", "c": "1010"}) + rows(3, {"a": "1101", "b": "1000", "c": "1110"})
    result = iteration_gain(trajectories)
    assert result.gain.mean == pytest.approx(1 / 3) and result.gain.se == pytest.approx(1 / 12)
    assert result.gain.two_se_significant and not result.gain.t_significant
    assert result.verdict.endswith("+33.3 pts over 3 tasks (standard error 8.3), within noise by Student's t at 95 % "
                                   "(gain <= 4.30 standard errors = 35.9 pts at 2 degrees of freedom)")
    assert result.two_se_verdict.endswith("above noise by the 2-standard-error rule (gain > 2 standard errors)")
    page = summary_html(RunData(Path("run"), "train", metrics=[{"iteration": 1}, {"iteration": 3}],
                                trajectories=trajectories))
    assert "<td>gain on the tasks of every iteration</td><td>iteration 1 -&gt; 3: +33.3 pts" in page
    assert ("<td>the same gain, large-sample rule (too lenient with few tasks)</td><td>iteration 1 -&gt; 3: +33.3 ± "
            "16.7 pts (2 standard errors) over 3 tasks, above noise") in page


def test_every_task_changing_alike_is_no_evidence_for_students_t():
    result = iteration_gain(rows(1, {"a": "00", "b": "00"}) + rows(2, {"a": "01", "b": "01"}))
    assert (result.gain.mean, result.gain.se) == (0.5, 0.0) and not result.gain.t_significant
    assert result.verdict.endswith("within noise by Student's t (every task changed by the same amount: no spread "
                                   "to judge noise by)")


def test_runs_without_a_task_in_every_iteration_say_why_there_is_no_gain():
    with pytest.raises(NoIterationGain, match="a gain needs the first and a later one"):
        iteration_gain(rows(1, {"a": "01"}))
    with pytest.raises(NoIterationGain, match="no task was attempted in every iteration") as drawn:
        iteration_gain(rows(1, {"a": "01"}) + rows(2, {"b": "11"}))
    assert "tasks_per_iteration" in str(drawn.value)
    data = RunData(Path("run"), "train", metrics=[{"iteration": 1}], trajectories=rows(1, {"a": "01"}))
    assert "a gain needs the first and a later one" in summary_html(data) and isinstance(task_gain(data), str)


def test_a_train_report_plots_the_gain_and_states_its_verdict(tmp_path):
    trajectories = rows(1, {"a": "0010", "b": "0000", "c": "1010"}) + rows(2, {"a": "1101", "b": "0000", "c": "1110"})
    data = RunData(tmp_path, "train", metrics=[{"iteration": 1}, {"iteration": 2}], trajectories=trajectories)
    page = summary_html(data)
    assert "iteration 1 -&gt; 2: +25.0 pts over 3 tasks (standard error 14.4), within noise by Student&#x27;s t" in page
    assert "iteration 1 -&gt; 2: +25.0 ± 28.9 pts (2 standard errors)" in page
    fig = task_gain(data)
    assert not isinstance(fig, str) and fig.axes[0].get_legend_handles_labels()[1][0].endswith(
        "within noise by Student's t at 95 % (gain <= 4.30 standard errors = 62.1 pts at 2 degrees of freedom)")
    assert "only train runs" in task_gain(RunData(tmp_path, "eval"))
