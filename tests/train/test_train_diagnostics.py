"""What a run tells its user, from hand-built batches: the share of groups with a non-zero advantage, the share of
trajectories ending in each termination, and the likely cause when every group has advantage 0."""

import pytest
import torch

from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.rl.config import load_preset
from patchgym.train.diagnostics import zero_advantage_cause, zero_advantage_warning
from patchgym.train.metrics import group_stats, termination_fractions
from patchgym.train.selection import group_of, select_training_batch


def trajectory(tid: str, resolved: bool, termination: str = "submitted") -> Trajectory:
    turn = Turn(prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2], finish_reason="stop", close_ids=[5],
                action="x", format_error=termination == "format_errors")
    return Trajectory(task_id=tid.split("#")[0], trajectory_id=tid, turns=[turn], termination=termination,
                      grade={"resolved": resolved})


def signal_of(batch: list[Trajectory]) -> dict:
    """The group statistics of `batch` as the trainer computes them (grpo++: RLOO advantages)."""
    _, advantages, _ = select_training_batch(batch, load_preset("grpo++"), 50, {})
    return group_stats([group_of(x) for x in batch if x.scored], advantages)


def test_the_share_of_groups_with_a_nonzero_advantage():
    assert group_stats(["a", "a", "b", "b", "c", "c", "c"], torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, 0.0, -0.5])) == {
        "groups": 3, "nonzero_advantage_group_fraction": pytest.approx(2 / 3)}
    assert group_stats([], torch.tensor([])) == {"groups": 0, "nonzero_advantage_group_fraction": 0.0}
    mixed = [trajectory("a#0", True), trajectory("a#1", False), trajectory("b#0", False), trajectory("b#1", False),
             trajectory("c#0", False, "infra_error"), trajectory("c#1", False, "infra_error")]
    assert signal_of(mixed) == {"groups": 2, "nonzero_advantage_group_fraction": 0.5}  # c is not scored


def test_the_share_of_trajectories_ending_in_each_termination():
    batch = [trajectory("a#0", True), trajectory("a#1", False, "format_errors"),
             trajectory("b#0", False, "format_errors"), trajectory("b#1", False, "max_steps")]
    shares = termination_fractions(batch)
    assert shares["submitted"] == 0.25 and shares["format_errors"] == 0.5 and shares["max_steps"] == 0.25
    assert shares["timeout"] == 0.0 and shares["infra_error"] == 0.0  # every reason is listed
    assert sum(shares.values()) == 1.0
    unfinished = Trajectory(task_id="c", trajectory_id="c#0", turns=[])
    assert termination_fractions([unfinished])["unfinished"] == 1.0
    assert set(termination_fractions([])) == set(shares) and not any(termination_fractions([]).values())


@pytest.mark.parametrize(("batch", "cause", "named"), [
    ([trajectory("a#0", False, "format_errors"), trajectory("a#1", False, "format_errors"),
      trajectory("b#0", False, "format_errors"), trajectory("b#1", False, "format_errors")],
     "format_errors", "Likely cause: format errors: every trajectory ended in format_errors"),
    ([trajectory("a#0", False, "max_steps"), trajectory("a#1", False, "format_errors"),
      trajectory("b#0", False), trajectory("b#1", False)],
     "all_unsolved", "Likely cause: all unsolved: no trajectory resolved its task"),
    ([trajectory("a#0", True), trajectory("a#1", True), trajectory("b#0", True), trajectory("b#1", True)],
     "all_solved", "Likely cause: all solved: every trajectory resolved its task"),
    ([trajectory("a#0", True), trajectory("a#1", True), trajectory("b#0", False), trajectory("b#1", False)],
     "uniform_groups", "Likely cause: uniform groups"),
])
def test_when_every_group_has_advantage_0_the_warning_names_the_likely_cause(batch, cause, named):
    assert signal_of(batch)["nonzero_advantage_group_fraction"] == 0.0
    assert zero_advantage_cause(batch) == cause
    message = zero_advantage_warning(3, batch)
    assert message.startswith("iteration 3: every group has advantage 0") and named in message, message
