"""What one command in a sandbox gave back."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecResult:
    output: str  # stdout and stderr merged in the order they were written; head and tail kept when over the cap
    exit_code: int  # 128 + N when killed by signal N, as bash reports it
    timed_out: bool
    duration: float  # seconds, measured inside the sandbox
    cut_bytes: int = 0  # output bytes dropped from the middle
    signal: int | None = None
    oom_killed: bool = False  # the sandbox's memory limit killed the command

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out
