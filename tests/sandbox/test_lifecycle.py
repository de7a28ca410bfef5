"""Nothing leaks: Ctrl-C or SIGKILL during 8 concurrent sandboxes, and the reaper for crashed runs' leftovers."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from patchgym.sandbox import SandboxConfig, lifecycle, open_sandbox
from patchgym.sandbox.reaper import leftovers, reap

CHILD = r"""
import sys, threading
from patchgym.sandbox import SandboxConfig, lifecycle, open_sandbox
lifecycle.set_run_id(sys.argv[2])
config = SandboxConfig(backend=sys.argv[1], memory_mb=256, pids=128)
ready = threading.Barrier(9, timeout=120)

def work():
    with open_sandbox(config) as sb:
        ready.wait()
        sb.exec("sleep 600", timeout=700)

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
print("ready", flush=True)
for t in threads:
    t.join()
"""


def _start_child(backend: str, run: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD, backend, run], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    assert len([x for x in leftovers(run) if x.startswith(("container", "directory", "pod"))]) == 8
    return child


def _wait_clean(run: str, seconds: float, kinds: tuple[str, ...] = ("",)) -> list[str]:
    """Leftovers of `run` of the given kinds, once none remain or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while (left := [x for x in leftovers(run) if x.startswith(kinds)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_ctrl_c_during_8_concurrent_sandboxes_leaves_nothing(backend):
    run = f"leak-int-{uuid.uuid4().hex[:8]}"
    child = _start_child(backend, run)
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=60) != 0
    assert _wait_clean(run, 10) == []


def test_sigkill_leaves_only_what_the_reaper_removes(backend):
    run = f"leak-kill-{uuid.uuid4().hex[:8]}"
    child = _start_child(backend, run)
    child.kill()
    child.wait()
    # Containers remove themselves (runner sees end of file, AutoRemove); local processes and mounts die with
    # their namespaces. Only on-disk scratch, cgroups and pods (their PID 1 lives on) need the reaper.
    assert _wait_clean(run, 20, ("container", "process", "mount")) == []
    reap()
    assert leftovers(run) == []


def test_reaper_spares_live_owners(backend, base_image):
    with open_sandbox(SandboxConfig(backend=backend), image=base_image) as sb:
        reap()
        assert sb.exec("echo still here").output == "still here\n"


@pytest.mark.parametrize("stamp, alive", [
    (lambda: lifecycle.owner_stamp(), True),
    (lambda: f"{os.uname().nodename}:999999999:1", False),
    (lambda: f"{os.uname().nodename}:{os.getpid()}:1", False),  # pid reused by another process
    (lambda: "another-host:1:1", True),
])
def test_owner_alive(stamp, alive):
    assert lifecycle.owner_alive(stamp()) is alive
