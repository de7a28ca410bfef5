"""The sandbox contract, implemented once on top of the in-sandbox runner; a backend only starts and stops it.

    with open_sandbox(config) as sb:
        sb.exec("pytest -q", timeout=300) -> ExecResult(output, exit_code, timed_out, duration, ...)
        sb.read_file(path) / sb.write_file(path, data) / sb.copy_in(host_dir, dest) / sb.diff("HEAD")
"""

import base64
import builtins
import io
import json
import tarfile
import threading
import uuid
from pathlib import Path
from typing import Any

from patchgym.sandbox import lifecycle, registry
from patchgym.sandbox.channel import Channel
from patchgym.sandbox.config import SandboxConfig
from patchgym.sandbox.errors import DiffFailed, DiffTooLarge, SandboxError, SandboxKilled
from patchgym.sandbox.result import ExecResult
from patchgym.sandbox.standalone import standalone_source

RUNNER_SOURCE = standalone_source(Path(__file__).parent / "runner.py")
# Beyond the command's own timeout, how long the runner may take to kill it and answer before we call it dead.
ANSWER_GRACE_S = 30.0
# Bytecode caches go stale when a file is edited twice within a second at the same size (Python compares mtime
# in seconds and size), so an agent's fix could seem not to take; they would also litter the patch.
COMMAND_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
DIFF_ALWAYS_EXCLUDED = ("*.pyc", "__pycache__")
DIFF_MAX_BYTES = 16 << 20
# Errors of file operations that are the caller's, raised as the same built-in exception on the host.
_CALLER_ERRORS = ("FileNotFoundError", "IsADirectoryError", "NotADirectoryError", "PermissionError",
                  "FileExistsError")
_DIFF_SCRIPT = r"""
set -e
index=$(mktemp)
trap 'rm -f "$index"' EXIT
if [ -n "$PATCHGYM_GIT_DIR" ]; then export GIT_DIR="$PATCHGYM_GIT_DIR" GIT_WORK_TREE="$PWD"; else GIT_DIR=.git; fi
# -p keeps the index's mtime: git's racy-entry check then re-reads files edited in the index's own second.
if [ -f "$GIT_DIR/index" ]; then cp -p "$GIT_DIR/index" "$index"; else rm -f "$index"; fi
export GIT_INDEX_FILE="$index"
git -c safe.directory='*' add -A -- "$@" >/dev/null
git -c safe.directory='*' diff --cached --binary "$PATCHGYM_DIFF_BASE" -- "$@"
"""


