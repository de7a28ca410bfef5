"""Pass@k, the eval summary, the paired gain and Student's t, on the worked numbers of docs/algorithms.md §7."""

import dataclasses
import json
import math

import pytest

from patchgym.agent.trajectory import Trajectory
from patchgym.eval.metrics import paired_gain, pass_at_k, summarize, t_critical


def test_pass_at_k_worked_example():
    # algorithms.md §7: n = 10, c = 3 -> pass@1 0.3, pass@5 0.91667, pass@10 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(0.91667, abs=1e-5)
    assert pass_at_k(10, 3, 10) == 1.0
    assert pass_at_k(4, 0, 2) == 0.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def traj(task: str, sample: int, resolved: bool, termination: str = "submitted") -> Trajectory:
    return Trajectory(task_id=task, trajectory_id=f"{task}#{sample}", sample=sample, termination=termination,
                      grade=None if termination == "infra_error" else {"resolved": resolved})


def test_pass_at_1_is_the_mean_over_runs_with_its_standard_error():
    # 2 tasks x 3 runs; run resolve rates 1/2, 1/2, 0 -> mean 1/3, sem = std([.5, .5, 0], ddof=1) / sqrt(3)
    results = [traj("a", 0, True), traj("b", 0, False), traj("a", 1, False), traj("b", 1, True),
               traj("a", 2, False), traj("b", 2, False, "max_steps")]
    s = summarize(results, runs=3)
    assert s["pass@1"] == pytest.approx(1 / 3) and s["pass@1_per_run"] == [0.5, 0.5, 0.0]
    assert s["pass@1_sem"] == pytest.approx(0.16667, abs=1e-4)
    assert s["pass@2"] == pytest.approx(2 / 3)  # each task: 1 of 3 correct -> 1 - C(2,2)/C(3,2) = 2/3
    assert s["pass@3"] == 1.0
    assert s["by_termination"]["max_steps"] == {"count": 1, "resolved": 0, "resolve_rate": 0.0}


def test_infra_errors_are_counted_and_left_out_of_every_rate():
    results = [traj("a", 0, True), traj("b", 0, False, "infra_error"), traj("a", 1, True), traj("b", 1, False)]
    s = summarize(results, runs=2)
    assert s["infra_errors"] == 1 and s["pass@1_per_run"] == [1.0, 0.5]
    assert s["pass@2"] == 1.0  # task b has one valid sample: too few for k = 2, so only a counts


def test_the_official_figure_counts_every_instance_and_the_graded_rate_only_graded_ones():
    def graded(task, **grade):
        return Trajectory(task_id=task, trajectory_id=f"{task}#0", termination="submitted", grade=grade)

    results = [graded("a", resolved=True), graded("b", resolved=False),
               Trajectory(task_id="c", trajectory_id="c#0", termination="infra_error", error="image missing",
                          grade={"error": "infra", "error_detail": "image missing"}),
               graded("d", error="no_tests_ran", tests_known_to_run=False, error_detail="collected nothing")]
    s = summarize(results, runs=1, instances=4)
    assert s["official_resolve_rate"] == 1 / 4 and s["graded"] == 2 and s["resolve_rate"] == 1 / 2
    assert s["excluded"] == [
        {"trajectory_id": "c#0", "task_id": "c", "sample": 0, "reason": "infra_error", "detail": "image missing"},
        {"trajectory_id": "d#0", "task_id": "d", "sample": 0, "reason": "unvalidated_no_tests",
         "detail": "collected nothing"}]
    assert s["infra_errors"] == 1
    assert s["grade_outcomes"] == {"infra": 1, "no_tests_ran": 1, "resolved": 1, "unresolved": 1}
    # the same no_tests_ran on a validated row is the patch's: scored 0, graded
    results[3] = graded("d", error="no_tests_ran", tests_known_to_run=True)
    s = summarize(results, runs=1, instances=4)
    assert s["official_resolve_rate"] == 1 / 4 and s["graded"] == 3 and s["resolve_rate"] == 1 / 3
    assert [e["task_id"] for e in s["excluded"]] == ["c"] and s["mean_reward"] == 1 / 3


def outcomes(*rates_of_four):
    """Per task, 4 attempts resolving `rate` x 4 of them."""
    return {f"t{i}": [k < rate * 4 for k in range(4)] for i, rate in enumerate(rates_of_four)}


