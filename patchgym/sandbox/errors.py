"""The one error that means "the sandbox itself failed" (infrastructure), never "the agent's command failed", and
the agent's diff that is too large to read back."""


class SandboxError(RuntimeError):
    """A sandbox that could not start, died, or stopped answering; trajectories hit by it are infra errors."""


class DiffTooLarge(Exception):
    """The workspace's diff is over the limit it was read with; only its size came back from the sandbox."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"the diff is {size} bytes, over the limit of {limit}")
        self.size, self.limit = size, limit


class DiffFailed(RuntimeError):
    """git could not diff the workspace in a sandbox that still answers: what the agent did to it (deleted git,
    the snapshot, the disk) is the cause, so it is the trajectory's outcome (`patch_failed`, reward 0)."""


class SandboxKilled(SandboxError):
    """The sandbox died during one of the agent's own commands, of something inside it: the agent's doing, so the
    trajectory's outcome (`sandbox_killed`, reward 0), not an infrastructure error."""
