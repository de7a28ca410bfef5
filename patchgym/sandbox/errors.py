"""The one error that means "the sandbox itself failed" (infrastructure), never "the agent's command failed"."""


class SandboxError(RuntimeError):
    """A sandbox that could not start, died, or stopped answering; trajectories hit by it are infra errors."""
