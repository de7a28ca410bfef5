"""Who owns a sandbox: the run id and owner stamp on every sandbox, the live registry, and closing all at exit.

A sandbox carries its owner as `host:pid:start_time`, so a reaper can tell a crashed run's leftovers (owner gone)
from a concurrent run's sandboxes (owner alive), even after the pid is reused.
"""

import atexit
import os
import socket
import threading
import uuid

_run_id: str | None = None
_strong: dict[str, object] = {}
_lock = threading.Lock()

LABEL_SANDBOX = "patchgym.sandbox"
LABEL_RUN = "patchgym.run"
LABEL_OWNER = "patchgym.owner"


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()


def owner_stamp() -> str:
    """This process as `host:pid:start_time`."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(stamp: str) -> bool:
    """False only when the stamp names a process on this host that no longer exists (or was replaced)."""
    host, _, rest = stamp.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's sandbox: not ours to judge
    return _start_time(int(pid)) == start


def run_id() -> str:
    """The id of this process's run, stamped on every sandbox it starts; set it to group sandboxes by run."""
    global _run_id
    if _run_id is None:
        _run_id = os.environ.get("PATCHGYM_RUN_ID") or uuid.uuid4().hex[:12]
    return _run_id


def set_run_id(value: str) -> None:
    global _run_id
    _run_id = value


def register(sandbox_id: str, sandbox: object) -> None:
    with _lock:
        _strong[sandbox_id] = sandbox


def unregister(sandbox_id: str) -> None:
    with _lock:
        _strong.pop(sandbox_id, None)


def live_sandboxes() -> list:
    with _lock:
        return list(_strong.values())


def close_all() -> None:
    """Close every sandbox this process still holds (normal exit, Ctrl-C, SystemExit from SIGTERM)."""
    threads = [threading.Thread(target=sb.close, daemon=True) for sb in live_sandboxes()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


# Run before the interpreter joins non-daemon threads (as concurrent.futures does): threads blocked in a sandbox
# command would otherwise keep the process alive after Ctrl-C, and plain atexit would never run.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(close_all)
atexit.register(close_all)
