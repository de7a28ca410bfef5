"""Why an iteration gave the policy nothing to learn: when every group's advantage is 0, the likely cause, read off
the batch's terminations and rewards, and what to change (the trainer warns once, naming it)."""

from collections.abc import Sequence
from typing import Literal

from patchgym.agent.trajectory import Trajectory

ZeroAdvantageCause = Literal["format_errors", "all_unsolved", "all_solved", "uniform_groups"]

ADVICE: dict[ZeroAdvantageCause, str] = {
    "format_errors": "every trajectory ended in format_errors: the model never wrote a tool call the agent parses, so "
                     "nothing resolves; warm-start it on demonstrations (train.warm_start) or check the chat template "
                     "and agent.tool_format",
    "all_unsolved": "no trajectory resolved its task: the tasks are too hard for this policy; warm-start it "
                    "(train.warm_start), give it more turns (agent.max_steps), or train on easier tasks",
    "all_solved": "every trajectory resolved its task: the tasks are too easy to learn from; train on harder ones "
                  "or filter solved tasks out with a curriculum (algorithm.stages)",
    "uniform_groups": "each task's samples all resolved or all failed alike: raise train.samples_per_task or the "
                      "sampling temperature (agent.sampling.temperature) so that a group's outcomes differ",
}


def zero_advantage_cause(trajectories: Sequence[Trajectory]) -> ZeroAdvantageCause:
    """The likely reason a batch whose groups all have advantage 0 holds nothing to learn from."""
    scored = [t for t in trajectories if t.scored]
    if scored and all(t.termination == "format_errors" for t in scored):
        return "format_errors"
    if not any(t.resolved for t in scored):
        return "all_unsolved"
    if all(t.resolved for t in scored):
        return "all_solved"
    return "uniform_groups"


def zero_advantage_warning(iteration: int, trajectories: Sequence[Trajectory]) -> str:
    """The message of the trainer's warning for `iteration`, whose batch is `trajectories`."""
    scored = [t for t in trajectories if t.scored]
    cause = zero_advantage_cause(trajectories)
    counts = (f"{sum(t.resolved for t in scored)} of {len(scored)} resolved, "
              f"{sum(t.termination == 'format_errors' for t in scored)} ended in format_errors")
    return (f"iteration {iteration}: every group has advantage 0, so the update learns nothing ({counts}). "
            f"Likely cause: {cause.replace('_', ' ')}: {ADVICE[cause]}")
