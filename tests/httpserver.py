"""A tiny local HTTP server so download tests exercise real HTTP without the network.

It serves in-memory files, honours `Range: bytes=N-` like a real mirror, and
can misbehave on demand (cut a body short, answer an error status, ignore
Range) so the resume and failure paths run against genuine sockets. Every
request is logged, so tests can assert what the client asked for.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

LOOPBACK = "127.0.0.1"
ANY_FREE_PORT = 0
SHUTDOWN_POLL_S = 0.01
"""How often serve_forever checks for shutdown; the 0.5 s default would dominate test time."""
RANGE_FROM = re.compile(r"bytes=(\d+)-$")


@dataclass(frozen=True)
class SeenRequest:
    """One request as the server saw it."""

    method: str
    path: str
    range: str | None


@dataclass
class Cut:
    """Close the connection after `after` body bytes, for the next `times` responses on a path."""

    after: int
    times: int


@dataclass
class ServerState:
    """What the handler serves and how it misbehaves; shared between test and server threads."""

    files: dict[str, bytes] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    cuts: dict[str, Cut] = field(default_factory=dict)
    ignore_range: bool = False
    seen: list[SeenRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LocalServer:
    """Context manager running a threaded HTTP server on 127.0.0.1 with a free port."""

    def __init__(self) -> None:
        self.state = ServerState()
        self._server = ThreadingHTTPServer((LOOPBACK, ANY_FREE_PORT), make_handler(self.state))
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True
        )

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def url(self, path: str) -> str:
        """Build the full URL of `path` on this server."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{path}"

    def serve(self, path: str, data: bytes) -> str:
        """Publish `data` under `path` and return its URL."""
        with self.state.lock:
            self.state.files[path] = data
        return self.url(path)

    def fail(self, path: str, status: int) -> None:
        """Answer every request for `path` with `status` until `heal` is called."""
        with self.state.lock:
            self.state.statuses[path] = status

    def heal(self, path: str) -> None:
        """Stop failing `path`."""
        with self.state.lock:
            self.state.statuses.pop(path, None)

    def cut(self, path: str, after: int, times: int = 1) -> None:
        """Drop the connection after `after` body bytes on the next `times` responses for `path`."""
        with self.state.lock:
            self.state.cuts[path] = Cut(after, times)

    def ignore_range(self, ignore: bool = True) -> None:
        """Behave like a server without range support: always send the whole file with 200."""
        with self.state.lock:
            self.state.ignore_range = ignore

    @property
    def requests(self) -> list[SeenRequest]:
        """A snapshot of the requests seen so far, oldest first."""
        with self.state.lock:
            return list(self.state.seen)


def make_handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    """Bind a handler class to `state`, since http.server instantiates handlers itself."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            """Keep test output clean."""

        def do_GET(self) -> None:
            self.respond(send_body=True)

        def do_HEAD(self) -> None:
            self.respond(send_body=False)

        def respond(self, send_body: bool) -> None:
            range_header = self.headers.get("Range")
            with state.lock:
                state.seen.append(SeenRequest(self.command, self.path, range_header))
                status = state.statuses.get(self.path)
                data = state.files.get(self.path)
                cut = self.take_cut()
                ignore_range = state.ignore_range
            if status is not None:
                self.send_error(status)
                return
            if data is None:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            match = None if ignore_range or range_header is None else RANGE_FROM.match(range_header)
            start = int(match.group(1)) if match else 0
            if match and start >= len(data):
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = data[start:]
            self.send_response(HTTPStatus.PARTIAL_CONTENT if match else HTTPStatus.OK)
            if match:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "none" if ignore_range else "bytes")
            self.end_headers()
            if not send_body:
                return
            if cut is not None:
                self.wfile.write(body[: cut.after])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def take_cut(self) -> Cut | None:
            """Consume one scheduled cut for this path; call with the state lock held."""
            cut = state.cuts.get(self.path)
            if cut is None:
                return None
            cut.times -= 1
            if cut.times <= 0:
                del state.cuts[self.path]
            return cut

    return Handler
