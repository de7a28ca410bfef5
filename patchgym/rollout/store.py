"""RUN/trajectories.jsonl: finished trajectories, one JSON line each, appended atomically as they complete.

A line is written with one write() on an O_APPEND descriptor and fsync'd, so readers and a crash see whole lines
only, except that a crash mid-write can cut the very last line: opening the store drops such a tail. A trajectory
recorded twice (an infra error rerun on resume) counts once: the last record wins.
"""

import threading
from pathlib import Path

from patchgym.agent.trajectory import Trajectory
from patchgym.files import append_line


class TrajectoryStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._records: dict[str, Trajectory] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = data if data.endswith(b"\n") or not data else data[: data.rfind(b"\n") + 1]
        if len(keep) != len(data):  # a line cut by a crash: drop it so the next append starts a fresh line
            with open(self.path, "r+b") as f:
                f.truncate(len(keep))
        for n, line in enumerate(keep.decode().splitlines(), 1):
            if line.strip():
                try:
                    record = Trajectory.model_validate_json(line)
                except ValueError as exc:
                    raise ValueError(f"{self.path}:{n}: not a trajectory record: {str(exc).splitlines()[0]}") from None
                self._records[record.trajectory_id or record.task_id] = record

    def append(self, trajectory: Trajectory) -> None:
        with self._lock:
            append_line(self.path, trajectory.model_dump_json())
            self._records[trajectory.trajectory_id or trajectory.task_id] = trajectory

    def finished(self) -> dict[str, Trajectory]:
        """Trajectories that need no rerun: everything recorded except infrastructure errors."""
        with self._lock:
            return {k: t for k, t in self._records.items() if t.termination != "infra_error"}

    def records(self) -> list[Trajectory]:
        """The latest record of each trajectory, in first-written order."""
        with self._lock:
            return list(self._records.values())
