"""The sandbox contract, run against every backend (real containers, real bubblewrap + overlayfs)."""

import os
import socket
import stat
import threading
import time
import uuid

import pytest

from patchgym.sandbox import SandboxConfig, SandboxError, open_sandbox

LIMITS = dict(memory_mb=256, pids=128, cpus=1.0, exec_timeout_s=30)


@pytest.fixture
def sb(backend, base_image):
    with open_sandbox(SandboxConfig(backend=backend, **LIMITS), image=base_image) as sandbox:
        yield sandbox


def test_exec_merges_output_in_order_and_reports_exit_code(sb):
    r = sb.exec("echo one; echo two >&2; echo three; exit 3")
    assert r.output == "one\ntwo\nthree\n"
    assert r.exit_code == 3 and not r.timed_out and not r.ok
    assert 0 <= r.duration < 5


def test_exec_runs_in_workdir_with_env_and_argv(sb):
    assert sb.exec("pwd").output == "/testbed\n"
    assert sb.exec("pwd", cwd="/tmp").output == "/tmp\n"
    assert sb.exec("echo $GREETING", env={"GREETING": "hi there"}).output == "hi there\n"
    assert sb.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"]).output == "['a b', 'c']\n"
    missing = sb.exec(["no-such-program"])
    assert missing.exit_code == 127 and "no-such-program" in missing.output


def test_exec_has_the_image_tools(sb):
    r = sb.exec("python3 --version && git --version && pytest --version")
    assert r.ok, r.output
    assert "Python 3" in r.output and "git version" in r.output and "pytest" in r.output


def _running(sb, text: str) -> list[str]:
    """Pids inside the sandbox whose command line (arguments joined by spaces) contains `text`."""
    script = ("import os, sys\nfor p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
              "        cmd = open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\\0', b' ')"
              ".decode('utf-8', 'replace')\n"
              "    except OSError:\n        continue\n"
              "    if sys.argv[1] in cmd and p != str(os.getpid()):\n        print(p)")
    return sb.exec(["python3", "-c", script, text]).output.split()


def test_timeout_kills_the_whole_process_tree(sb):
    start = time.monotonic()
    r = sb.exec("sleep 301 & setsid sleep 302 & (sleep 303; echo never) ; echo never", timeout=1)
    assert r.timed_out and r.exit_code == 137
    assert "never" not in r.output and "timed out" in r.output
    assert time.monotonic() - start < 10
    for needle in ("sleep 301", "sleep 302", "sleep 303"):
        assert _running(sb, needle) == [], needle
    assert sb.exec("echo alive").output == "alive\n"


def test_background_process_does_not_block_the_answer(sb):
    start = time.monotonic()
    r = sb.exec("sleep 100 > /dev/null 2>&1 & sleep 200 & echo started")
    assert r.ok and r.output == "started\n"
    assert time.monotonic() - start < 5


_BOMB = "import os\nwhile True:\n try: os.fork()\n except OSError: pass"
_TERM_PROOF = ("import os, signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP): "
               "signal.signal(s, signal.SIG_IGN)\nif os.fork(): os._exit(0)\nos.setsid()\ntime.sleep(300)")
# Each outlives its command unless the runner kills what the command left: the marker names its processes.
ESCAPES = {
    "background writer": ("(while true; do echo x; sleep 0.01; done) & # pg-escape-writer", 2, "pg-escape-writer"),
    "detached fork bomb": (f"setsid python3 -c '{_BOMB}' pg-escape-bomb > /dev/null 2>&1 & sleep 1; echo started", 2,
                           "pg-escape-bomb"),
    "TERM-ignoring process": (f"python3 -c '{_TERM_PROOF}' pg-escape-term; sleep 60", 2, "pg-escape-term"),
}


@pytest.mark.parametrize("attack", list(ESCAPES))
def test_what_a_command_leaves_is_killed_within_its_timeout(sb, monkeypatch, attack):
    from patchgym.sandbox import base

    monkeypatch.setattr(base, "ANSWER_GRACE_S", 5.0)  # today's hang shows as a dead sandbox within seconds
    command, timeout, marker = ESCAPES[attack]
    start = time.monotonic()
    sb.exec(command, timeout=timeout)
    assert sb.exec("true").ok
    elapsed = time.monotonic() - start
    assert elapsed < timeout + 2, f"{attack}: the sandbox answered `true` {elapsed:.1f} s after the attack began"
    assert _running(sb, marker) == [], f"{attack}: its processes outlived the command"
    answer = time.monotonic()
    assert sb.exec("echo alive").output == "alive\n"
    assert time.monotonic() - answer < 1


def test_background_children_end_with_their_command(sb):
    r = sb.exec("(sleep 0.01; echo early) & sleep 304 > /dev/null 2>&1 & setsid sleep 305 & echo started; wait %1")
    assert r.ok and sorted(r.output.split()) == ["early", "started"], r.output
    for needle in ("sleep 304", "sleep 305"):
        assert _running(sb, needle) == [], needle


