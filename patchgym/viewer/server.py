"""`patchgym view RUN`: a stdlib HTTP server with one static page (page.html, no external assets) and JSON
endpoints: /api/run, /api/trajectories (the table's rows) and /api/trajectory/<id> (one trajectory in full)."""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from patchgym.errors import UserError
from patchgym.viewer.index import TrajectoryIndex

PAGE = Path(__file__).with_name("page.html")


def make_server(run: str | Path, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    """A server for `run`, bound but not yet serving (port 0 picks a free one: see server.server_address)."""
    index = TrajectoryIndex(run)
    page = PAGE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(200, page, "text/html; charset=utf-8")
            elif path == "/api/run":
                self._json(index.about())
            elif path == "/api/trajectories":
                self._json(index.rows())
            elif path.startswith("/api/trajectory/") and path.rsplit("/", 1)[1].isdigit():
                found = index.trajectory(int(path.rsplit("/", 1)[1]))
                self._json(found) if found is not None else self._json({"error": "no such trajectory"}, 404)
            else:
                self._json({"error": f"not found: {path}"}, 404)

        def _json(self, value, status: int = 200) -> None:
            self._send(status, json.dumps(value).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:
            pass  # one line per request would bury the address the user needs

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror} (choose another --port)") from None
    server.daemon_threads = True
    return server
