"""The runner's channel over a Kubernetes exec websocket (v4.channel.k8s.io): one byte of channel id per frame.

Channel 0 is our stdin, 1 the runner's stdout (the protocol), 2 its stderr (kept for diagnosis), 3 the final
status the API server sends when the runner exits. v4 cannot half-close stdin, which the runner protocol never
needs: it is line-delimited both ways, and closing the socket is the runner's end of file.
"""

import select
import socket
import ssl

from websocket import ABNF, WebSocket, WebSocketException

from patchgym.sandbox.channel import Channel

# Large writes (write_file, copy_in) go in frames of this size, well under the server's frame limits.
FRAME_BYTES = 1 << 16
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
CLOSE_CHECK_S = 0.5


class KubeExecChannel(Channel):
    """Reads the websocket's frames itself: `WSClient.update()` would also keep a copy of all output forever."""

    def __init__(self, name: str, ws: WebSocket):
        super().__init__(name)
        self._ws = ws
        self.stderr_tail = ""
        self.status = ""

    def _write(self, data: bytes) -> None:
        try:
            for start in range(0, len(data), FRAME_BYTES):
                self._ws.send(bytes([STDIN]) + data[start:start + FRAME_BYTES], opcode=ABNF.OPCODE_BINARY)
        except WebSocketException as exc:
            raise OSError(str(exc)) from exc

    def _read_chunk(self, timeout: float) -> bytes | None:
        sock = self._ws.sock
        if sock is None or self._closed:
            return b""
        # TLS may already hold decrypted frames that select() cannot see. The wait is sliced: a select() entered
        # just as another thread closed the socket can wait on its descriptor number reused by a new connection
        # (seen: a thread stuck for its whole timeout after Ctrl-C); the slice bounds how late it notices.
        try:
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                if not select.select([sock], [], [], min(timeout, CLOSE_CHECK_S))[0]:
                    return b"" if self._closed else None
        except (OSError, ValueError):  # ValueError: closed by close() in another thread
            return b""
        try:
            opcode, frame = self._ws.recv_data_frame(True)
        except (WebSocketException, OSError):
            return b""
        if opcode == ABNF.OPCODE_CLOSE:
            return b""
        if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
            return None  # ping/pong (answered by the library)
        channel, payload = frame.data[0], frame.data[1:]
        if channel == STDOUT:
            return payload or None
        if channel == STDERR:
            self.stderr_tail = (self.stderr_tail + payload.decode(errors="replace"))[-2000:]
        elif channel == STATUS:
            self.status = payload.decode(errors="replace")
        return None

    def close(self) -> None:
        sock = self._ws.sock
        if not self._closed and sock is not None:
            try:
                # shutdown() wakes a select() or recv() of another thread at once; close() alone would not.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        super().close()