def test_huge_output_is_capped_without_blocking(sb):
    start = time.monotonic()
    r = sb.exec("head -c 1000000000 /dev/zero | tr '\\0' x; echo; echo END", output_limit=10_000, timeout=120)
    assert r.ok, r.output[-300:]
    assert r.cut_bytes > 999_000_000
    assert r.output.startswith("x" * 5000) and r.output.endswith("END\n")
    assert "bytes of output cut" in r.output and len(r.output) < 11_000
    assert time.monotonic() - start < 60


def test_files_round_trip_binary_safe(sb):
    data = bytes(range(256)) * 100
    sb.write_file("/testbed/deep/dir/blob.bin", data)
    assert sb.read_file("/testbed/deep/dir/blob.bin") == data
    sb.write_file("/testbed/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sb.exec("./run.sh").output == "ran\n"
    with pytest.raises(FileNotFoundError):
        sb.read_file("/testbed/missing.txt")


def test_copy_in_keeps_tree_modes_and_links(sb, tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "a.py").write_text("A = 1\n")
    (tmp_path / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (tmp_path / "tool.sh").chmod(0o755)
    os.symlink("pkg/sub/a.py", tmp_path / "link.py")
    sb.copy_in(tmp_path, "/testbed/project")
    assert sb.exec("cat link.py && ./tool.sh", cwd="/testbed/project").output == "A = 1\ntool\n"
    mode = int(sb.exec("stat -c %a /testbed/project/tool.sh").output)
    assert mode & stat.S_IXUSR


def test_diff_includes_new_deleted_and_binary_files(sb):
    setup = ("git init -q . && printf 'a\\nb\\n' > keep.txt && echo bye > gone.txt && echo t > tests.txt "
             "&& git add -A && git commit -qm base")
    assert sb.exec(setup).ok
    sb.exec("printf 'a\\nB\\n' > keep.txt && rm gone.txt && echo new > new.txt && printf '\\0\\1' > b.bin "
            "&& echo changed > tests.txt")
    patch = sb.diff("HEAD", exclude=("tests.txt",))
    assert "+B" in patch and "-b" in patch
    assert "new file mode" in patch and "+new" in patch
    assert "deleted file mode" in patch and "-bye" in patch
    assert "GIT binary patch" in patch
    assert "tests.txt" not in patch
    assert sb.exec("git status --porcelain").output.count("??") == 2, "diff must not touch the agent's index"


def test_close_is_idempotent_and_final(backend, base_image):
    sandbox = open_sandbox(SandboxConfig(backend=backend, **LIMITS), image=base_image)
    sandbox.close()
    sandbox.close()
    with pytest.raises(SandboxError, match="closed"):
        sandbox.exec("true")


def test_runner_death_is_an_infrastructure_error(sb):
    with pytest.raises(SandboxError):
        sb.exec("kill -9 $PPID; sleep 5")
    with pytest.raises(SandboxError):
        sb.exec("true")


def _runner_host_pid(sb) -> int:
    """The runner's pid on the host: the process in the sandbox's pid namespace that has the runner's pid there."""
    inside = sb._request("ping", 10)["pid"]
    namespace = sb.exec("readlink /proc/self/ns/pid").output.strip()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != namespace:
                continue
            with open(f"/proc/{pid}/status") as f:
                nspid = next(line for line in f if line.startswith("NSpid:")).split()
        except OSError:
            continue
        if int(nspid[-1]) == inside:
            return int(pid)
    raise AssertionError(f"no host process is the runner of {sb.id}")


def test_a_runner_that_dies_inside_during_an_agent_command_is_the_agents_doing(sb):
    """The agent's own commands can no longer signal the runner (tests/sandbox/test_agent_user.py); what is left is
    a death the engine did not cause, as the memory limit or a crash would be: here a SIGKILL by pid from the host,
    which no engine logs."""
    from patchgym.sandbox import SandboxKilled

    threading.Timer(1.0, os.kill, [_runner_host_pid(sb), 9]).start()
    with pytest.raises(SandboxKilled, match="during the agent's command"):
        sb.exec("sleep 30", agent=True)


def test_a_sandbox_killed_from_outside_during_an_agent_command_is_an_infrastructure_error(sb, kill_from_outside):
    from patchgym.sandbox import SandboxKilled

    threading.Timer(1.0, kill_from_outside, [sb]).start()
    with pytest.raises(SandboxError) as raised:
        sb.exec("sleep 30", agent=True)
    assert not isinstance(raised.value, SandboxKilled), raised.value


def test_close_from_another_thread_interrupts_a_running_command(sb):
    threading.Timer(0.5, sb.close).start()
    start = time.monotonic()
    with pytest.raises(SandboxError):
        sb.exec("sleep 60")
    assert time.monotonic() - start < 10


def test_no_network(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        probe = ("import socket\ns=socket.socket(); s.settimeout(3)\n"
                 f"try:\n s.connect(('127.0.0.1', {port})); print('connected')\n"
                 "except OSError as e: print('refused', e)")
        assert sb.exec(["python3", "-c", probe]).output.startswith("refused")
    finally:
        server.close()
    if sb.backend == "kubernetes":
        # A pod always has an interface: its isolation is a deny-all NetworkPolicy selecting it, which only an
        # enforcing CNI plugin applies (the test cluster's bridge plugin does not).
        from test_kubernetes import assert_denied_by_policy

        assert_denied_by_policy(sb)
        return
    interfaces = sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1").output.split()
    assert interfaces == ["lo"]


def test_host_files_are_out_of_reach(sb, base_image):
    marker = f"/root/patchgym-host-secret-{uuid.uuid4().hex}"
    open(marker, "w").write("secret")
    try:
        assert sb.exec(f"test -e {marker}").exit_code == 1
    finally:
        os.unlink(marker)
    assert sb.exec("echo mine > /etc/patchgym-written-inside").ok
    assert not os.path.exists("/etc/patchgym-written-inside")
    with open_sandbox(SandboxConfig(backend=sb.backend, **LIMITS), image=base_image) as other:
        assert other.exec("test -e /etc/patchgym-written-inside").exit_code == 1, "sandboxes must not share writes"


def test_fork_bomb_is_contained(sb):
    bomb = "import os\nwhile True:  # fork bomb\n try: os.fork()\n except OSError: pass"
    r = sb.exec(["python3", "-c", bomb], timeout=5)
    assert r.timed_out and r.exit_code == 137
    assert _running(sb, "# fork bomb") == []
    assert sb.exec("echo survived").output == "survived\n"


def test_memory_limit_kills_and_reports(sb):
    r = sb.exec(["python3", "-c", "x = b'x' * (1024 * 2**20); print('allocated')"], timeout=60)
    assert "allocated" not in r.output
    assert r.exit_code == 137 and r.oom_killed, r
    assert "out of memory" in r.output
    huge = sb.exec(["python3", "-c", "x = bytearray(30 * 2**30); print('allocated')"], timeout=60)
    assert "allocated" not in huge.output and huge.exit_code != 0
    assert sb.exec("echo survived").output == "survived\n"


def test_cpu_limit(backend, base_image):
    with open_sandbox(SandboxConfig(backend=backend, **{**LIMITS, "cpus": 0.5}), image=base_image) as sandbox:
        script = ("import time\nw=time.time(); c=time.process_time()\nwhile time.time()-w<2: pass\n"
                  "print((time.process_time()-c)/(time.time()-w))")
        share = float(sandbox.exec(["python3", "-c", script]).output)
    assert share < 0.7, f"a 0.5-CPU sandbox got {share:.2f} of a core"


def test_unknown_backend_is_a_clear_error():
    from patchgym.sandbox import backend_class

    with pytest.raises(ValueError, match="unknown sandbox backend 'dockr'.*docker, local"):
        SandboxConfig(backend="dockr")
    with pytest.raises(SandboxError, match="cannot load sandbox backend 'nowhere.mod:Box'"):
        backend_class("nowhere.mod:Box")


def test_missing_image_names_the_fix(backend):
    with pytest.raises(SandboxError, match="patchgym-no-such-image.*build"):
        open_sandbox(SandboxConfig(backend=backend), image="patchgym-no-such-image:0")


def test_diff_sees_a_same_size_edit_in_the_commits_own_second(sb):
    # Same size, same mtime second as the committed file: only git's racy-entry check (which needs the index's
    # own mtime) tells the edit apart, and the diff is taken a second later.
    for i in range(2):
        r = sb.exec(f"mkdir r{i} && cd r{i} && git init -q . && echo 'a - b' > f.txt && git add -A "
                    "&& git commit -qm base && echo 'a + b' > f.txt && sleep 1.1")
        assert r.ok, r.output
        assert "+a + b" in sb.diff(cwd=f"/testbed/r{i}"), f"attempt {i}"


def test_a_runner_that_stops_answering_is_an_infrastructure_error(sb, monkeypatch):
    from patchgym.sandbox import base

    monkeypatch.setattr(base, "ANSWER_GRACE_S", 2.0)
    start = time.monotonic()
    with pytest.raises(SandboxError, match="no answer from the sandbox"):
        sb.exec("kill -STOP $PPID", timeout=1)
    assert time.monotonic() - start < 10


def test_no_docker_engine_names_the_fix(monkeypatch):
    from patchgym.sandbox.docker import docker_client

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/patchgym-docker.sock")
    docker_client.cache_clear()
    try:
        with pytest.raises(SandboxError, match="no Docker engine answers.*dockerd.*sandbox.backend=local"):
            open_sandbox(SandboxConfig(backend="docker"))
    finally:
        monkeypatch.undo()
        docker_client.cache_clear()