def test_paired_gain_is_the_mean_of_per_task_differences_with_their_standard_error():
    # Every task gains exactly 0.25: se 0 and a gain. Unpaired, the two rates (0.375 and 0.625, each with se
    # sd([0, .25, .5, .75]) / 2 = 0.161) would need a margin of 2 sqrt(2) 0.161 = 0.456 > 0.25.
    same = paired_gain(outcomes(0, 0.25, 0.5, 0.75), outcomes(0.25, 0.5, 0.75, 1.0))
    assert (same.tasks, same.mean, same.se, same.two_se_significant) == (4, 0.25, 0.0, True)
    assert same.per_task == {"t0": 0.25, "t1": 0.25, "t2": 0.25, "t3": 0.25}
    # d = 0.5, 0, -0.25: mean 1/12, sd^2 = (0.41667^2 + 0.08333^2 + 0.33333^2) / 2 = 0.145833, se = sqrt(sd^2 / 3)
    mixed = paired_gain(outcomes(0, 0.5, 0.75), outcomes(0.5, 0.5, 0.5))
    assert mixed.mean == pytest.approx(1 / 12) and mixed.se == pytest.approx(0.220479, abs=1e-6)
    assert mixed.two_se_threshold == pytest.approx(0.440958, abs=1e-6) and not mixed.two_se_significant
    # Only tasks attempted in both count; one task is no evidence at all.
    partial = paired_gain({**outcomes(0, 0.5), "gone": [True]}, {**outcomes(1.0), "new": [True]})
    assert (partial.tasks, partial.mean, partial.se) == (1, 1.0, 0.0)
    assert not partial.two_se_significant and not partial.t_significant and partial.t_critical == math.inf
    assert paired_gain({}, {}).tasks == 0
    # Student's t at T - 1 degrees of freedom: with 3 tasks the margin is 4.303 se, not 2; a zero spread is no evidence.
    assert mixed.t_critical == pytest.approx(4.3027, abs=1e-4)
    assert mixed.t_threshold == pytest.approx(4.3027 * 0.220479, abs=1e-5) and not mixed.t_significant
    assert same.two_se_significant and not same.t_significant
    # d = 0.5, 0.5, 0.25, 0.25, 0.5 over 5 tasks: mean 0.4, sd^2 = (3 x 0.01 + 2 x 0.0225) / 4 = 0.01875, se = 0.061237
    clear = paired_gain(outcomes(0, 0, 0.25, 0.25, 0), outcomes(0.5, 0.5, 0.5, 0.5, 0.5))
    assert clear.se == pytest.approx(0.061237, abs=1e-6)
    assert clear.t_threshold == pytest.approx(2.7764 * 0.061237, abs=1e-5)
    assert clear.two_se_significant and clear.t_significant
    # A loss is never significant, however consistent.
    loss = paired_gain(outcomes(0.5, 0.75, 1.0), outcomes(0.25, 0.25, 0.5))
    assert not loss.two_se_significant and not loss.t_significant


def test_with_three_tasks_the_2_se_rule_calls_a_gain_that_students_t_does_not():
    # d = 0.5, 0.25, 0.25: mean 1/3, sd 0.14434, se 1/12. 2 se = 0.1667 < 1/3, but t(0.975, 2 df) se = 4.3027 / 12
    # = 0.3586 > 1/3: the 95 % interval of the mean gain, 1/3 ± 0.3586, reaches below 0.
    gain = paired_gain(outcomes(0, 0.25, 0.5), outcomes(0.5, 0.5, 0.75))
    assert gain.mean == pytest.approx(1 / 3) and gain.se == pytest.approx(1 / 12)
    assert gain.two_se_significant and gain.two_se_threshold == pytest.approx(1 / 6)
    assert not gain.t_significant and gain.t_threshold == pytest.approx(4.3027 / 12, abs=1e-5)
    # Over 7 tasks, d = 0.5 x 3 and 0.25 x 4: mean 0.35714, sd^2 = (3 x 0.14286^2 + 4 x 0.10714^2) / 6 = 0.017857,
    # se 0.050508; t(0.975, 6 df) = 2.4469 puts the margin at 0.12359, and the t-test agrees.
    wide = paired_gain(outcomes(0, 0.25, 0.5, 0, 0.25, 0.5, 0), outcomes(0.5, 0.5, 0.75, 0.5, 0.5, 0.75, 0.5))
    assert wide.se == pytest.approx(0.050508, abs=1e-6) and wide.t_critical == pytest.approx(2.4469, abs=1e-4)
    assert wide.t_significant and wide.two_se_significant


def test_paired_gain_is_a_frozen_record_whose_json_keeps_the_keys_learning_json_had():
    gain = paired_gain(outcomes(0, 0.25, 0.5), outcomes(0.5, 0.5, 0.75))
    with pytest.raises(dataclasses.FrozenInstanceError):
        gain.mean = 1.0
    record = json.loads(json.dumps(gain.as_dict()))
    assert record == {"tasks": 3, "mean": pytest.approx(1 / 3), "se": pytest.approx(1 / 12),
                      "threshold": pytest.approx(1 / 6), "significant": True,
                      "t_critical": pytest.approx(4.3027, abs=1e-4),
                      "t_threshold": pytest.approx(4.3027 / 12, abs=1e-5), "t_significant": False,
                      "per_task": {"t0": 0.5, "t1": 0.25, "t2": 0.25}}
    one = paired_gain({"a": [False]}, {"a": [True]}).as_dict()
    assert (one["t_critical"], one["t_threshold"], one["t_significant"]) == (None, None, False)


@pytest.mark.parametrize(("df", "critical"), [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (5, 2.5706),
                                              (10, 2.2281), (30, 2.0423), (60, 2.0003), (120, 1.9799)])
def test_t_critical_matches_the_printed_table_of_students_t(df, critical):
    # two-sided 95 % (the 0.975 quantile), as printed in any table of Student's t
    assert t_critical(df) == pytest.approx(critical, abs=1e-4)


def test_t_critical_reaches_the_normal_quantile_and_takes_other_levels():
    assert t_critical(100_000) == pytest.approx(1.95997, abs=1e-4)
    assert t_critical(1, confidence=0.5) == pytest.approx(1.0)  # P(|T| < 1) = 1/2 for the Cauchy distribution
    assert t_critical(9, confidence=0.99) == pytest.approx(3.2498, abs=1e-4)
    with pytest.raises(ValueError):
        t_critical(0)