class Sandbox:
    """One isolated machine-like workspace. Subclasses implement `_start` (returns the runner's channel) and `_stop`."""

    backend = ""
    isolates = False  # whether commands may have private directories (exec's `private`)
    runs_services = False  # whether the backend can start config.services beside the sandbox

    def __init__(self, config: SandboxConfig | None = None, *, image: Any = None, labels: dict[str, str] | None = None):
        self.config = config or SandboxConfig()
        # One place for every backend (a kubernetes pod spec too): the name is rewritten before it is resolved.
        self.image = registry.mirrored(image if image is not None else self.config.image, self.config.image_mirror)
        if self.config.services and not self.runs_services:
            names = ", ".join(s.name for s in self.config.services)
            raise SandboxError(f"the {self.backend} backend cannot run services beside a sandbox ({names}): use "
                               "sandbox.backend=docker")
        self.id = f"pg-{uuid.uuid4().hex[:12]}"
        self.run_id = lifecycle.run_id()
        self.labels = {lifecycle.LABEL_SANDBOX: "1", lifecycle.LABEL_RUN: self.run_id,
                       lifecycle.LABEL_OWNER: lifecycle.owner_stamp(), **(labels or {})}
        self._lock = threading.Lock()  # one request at a time on the channel
        self._close_lock = threading.Lock()
        self._next_id = 0
        self._dead: str | None = None
        self._closed = False
        lifecycle.register(self.id, self)
        try:
            self._channel: Channel = self._start()
            try:
                hello = self._channel.receive(self.config.start_timeout_s)
            except SandboxError as exc:
                hint = self._diagnose()
                raise SandboxError(f"{exc} while starting{'; ' + hint if hint else ''}") from exc
            if not hello.get("ready"):
                raise SandboxError(f"{self.id}: unexpected greeting from the runner: {hello!r}")
            self.isolates = bool(hello.get("isolate"))
        except BaseException:
            self.close()
            raise

    def runner_command(self) -> list[str]:
        """The command that starts the runner, for a backend to run as its main process."""
        cfg = self.config
        options = {"keep": cfg.keep_background, "isolate": cfg.private_mounts}
        return [cfg.python, "-c", RUNNER_SOURCE, cfg.workdir, json.dumps(options)]

    # -- what backends provide ------------------------------------------------------------------
    def _start(self) -> Channel:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _oom_kills(self) -> int | None:
        """How many processes the memory limit has killed so far, when the backend can tell."""
        return None

    def _diagnose(self) -> str:
        """A hint about why the sandbox died (exit status, OOM), when the backend can tell."""
        return ""

    def _died_inside(self) -> bool:
        """After the runner was lost: True when something inside the sandbox ended it (its own processes), False
        when it was the engine, the host or someone outside (a `docker kill`), or when the backend cannot tell."""
        return False

    # -- the contract ---------------------------------------------------------------------------
    def exec(self, command: str | list[str], timeout: float | None = None, cwd: str | None = None,
             env: dict[str, str] | None = None, output_limit: int | None = None, agent: bool = False,
             side_channel: int | None = None, private: list[dict] | None = None) -> ExecResult:
        """Run `command` (a string goes to `bash -c`) and return its merged output, exit code and timing.

        `agent`: the command is the agent's own (or the code under test, when grading). It runs as
        `config.agent_user`, so it can neither signal the runner nor write what root keeps. The runner is pinged
        first, so a sandbox that died before it stays an infrastructure error; one that dies while it runs, of
        something inside, raises `SandboxKilled`.
        `side_channel`: give the command a side channel (descriptor runner.SIDE_CHANNEL_FD) whose other end only the
        runner holds; up to this many bytes of what it writes there come back in `ExecResult.side_channel`.
        `private`: run the command in a mount namespace of its own, with an empty tmpfs at each directory given as
        {"path", "uid" (its owner), "files" (name -> base64, written there), "fd" (a descriptor the command gets for
        it)}; only where `isolates` (config.private_mounts, and a backend that allows it)."""
        timeout = self.config.exec_timeout_s if timeout is None else timeout
        if agent:
            self.ping()
        ooms_before = self._oom_kills()
        fields = dict(cmd=command, timeout=timeout, cwd=cwd, env={**COMMAND_ENV, **self.config.env, **(env or {})},
                      limit=output_limit or self.config.output_limit_bytes,
                      user=self.config.agent_user if agent else None, side_channel=side_channel,
                      private=private)
        try:
            reply = self._request("exec", ANSWER_GRACE_S + timeout, **fields)
        except SandboxError as exc:
            if agent and not self._closed and self._died_inside():
                raise SandboxKilled(f"{exc}; it died during the agent's command {repr(command)[:300]}") from exc
            raise
        oom = False
        if reply["signal"] == 9 and ooms_before is not None:
            oom = (self._oom_kills() or 0) > ooms_before
        output = reply["output"]
        if oom:
            output += f"\n[killed: out of memory (sandbox limit {self.config.memory_mb} MB)]\n"
        elif reply["timed_out"]:
            output += f"\n[timed out after {timeout:g} s; the command and its children were killed]\n"
        return ExecResult(output=output, exit_code=reply["exit_code"], timed_out=reply["timed_out"],
                          duration=reply["duration"], cut_bytes=reply["cut_bytes"], signal=reply["signal"],
                          oom_killed=oom, side_channel=reply.get("side_channel", ""),
                          side_channel_overflow=reply.get("side_channel_overflow", False))

    def give_to_agent(self, path: str) -> None:
        """Make `path` and everything below it the agent user's, so its commands can edit there. Only what is not
        theirs yet is changed: a change copies the file up out of the image's layers, with an fsync, so the
        changes run in parallel. Links are changed, never followed."""
        uid = self.config.agent_user
        script = ('[ -e "$1" ] || { echo "no such path: $1"; exit 1; }\n'
                  'find "$1" \\( ! -user "$2" -o ! -group "$2" \\) -print0 | xargs -0 -r -P 8 -n 64 chown -h "$2:$2"')
        result = self.exec(["sh", "-c", script, "give", path, str(uid)], timeout=600)
        if not result.ok:
            raise SandboxError(f"{self.id}: could not give {path} to uid {uid}: {result.output[-2000:]}")

    def ping(self) -> None:
        """A round trip to the runner; `SandboxError` when the sandbox is dead."""
        self._request("ping", 10)

    def read_file(self, path: str) -> bytes:
        return base64.b64decode(self._request("read", ANSWER_GRACE_S, path=path)["data"])

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._request("write", ANSWER_GRACE_S, path=path, data=base64.b64encode(raw).decode(), mode=mode)

    def copy_in(self, src: str | Path, dest: str) -> None:
        """Copy a host directory's contents (or one file) into `dest` inside the sandbox, modes and links kept."""
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"copy_in: {src} does not exist on the host")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            if src.is_dir():
                for child in sorted(src.iterdir()):
                    tar.add(child, arcname=child.name)
            else:
                tar.add(src, arcname=src.name)
        self._request("untar", ANSWER_GRACE_S + 60, dest=dest, data=base64.b64encode(buf.getvalue()).decode())

    def diff(self, base: str = "HEAD", cwd: str | None = None, exclude: tuple[str, ...] = (),
             git_dir: str | None = None, max_bytes: int = DIFF_MAX_BYTES) -> str:
        """`git diff` of the workspace against `base`, new and deleted files included, `exclude` paths left out.
        `git_dir`: the repository to diff against, when it is kept outside the workspace (default: its .git).

        A diff over `max_bytes` raises DiffTooLarge: the runner keeps only `max_bytes` of it (head and tail) and
        counts the rest, so a huge file in the workspace costs the host no more than that.
        """
        pathspecs = ["."] + [f":(exclude){p}" for p in (*DIFF_ALWAYS_EXCLUDED, *exclude)]
        result = self.exec(["bash", "-c", _DIFF_SCRIPT, "diff", *pathspecs], cwd=cwd,
                           env={"PATCHGYM_DIFF_BASE": base, "PATCHGYM_GIT_DIR": git_dir or ""},
                           output_limit=max_bytes, timeout=300)
        if not result.ok:
            raise DiffFailed(f"{self.id}: git diff against {base!r} failed ({result.exit_code}): "
                             f"{result.output[-2000:]}")
        if result.cut_bytes:
            raise DiffTooLarge(max_bytes + result.cut_bytes, max_bytes)  # what was cut and the max_bytes kept
        return result.output

    def close(self) -> None:
        """Stop the sandbox and remove everything it made; safe to call twice, from any thread, mid-command."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._stop()  # kills the runner first, so a command in flight in another thread ends at once
        finally:
            channel = getattr(self, "_channel", None)
            if channel is not None:
                channel.close()
            lifecycle.unregister(self.id)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} image={self.image!r}>"

    # -- plumbing ---------------------------------------------------------------------------------
    def _request(self, op: str, wait: float, **fields: Any) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise SandboxError(f"{self.id}: sandbox is closed")
            if self._dead:
                raise SandboxError(self._dead)
            self._next_id += 1
            try:
                self._channel.send({"id": self._next_id, "op": op, **fields})
                reply = self._channel.receive(wait)
            except SandboxError as exc:
                hint = self._diagnose()
                self._dead = f"{exc}{'; ' + hint if hint else ''}"
                raise SandboxError(self._dead) from exc
        if not reply.get("ok"):
            kind = reply.get("kind", "")
            if kind in _CALLER_ERRORS:
                raise getattr(builtins, kind)(f"{self.id}: {reply['error']}")
            raise OSError(f"{self.id}: {op} failed: {reply['error']}")
        return reply
