"""Why a trajectory ended: exactly one of these reasons each. A leaf, so the RL config can name the reasons without
importing the agent."""

from typing import Literal

Termination = Literal["submitted", "max_steps", "max_context", "timeout", "format_errors", "infra_error"]
