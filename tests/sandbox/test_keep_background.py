"""A sandbox whose background processes live on (`keep_background`, a Harbor task's) and whose commands may have
directories of their own (`private_mounts`, the Harbor verifier's): on each backend that can run them."""

import time

import pytest

from patchgym.sandbox import SandboxConfig, open_sandbox

CAP_SYS_ADMIN, CAP_AUDIT_WRITE = 21, 29


def caps(sandbox, agent=False) -> dict[str, int]:
    lines = sandbox.exec("grep ^Cap /proc/self/status", agent=agent, timeout=30).output.split()
    return {lines[i].rstrip(":"): int(lines[i + 1], 16) for i in range(0, len(lines), 2)}


@pytest.fixture
def living(backend):
    config = SandboxConfig(backend=backend, keep_background=True, private_mounts=True)
    with open_sandbox(config.model_copy(update={"agent_user": 0})) as sandbox:  # root, as a Harbor agent may be
        yield sandbox


def test_what_a_command_leaves_running_lives_and_only_a_command_that_times_out_loses_its_tree(living):
    started = living.exec("sleep 300 & (while :; do echo tick; sleep 0.1; done) & echo started", timeout=30)
    assert started.ok and "started" in started.output and started.duration < 5
    late = living.exec("sh -c 'sleep 301' & sleep 100", timeout=1)
    assert late.timed_out
    time.sleep(0.5)
    running = living.exec("ps -eo args", timeout=30).output
    assert "sleep 300" in running and "echo tick" in running  # the ticker still writes: its pipe is read
    assert "sleep 301" not in running and "sleep 100" not in running


def test_commands_never_hold_the_runners_capability_and_the_agents_cannot_trace_the_verifiers(living):
    if not living.isolates:
        pytest.skip(f"the {living.backend} backend gives no command a mount namespace of its own")
    root, agent = caps(living), caps(living, agent=True)
    for held in (root, agent):
        assert not held["CapBnd"] & (1 << CAP_SYS_ADMIN) and not held["CapEff"] & (1 << CAP_SYS_ADMIN)
    assert root["CapEff"] & (1 << CAP_AUDIT_WRITE) and not agent["CapBnd"] & (1 << CAP_AUDIT_WRITE)
    # A root process of the agent's may not read or trace a process that holds more than it does.
    living.exec("sleep 200 &", timeout=30)  # root's, with CAP_AUDIT_WRITE
    pid = living.exec("pgrep -xo sleep", timeout=30).output.strip()
    peek = living.exec(f"ls /proc/{pid}/root/ && cat /proc/{pid}/environ", agent=True, timeout=30)
    assert not peek.ok and "Permission denied" in peek.output


def test_a_private_directory_is_seen_only_by_its_command_and_read_through_its_descriptor(living):
    if not living.isolates:
        pytest.skip(f"the {living.backend} backend gives no command a mount namespace of its own")
    living.exec("mkdir -p /logs/verifier && echo outside > /logs/verifier/reward.txt", agent=True, timeout=30)
    inside = living.exec("cat /logs/verifier/given; ls /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                         "mv /logs /logs.moved && mkdir -p /logs/verifier && echo 0.5 > /logs/verifier/reward.txt; "
                         "cat /proc/self/fd/4/reward.txt", timeout=30,
                         private=[{"path": "/logs/verifier", "files": {"given": "aGVsbG8K"}, "fd": 4}])
    # Inside: only what it was given; its own descriptor still reaches its directory after the path was moved.
    assert inside.output.split() == ["hello", "given", "1"], inside.output
    outside = living.exec("cat /logs.moved/verifier/reward.txt /logs/verifier/reward.txt", timeout=30)
    assert outside.output.split() == ["outside", "0.5"]  # the tmpfs was never there for anyone else
