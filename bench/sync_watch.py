"""What a weight push costs beyond its time, watched from outside: the peak memory it adds (sampled every 10 ms:
the PSS of this process and of the engine's process group without their shared-memory pages, plus what /dev/shm
holds, so a file there counts once whether or not a process maps it; other users of /dev/shm on the machine add
noise) and whether a checkpoint file appeared (any *.safetensors in /dev/shm or the
temp dir, or one folder down, while it ran: where the old push wrote its checkpoint). Linux only: it reads /proc."""

import glob
import os
import tempfile
import threading

CHECKPOINT_GLOBS = tuple(os.path.join(root, *parts) for root in ("/dev/shm", tempfile.gettempdir())
                         for parts in (("*.safetensors",), ("*", "*.safetensors")))


def private_bytes(pid: int) -> int:
    """PSS without shared-memory pages (those are counted once, in shm_bytes)."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                key, _, value = line.partition(":")
                if key in ("Pss", "Pss_Shmem"):
                    fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return fields.get("Pss", 0) - fields.get("Pss_Shmem", 0)


def shm_bytes() -> int:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:  # field 5 of stat, after the state and the parent's pid
                    pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return pids


class SyncWatch:
    """`with SyncWatch(engine_pgid) as watch: push()`; then watch.peak_mb (added above the level before) and
    watch.checkpoint_written."""

    def __init__(self, pgid: int | None = None, interval_s: float = 0.01):
        self.pgid, self.interval_s = pgid, interval_s
        self.peak_mb, self.checkpoint_written = 0.0, False
        self._pids = [os.getpid()] + (group_pids(pgid) if pgid is not None else [])
        self._before = set(self._checkpoints())

    def __enter__(self) -> "SyncWatch":
        self._base = self._total()
        self._peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(0.0, (self._peak - self._base) / 2**20)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._total())
            if not self.checkpoint_written and set(self._checkpoints()) - self._before:
                self.checkpoint_written = True
            self._stop.wait(self.interval_s)
        self._peak = max(self._peak, self._total())

    def _total(self) -> int:
        return sum(private_bytes(pid) for pid in self._pids) + shm_bytes()

    @staticmethod
    def _checkpoints() -> list[str]:
        return [path for pattern in CHECKPOINT_GLOBS for path in glob.glob(pattern)]
