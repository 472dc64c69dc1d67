"""A loopback HTTP proxy in front of an S3 endpoint that drops ``If-Match`` and
``If-None-Match``: a stand-in, for tests, for an S3-compatible endpoint (or a proxy on the
way to one) that ignores conditional writes, so a conditional PUT silently overwrites.
moto checks no signatures, so requests signed for the proxy's address pass as they are.

Everything else is forwarded unchanged, one upstream connection per request: request bodies
are streamed on (``Content-Length``, or de-chunked when the client sends them chunked);
responses are streamed back with their ``Content-Length``, or re-chunked when the upstream
sends them chunked. Hop-by-hop headers are not forwarded.

State: the server's own, plus the set of client sockets open now (under ``_lock``), so that
leaving the context shuts them down and every handler thread ends before it returns.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from io import BufferedIOBase

#: request headers the proxy never forwards: the conditions it drops, and hop-by-hop ones
DROPPED = frozenset(
    {
        "if-match",
        "if-none-match",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer"})
_BLOCK = 1 << 16


class _Limited:
    """``length`` bytes of a stream, read in blocks (http.client reads a body until EOF)."""

    def __init__(self, stream: BufferedIOBase, length: int) -> None:
        self._stream = stream
        self._left = length

    def read(self, size: int = _BLOCK) -> bytes:
        if self._left <= 0:
            return b""
        data = self._stream.read(min(size if size > 0 else _BLOCK, self._left))
        self._left -= len(data)
        if not data:
            self._left = 0
        return data


def _dechunked(stream: BufferedIOBase) -> bytes:
    """The body of a chunked request (rare from boto3: small, so read whole)."""
    out = bytearray()
    while True:
        size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline().strip():  # trailers, up to the empty line
                pass
            return bytes(out)
        out += stream.read(size)
        stream.readline()  # the CRLF after each chunk


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close, after their sockets are shut down

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host = parsed.hostname or "127.0.0.1"
        self.upstream_port = parsed.port or 80
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        with self._lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        with self._lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read their own assertions, not an access log."""

    def _forward(self) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
        body: _Limited | bytes | None = None
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = _dechunked(self.rfile)
            headers["Content-Length"] = str(len(body))
        elif self.headers.get("Content-Length"):
            body = _Limited(self.rfile, int(self.headers["Content-Length"]))
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=60
        )
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            self._answer(answer)
        finally:
            upstream.close()

    def _answer(self, answer: http.client.HTTPResponse) -> None:
        self.send_response(answer.status, answer.reason)
        head = self.command == "HEAD"
        chunked = answer.chunked and not head
        whole = None
        if not (head or chunked or answer.getheader("Content-Length") is not None):
            whole = answer.read()  # delimited by the connection's end: give it a length
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        if whole is not None:
            self.send_header("Content-Length", str(len(whole)))
            self.end_headers()
            self.wfile.write(whole)
            return
        self.end_headers()
        if head:
            return
        while block := answer.read(_BLOCK):
            if chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            else:
                self.wfile.write(block)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


@contextlib.contextmanager
def dropping_conditions(endpoint: str) -> Iterator[str]:
    """A proxy to ``endpoint`` on a free loopback port that drops ``If-Match`` and
    ``If-None-Match``; yields its endpoint URL; stops it, and every connection, on exit."""
    server = _Server(endpoint)
    thread = threading.Thread(target=server.serve_forever, name="s3-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.close_connections()
        server.server_close()
        thread.join()
