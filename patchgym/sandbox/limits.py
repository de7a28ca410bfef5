"""Memory, process and CPU limits for daemon-less sandboxes, as cgroups (v1 or v2) under `patchgym/<sandbox id>`."""

import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


def cgroup_version() -> int | None:
    """2 for the unified hierarchy, 1 for per-controller mounts we can write, None when we cannot use either."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2 if os.access(CGROUP_ROOT, os.W_OK) else None
    if all(os.access(CGROUP_ROOT / c, os.W_OK) for c in V1_CONTROLLERS):
        return 1
    return None


def parent_dirs(version: int | None = None) -> list[Path]:
    """Where patchgym's sandbox cgroups live (one per v1 controller, or one unified)."""
    version = version or cgroup_version()
    if version == 2:
        return [CGROUP_ROOT / "patchgym"]
    if version == 1:
        return [CGROUP_ROOT / c / "patchgym" for c in V1_CONTROLLERS]
    return []


def oom_kill_count(dirs: list[Path]) -> int | None:
    """The `oom_kill` counter of the first of `dirs` that has one (v1 memory.oom_control, v2 memory.events)."""
    for d in dirs:
        for name in ("memory.oom_control", "memory.events"):
            try:
                text = (d / name).read_text()
            except OSError:
                continue
            if (count := parse_oom_kill(text)) is not None:
                return count
    return None


def parse_oom_kill(text: str) -> int | None:
    """The `oom_kill` counter in the text of a memory.oom_control (v1) or memory.events (v2) file."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


class Cgroup:
    """The cgroup(s) of one sandbox: created with its limits, joined by the sandbox's first process, removed after."""

    def __init__(self, name: str, *, memory_mb: int, pids: int, cpus: float):
        self.version = cgroup_version()
        if self.version is None:
            raise PermissionError("cannot write cgroups under /sys/fs/cgroup (run as root, or use the docker backend)")
        self.dirs = [parent / name for parent in parent_dirs(self.version)]
        memory = str(memory_mb * 2**20)
        quota = str(int(cpus * CPU_PERIOD_US))
        if self.version == 2:
            parent = self.dirs[0].parent
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            self.dirs[0].mkdir()
            self._write(self.dirs[0], {"memory.max": memory, "memory.swap.max": "0", "pids.max": str(pids),
                                       "cpu.max": f"{quota} {CPU_PERIOD_US}"})
        else:
            settings = {"memory": {"memory.limit_in_bytes": memory},
                        "pids": {"pids.max": str(pids)},
                        "cpu": {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": quota}}
            for d, controller in zip(self.dirs, V1_CONTROLLERS):
                d.mkdir(parents=True, exist_ok=True)
                self._write(d, settings[controller])

    @staticmethod
    def _write(d: Path, values: dict[str, str]) -> None:
        for key, value in values.items():
            try:
                (d / key).write_text(value)
            except FileNotFoundError:
                if key != "memory.swap.max":  # absent when the kernel has no swap accounting
                    raise

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int | None:
        return oom_kill_count(self.dirs)

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill whatever is still inside, then remove the cgroup directories."""
        remove_cgroup_dirs(self.dirs, timeout)


def remove_cgroup_dirs(dirs: list[Path], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    for d in dirs:
        while d.exists():
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
