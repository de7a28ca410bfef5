"""Byte channels from the host to a sandbox's runner: one JSON line each way, over pipes or a Docker attach socket."""

import json
import os
import select
import socket
import struct
import time
from typing import Any, BinaryIO

from patchgym.sandbox.errors import SandboxError


class Channel:
    """Sends request lines and receives reply lines; a dead peer or a silent one is a `SandboxError`."""

    def __init__(self, name: str):
        self.name = name
        self._buffer = bytearray()
        self._closed = False

    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def _read_chunk(self, timeout: float) -> bytes | None:
        """Bytes of the runner's stdout, b"" at end of file, None when nothing came within `timeout`."""
        raise NotImplementedError

    def close(self) -> None:
        self._closed = True

    def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            raise SandboxError(f"{self.name}: channel is closed")
        try:
            self._write(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise SandboxError(f"{self.name}: the sandbox stopped listening ({exc})") from exc

    def receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return json.loads(line)
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"{self.name}: no answer from the sandbox within {timeout:.0f} s")
            try:
                chunk = self._read_chunk(left)
            except OSError as exc:
                raise SandboxError(f"{self.name}: lost the connection to the sandbox ({exc})") from exc
            if chunk == b"":
                raise SandboxError(f"{self.name}: the sandbox died (its runner closed the connection)")
            if chunk:
                self._buffer += chunk


class PipeChannel(Channel):
    """The runner is a child process of ours: we own its stdin and stdout pipes."""

    def __init__(self, name: str, stdin: BinaryIO, stdout: BinaryIO):
        super().__init__(name)
        self._stdin, self._stdout = stdin, stdout

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._stdin.fileno(), view) :]

    def _read_chunk(self, timeout: float) -> bytes | None:
        fd = self._stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return None
        return os.read(fd, 1 << 20)

    def close(self) -> None:
        if not self._closed:
            for pipe in (self._stdin, self._stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        super().close()


class DockerAttachChannel(Channel):
    """The runner is a container's main process, attached over the engine's hijacked HTTP socket.

    Without a TTY the engine frames what the container writes: an 8-byte header (stream id, 3 zero bytes,
    big-endian length) before each payload. Our stdin goes through unframed.
    """

    def __init__(self, name: str, sock: socket.socket):
        super().__init__(name)
        self._sock = sock
        self._raw = bytearray()
        self._frame_left = 0
        self._frame_stream = 1

    def _write(self, data: bytes) -> None:
        self._sock.sendall(data)

    def _read_chunk(self, timeout: float) -> bytes | None:
        if not select.select([self._sock], [], [], timeout)[0]:
            return None
        data = self._sock.recv(1 << 20)
        if not data:
            return b""
        self._raw += data
        out = bytearray()
        while self._raw:
            if self._frame_left == 0:
                if len(self._raw) < 8:
                    break
                self._frame_stream, self._frame_left = struct.unpack(">BxxxL", self._raw[:8])
                del self._raw[:8]
                continue
            take = min(self._frame_left, len(self._raw))
            if self._frame_stream == 1:
                out += self._raw[:take]
            del self._raw[:take]
            self._frame_left -= take
        return bytes(out) or None  # a header alone is not end of file

    def close(self) -> None:
        if not self._closed:
            try:
                self._sock.close()
            except OSError:
                pass
        super().close()
