"""The in-sandbox runner: one long-lived, stdlib-only process that runs commands and file operations on request.

A backend starts it once per sandbox (`python3 -c SOURCE`) and talks to it over stdin/stdout with one JSON object
per line, so a command costs about a fork/exec instead of a `docker exec`. Timeouts, killing the whole process
tree and capping output happen here, next to the command (with process_tree.py, whose source SOURCE carries). Keep
it compatible with old Pythons (3.6+): it runs on whatever interpreter the task image has.

Nothing a command starts outlives it: the runner is a child subreaper, so even a process that detached itself
(setsid, double fork) stays below it, and when the command exits or times out every process below the runner is
killed, its output pipe read to the end within a bounded time, and the zombies reaped. Started with the option
`keep` (a Harbor task's sandbox, where "start this service" is a task), what a command leaves running lives on, as
do the services the image's ENTRYPOINT started before us; only a command that times out has its own process tree
killed.

Started with the option `isolate` (its sandbox holds CAP_SYS_ADMIN for this alone), the runner keeps that
capability to itself: every command loses it, and the agent's commands lose CAP_SYS_PTRACE and CAP_AUDIT_WRITE too,
so that no process of the agent's may trace or read a process that holds the latter (the kernel lets one process
trace another of the same uid only when it holds CAP_SYS_PTRACE or every capability the other holds).

A request with `private` runs its command in a mount namespace of its own, with an empty tmpfs at each of the paths
it names (and the files it gives written there): what the agent left running cannot see those paths, nor write what
the command writes there (the verifier's reward).

The runner stays root; a request with a `user` runs its command as that uid and gid instead (the agent's
commands), so the command can signal neither the runner nor anything else of root's, and cannot write what root
keeps (the base snapshot). The uid needs no /etc/passwd entry: HOME, USER and LOGNAME are set for it.

A request with `side_channel` gives the command one more descriptor, SIDE_CHANNEL_FD, the write end of a pipe whose
other end only the runner holds: what the command writes there comes back apart from its output (a test report that
leaves the tested process as it is written, out of reach of that process and of anything it starts).
"""

import base64
import fcntl
import io
import json
import os
import select
import signal
import subprocess
import sys
import time

# In a sandbox this line is process_tree.py's source (sandbox/standalone.py): the runner starts as one script.
from patchgym.sandbox.process_tree import (
    OutputCap,
    become_subreaper,
    descendants,
    kill_leftovers,
    kill_tree,
    processes,
    reap,
    signal_quietly,
)

PROTOCOL = 1
READ_CHUNK = 65536
# After the command itself exits, background children may still hold its output pipe open: take what they write
# until the pipe is quiet this long, or at most DRAIN_MAX_S, then kill them.
DRAIN_AFTER_EXIT_S = 0.05
DRAIN_MAX_S = 0.5
# Once everything is killed the pipe ends at once; this bounds the wait if it somehow does not.
DRAIN_AFTER_KILL_S = 1.0
# Commands run this much nicer than the runner, so that it still gets the CPU to kill a fork bomb at once. Only
# the sandbox's own processes compete here: each sandbox has its own CPU share (its cgroup).
COMMAND_NICE = 10
# The home of a command run as another user (`%d`: its uid), outside the workspace so it never shows in the diff.
AGENT_HOME = "/tmp/home-%d"
# The descriptor a command with a channel writes its side channel to; the runner keeps its own descriptors at
# LOW_FDS and above, so that this one is free to give.
SIDE_CHANNEL_FD = 3
LOW_FDS = 10
# Variables of the runner's own (the host's bookkeeping) that no command inherits.
PRIVATE_ENV_PREFIX = "PATCHGYM_"
# Linux capabilities and calls of the `isolate` option (linux/capability.h, sched.h, mount.h, prctl.h).
CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_AUDIT_WRITE = 19, 21, 29
CAPS_VERSION_3 = 0x20080522
PR_CAPBSET_DROP = 24
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
# The descriptor a `private` command gets for each private directory that asks for one, from this number up: the
# directory itself, however its path is renamed or relinked while the command runs.
PRIVATE_FD = 4


def lower_priority():
    """In a command's process, before exec: nicer than the runner, and the memory limit's first victim (so the
    runner survives a command that exhausts it)."""
    os.nice(COMMAND_NICE)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def agent_env(uid):
    """HOME (created, owned by `uid`), USER and LOGNAME for a uid that the image may not know."""
    try:
        import pwd

        name = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        name = "agent"
    home = AGENT_HOME % uid
    if not os.path.lexists(home):  # whatever the user made of it since is theirs (no command of theirs runs now)
        os.mkdir(home, 0o755)
        os.lchown(home, uid, uid)
    return {"HOME": home, "USER": name, "LOGNAME": name}


