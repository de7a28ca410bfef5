"""Why a trajectory ended: exactly one of these reasons each. A leaf, so the RL config can name the reasons without
importing the agent.

`patch_too_large`: the final patch was over `agent.max_patch_bytes`, so it is neither kept nor graded (reward 0);
scored like any other ending but `infra_error`."""

from typing import Literal

Termination = Literal["submitted", "max_steps", "max_context", "timeout", "format_errors",
                      "patch_too_large", "infra_error"]
