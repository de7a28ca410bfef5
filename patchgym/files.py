"""Crash-safe writes shared by every stage: whole files replaced atomically, JSONL lines appended whole, and
host-wide locks; and the reading of files a user names, whose every failure is a message naming the file."""

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchgym.errors import UserError
from patchgym.paths import store_dir


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, fsync it, then rename it over `path`: readers never see half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_line(path: str | Path, line: str) -> None:
    """Append one line with a single write() on an O_APPEND descriptor, then fsync: a crash can only cut the last
    line, never interleave or lose an earlier one."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def file_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock shared by every process on this host, so one build of a key runs at a time."""
    path = store_dir() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_text(path: str | Path, what: str, error: type[UserError] = UserError) -> str:
    """The UTF-8 text of a file the user named (`what`: "config file", "patch file"); otherwise `error` with a
    message naming the file and the problem (not found, a directory, unreadable, not text)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): is it a binary file?"
    except FileNotFoundError:
        problem = "not found"
    except IsADirectoryError:
        problem = "is a directory, not a file"
    except OSError as exc:
        problem = f"cannot be read: {exc.strerror}"
    raise error(f"{what} '{path}' {problem}")


def read_json_object(path: str | Path, what: str, error: type[UserError] = UserError) -> dict:
    """The JSON object in a file the user named (a run's run.json); `error` naming the file otherwise."""
    text = read_text(path, what, error)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise error(f"{what} '{path}' is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise error(f"{what} '{path}' holds a JSON {type(value).__name__}, not an object")
    return value