def libc():
    import ctypes  # here: an interpreter without ctypes still runs every command that needs none of this

    return ctypes.CDLL(None, use_errno=True)


def check(result, what):
    import ctypes

    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, "%s: %s" % (what, os.strerror(code)))


def holds(cap):
    """Whether this process has `cap` in its effective set."""
    import ctypes

    header, data = (ctypes.c_uint32 * 2)(CAPS_VERSION_3, 0), (ctypes.c_uint32 * 6)()
    check(libc().capget(header, data), "capget")
    return bool(data[3 * (cap // 32)] & (1 << (cap % 32)))


def drop_caps(caps):
    """Drop `caps` from this process's bounding, effective, permitted and inheritable sets, for good (no exec of a
    setuid file can give them back: the bounding set caps what any exec grants)."""
    import ctypes

    c = libc()
    for cap in caps:
        check(c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(PR_CAPBSET_DROP)")
    header, data = (ctypes.c_uint32 * 2)(CAPS_VERSION_3, 0), (ctypes.c_uint32 * 6)()
    check(c.capget(header, data), "capget")
    for cap in caps:
        for i in range(3):
            data[3 * (cap // 32) + i] &= ~(1 << (cap % 32)) & 0xFFFFFFFF
    check(c.capset(header, data), "capset")


def can_isolate():
    """Whether a child of ours can have a mount namespace of its own (CAP_SYS_ADMIN, and no policy against it)."""
    try:
        if not holds(CAP_SYS_ADMIN):
            return False
    except (OSError, AttributeError, ImportError):
        return False
    pid = os.fork()
    if pid == 0:
        try:
            check(libc().unshare(CLONE_NEWNS), "unshare")
            check(libc().mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount")
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def enter_private(dirs):
    """In a command's process before exec: a mount namespace of its own, with an empty tmpfs at each directory of
    `dirs` ({path, uid, files, fd}): owned by `uid` where given, `files` (name -> base64) written into it, and held
    open as descriptor `fd` where given."""
    c = libc()
    check(c.unshare(CLONE_NEWNS), "unshare")
    check(c.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for spec in dirs:
        path = spec["path"]
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            os.unlink(path)  # ours to replace: the agent's link or file where the directory belongs
        if not os.path.isdir(path):
            os.makedirs(path)
        check(c.mount(b"tmpfs", path.encode(), b"tmpfs", 0, b"mode=0755"), "mount tmpfs on %s" % path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        for name, data in sorted((spec.get("files") or {}).items()):
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd)
            with os.fdopen(out, "wb") as f:
                f.write(base64.b64decode(data))
        if spec.get("uid") is not None:
            os.fchown(fd, spec["uid"], spec["uid"])
        if spec.get("fd") == fd:
            os.set_inheritable(fd, True)
            continue
        if spec.get("fd") is not None:
            os.dup2(fd, spec["fd"])  # inheritable
        os.close(fd)


def command_setup(uid, private=None):
    """What a command's process does before exec: lower its priority; with `private`, enter its own mount namespace
    (enter_private); under `isolate`, give up CAP_SYS_ADMIN (and CAP_SYS_PTRACE and CAP_AUDIT_WRITE for a command
    with a uid: the agent's); given a uid, become that user (uid and gid alike, no supplementary groups)."""
    def setup():
        lower_priority()
        if private:
            enter_private(private)
        if OPTIONS.get("isolate"):
            drop_caps([CAP_SYS_ADMIN] + ([CAP_SYS_PTRACE, CAP_AUDIT_WRITE] if uid is not None else []))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return setup


def end_command(proc):
    """Kill a command that is over (it exited or timed out) and, unless background processes live on (`keep`),
    everything below us. Under `keep`, a command that exited is left as it is; one that timed out loses its process
    group and every process below it."""
    if not OPTIONS.get("keep"):
        kill_tree(proc, ALONE)
        return
    if proc.poll() is None:
        tree = descendants(proc.pid)
        signal_quietly(os.killpg, proc.pid)
        signal_quietly(os.kill, proc.pid)
        for pid, _ in tree:
            signal_quietly(os.kill, pid)
    proc.wait()
    reap()


def hand_over(fd):
    """Under `keep`: a command's output pipe that its background processes still hold, read to its end and thrown
    away by a process of its own (it lives on with them), so that they are never stopped by a full or closed pipe."""
    if os.fork() == 0:
        try:
            os.setsid()
            os.closerange(0, fd)  # nothing of the runner's (its protocol's pipes) may live on in this process
            os.closerange(fd + 1, 65536)
            while os.read(fd, READ_CHUNK):
                pass
        finally:
            os._exit(0)


class Requests(object):
    """Request lines from the host. While a command runs we watch them too: end of file means our host is gone."""

    def __init__(self, fd):
        self.fd = fd
        self.buffer = bytearray()

    def poll(self):
        """Read what the host sent; False at end of file."""
        chunk = os.read(self.fd, READ_CHUNK)
        self.buffer += chunk
        return bool(chunk)

    def __iter__(self):
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                yield line
            elif not self.poll():
                return


REQUESTS = None
# The runner's start options (its second argument, JSON): keep, isolate (see the module's docstring).
OPTIONS = {}
# True under `isolate` when a command can have a mount namespace of its own.
ISOLATE = False
# True when, at start, the runner saw no process but itself and PID 1: its own pid namespace (every backend gives
# it one). Only then may it kill(-1); on a host that would reach far more than its commands.
ALONE = False


def high_fd(fd):
    """`fd` moved to LOW_FDS or above (not inherited), so the low numbers stay free for what commands are given."""
    if fd >= LOW_FDS:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, LOW_FDS)
    os.set_inheritable(moved, False)
    os.close(fd)
    return moved


class SideChannel(object):
    """The read end of a command's side channel and what came through it, at most `limit` bytes."""

    def __init__(self, limit):
        read, write = os.pipe()
        self.fd = high_fd(read)
        write = high_fd(write)
        os.dup2(write, SIDE_CHANNEL_FD)  # inheritable: the command gets it (pass_fds), then the runner lets go of it
        os.close(write)
        self.limit = limit
        self.data = bytearray()
        self.overflow = False

    def add(self, chunk):
        room = self.limit - len(self.data)
        self.data += chunk[:max(room, 0)]
        self.overflow = self.overflow or len(chunk) > room

    def reply(self):
        return {"side_channel": self.data.decode("utf-8", "replace"), "side_channel_overflow": self.overflow}


def read_available(fd, cap, timeout, proc=None, channel=None):
    """Read whatever `fd` yields within `timeout`; False once it reached end of file. `fd` None: only watch the host.
    `channel`: also take what the command's side channel holds, until it ends (then its fd is None)."""
    side = channel.fd if channel is not None else None
    watch = [f for f in (fd, side, REQUESTS.fd if REQUESTS else None) if f is not None]
    ready, _, _ = select.select(watch, [], [], timeout)
    if REQUESTS and REQUESTS.fd in ready and not REQUESTS.poll():
        # Nobody will read the answer (the host died or closed us): stop the command and leave with it.
        if proc is not None:
            end_command(proc)
        os._exit(0)
    if side is not None and side in ready:
        chunk = os.read(side, READ_CHUNK)
        if chunk:
            channel.add(chunk)
        else:
            os.close(side)
            channel.fd = None
    if fd is None or fd not in ready:
        return True
    chunk = os.read(fd, READ_CHUNK)
    if not chunk:
        return False
    cap.add(chunk)
    return True


def run_command(req):
    cmd = req["cmd"]
    argv = ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else cmd
    if argv[0] == "/bin/bash" and not os.path.exists("/bin/bash"):
        argv[0] = "/bin/sh"
    uid = req.get("user")
    if uid is not None and os.geteuid() != 0:
        raise PermissionError("the runner runs as uid %d, not root: it cannot run a command as uid %d"
                              % (os.geteuid(), uid))
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIX))
    if uid is not None:
        env.update(agent_env(uid))
    env.update(req.get("env") or {})
    timeout = req.get("timeout")
    cap = OutputCap(int(req.get("limit") or 262144))
    start = time.monotonic()
    if OPTIONS.get("keep"):
        reap()
    else:
        kill_leftovers(ALONE)  # in case an earlier cleanup ran out of time
    private = req.get("private")
    if private and not ISOLATE:
        raise PermissionError("this sandbox cannot give a command private directories (it was started without "
                              "the isolate option, or CAP_SYS_ADMIN, or a policy forbids mount namespaces)")
    channel = SideChannel(int(req["side_channel"])) if req.get("side_channel") else None
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=req.get("cwd") or None, env=env, start_new_session=True, close_fds=True,
            pass_fds=((SIDE_CHANNEL_FD,) if channel else ()) + tuple(d["fd"] for d in private or () if d.get("fd")),
            preexec_fn=command_setup(uid, private),
        )
    except OSError as exc:
        if channel is not None:
            os.close(channel.fd)
        return dict({"output": "%s: %s\n" % (argv[0], exc.strerror or exc), "exit_code": 127 if exc.errno == 2
                     else 126, "timed_out": False, "duration": time.monotonic() - start, "cut_bytes": 0,
                     "signal": None}, **(channel.reply() if channel else {}))
    finally:
        if channel is not None:
            os.close(SIDE_CHANNEL_FD)  # the command's end now; ours would keep the pipe open past the command
    fd = proc.stdout.fileno()
    deadline = None if timeout is None else start + float(timeout)
    timed_out = False
    open_ = True
    while proc.poll() is None:
        # The wait is short: background children may hold the pipe open after the command exits, quietly.
        wait = 0.1
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                timed_out = True
                break
        if open_:
            open_ = read_available(fd, cap, wait, proc, channel)
        else:  # the command closed its output and runs on (or is just exiting: poll often)
            read_available(None, cap, min(wait, 0.01), proc, channel)
    if not timed_out:
        drain_until = time.monotonic() + DRAIN_MAX_S
        while open_ and time.monotonic() < drain_until and select.select([fd], [], [], DRAIN_AFTER_EXIT_S)[0]:
            open_ = read_available(fd, cap, 0, None, channel)
    end_command(proc)
    if open_ and OPTIONS.get("keep") and not timed_out:
        hand_over(fd)  # the command is done; what it left running still writes there
        open_ = False
    drain_until = time.monotonic() + DRAIN_AFTER_KILL_S
    while (open_ or (channel is not None and channel.fd is not None)) and time.monotonic() < drain_until:
        if open_:
            open_ = read_available(fd, cap, drain_until - time.monotonic(), None, channel)
        else:
            read_available(None, cap, drain_until - time.monotonic(), None, channel)
    proc.stdout.close()
    if channel is not None and channel.fd is not None:
        os.close(channel.fd)
    output, cut = cap.text()
    code = proc.returncode
    sig = -code if code < 0 else None
    return dict({"output": output, "exit_code": 128 + sig if sig else code, "timed_out": timed_out,
                 "duration": time.monotonic() - start, "cut_bytes": cut, "signal": sig},
                **(channel.reply() if channel else {}))


def read_file(req):
    with open(req["path"], "rb") as f:
        return {"data": base64.b64encode(f.read()).decode()}


def write_file(req):
    path = req["path"]
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as f:
        f.write(base64.b64decode(req["data"]))
    if req.get("mode") is not None:
        os.chmod(path, req["mode"])
    return {}


def untar(req):
    import tarfile

    os.makedirs(req["dest"], exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(req["data"]))) as tar:
        tar.extractall(req["dest"])
    return {}


OPS = {"exec": run_command, "read": read_file, "write": write_file, "untar": untar,
       "ping": lambda req: {"pid": os.getpid()}}


def serve(in_fd, stdout):
    global REQUESTS

    def send(obj):
        stdout.write(json.dumps(obj).encode() + b"\n")
        stdout.flush()

    REQUESTS = Requests(in_fd)
    send({"ready": True, "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0],
          "isolate": ISOLATE})
    for line in REQUESTS:
        req = json.loads(line)
        if req.get("op") == "shutdown":
            send({"id": req.get("id"), "ok": True})
            return
        try:
            reply = OPS[req["op"]](req)
            reply.update(id=req.get("id"), ok=True)
        except Exception as exc:  # every failure goes back to the host as data; the runner keeps serving
            reply = {"id": req.get("id"), "ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                     "kind": type(exc).__name__}
        send(reply)


if __name__ == "__main__":
    # The protocol owns fds 0 and 1; a stray print elsewhere in this process would corrupt it.
    proto_in = high_fd(os.dup(0))
    proto_out = os.fdopen(high_fd(os.dup(1)), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) > 1:  # the default working directory of commands
        if not os.path.isdir(sys.argv[1]):
            os.makedirs(sys.argv[1])
        os.chdir(sys.argv[1])
    if len(sys.argv) > 2:
        OPTIONS = json.loads(sys.argv[2])
    become_subreaper()
    # Under `keep` the other processes (an ENTRYPOINT's services) are the task's: never kill(-1).
    ALONE = set(processes()) <= {1, os.getpid()} and not OPTIONS.get("keep")
    ISOLATE = bool(OPTIONS.get("isolate")) and can_isolate()
    serve(proto_in, proto_out)
