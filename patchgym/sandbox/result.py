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
    side_channel: str = ""  # what the command wrote to its side channel (exec with `side_channel`), in order
    side_channel_overflow: bool = False  # it wrote more there than the limit; the rest was dropped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out
