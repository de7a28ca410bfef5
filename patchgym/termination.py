"""Why a trajectory ended: exactly one of these reasons each. A leaf, so the RL config can name the reasons without
importing the agent."""

from typing import Literal

# sandbox_killed: the sandbox died during one of the agent's own commands, of something inside it (reward 0);
# infra_error: a failure the agent did not cause (engine, host, image), never scored.
Termination = Literal["submitted", "max_steps", "max_context", "timeout", "format_errors", "sandbox_killed",
                      "infra_error"]
