"""Why a trajectory ended: exactly one of these reasons each. A leaf, so the RL config can name the reasons without
importing the agent.

`patch_too_large`: the final patch was over `agent.max_patch_bytes`, so it is neither kept nor graded (reward 0);
scored like any other ending but `infra_error`."""

from typing import Literal

# sandbox_killed: the sandbox died during one of the agent's own commands, of something inside it (reward 0);
# patch_too_large: the final patch is over agent.max_patch_bytes (reward 0, neither written nor graded);
# patch_failed: git could not diff the workspace in a sandbox that still answers (the agent broke it; reward 0);
# infra_error: a failure the agent did not cause (engine, host, image), never scored.
Termination = Literal["submitted", "max_steps", "max_context", "timeout", "format_errors", "sandbox_killed",
                      "patch_too_large", "patch_failed", "infra_error"]
# Endings that are the agent's outcome but leave nothing to grade: scored, reward 0, with no grade.
UNGRADED: tuple[str, ...] = ("sandbox_killed", "patch_too_large", "patch_failed")
