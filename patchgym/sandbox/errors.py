"""The one error that means "the sandbox itself failed" (infrastructure), never "the agent's command failed"."""


class SandboxError(RuntimeError):
    """A sandbox that could not start, died, or stopped answering; trajectories hit by it are infra errors."""


class SandboxKilled(SandboxError):
    """The sandbox died during one of the agent's own commands, of something inside it: the agent's doing, so the
    trajectory's outcome (`sandbox_killed`, reward 0), not an infrastructure error."""
