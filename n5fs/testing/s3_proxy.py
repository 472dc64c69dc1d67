"""A loopback HTTP proxy in front of an S3 endpoint that injects the faults real networks and
endpoints produce, and counts the requests that pass: for tests, soaks and benchmarks.

Real endpoints are reached over networks that reset connections, answer ``503 SlowDown`` or
``500 InternalError``, stall, cut a body short, and take tens of milliseconds a round trip.
A server on loopback does none of that, so code that only met one has never been tried. The
proxy puts those faults between a client and a real server (moto) on 127.0.0.1:

- ``reset_before``: the connection is reset once the request is read; the server never
  sees it;
- ``reset_after``: the request reaches the server, which acts on it, and the client's
  connection is reset before the answer (a write whose outcome the client cannot know);
- ``reset_mid_body``: the answer's head and half its body reach the client, then a reset;
- ``cut_answer``: the answer comes back with only the first half of its body, its
  ``Content-Length`` cut to match: an answer cut short where HTTP cannot tell (a middlebox
  that lost the rest);
- ``status``: the proxy answers ``status`` with an S3 error ``code`` (``503 SlowDown``,
  ``500 InternalError``) without asking the server;
- ``stall``: nothing happens for ``seconds`` (then the request goes on as usual);
- ``truncate``: the server gets only the first half of the request body (its
  ``Content-Length`` cut to match, every other header as sent) and its answer, often
  ``200``, goes back: a middlebox that lost part of a body.

A :class:`Fault` picks requests by method, by a regular expression searched in the object key,
by probability, at most ``times`` times, or only on the first request for each key
(``once_per_key``). :attr:`FaultProxy.latency` delays every request and every answer by that
many seconds (one way each). :attr:`FaultProxy.drop_conditions` drops ``If-Match`` and
``If-None-Match``: an endpoint (or proxy on the way to one) that ignores conditional writes.
moto checks no signatures, so requests signed for the proxy's address pass as they are.

Counts: :attr:`FaultProxy.counts` by request kind (``GET``, ``GET range``, ``HEAD``, ``PUT``,
``PUT part``, ``LIST``, ``POST``, ``DELETE``), :attr:`FaultProxy.injected` by fault kind.

Forwarding: request bodies are read whole (``Content-Length``, or de-chunked when sent
chunked) and sent on with one upstream connection per request; answers are streamed back with
their ``Content-Length``, or re-chunked when the upstream sends them chunked. Hop-by-hop
headers are not forwarded.

State: the server's own; the open client sockets (under ``_lock``) so that leaving the context
shuts them down and every handler thread ends before it returns; the fault list, the counters
and the random generator, all under :attr:`FaultProxy._lock` (faults are picked and counted
under it; the fault itself runs outside it).
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterator
    from io import BufferedIOBase

__all__ = ["Fault", "FaultProxy", "dropping_conditions", "fault_proxy"]

FaultKind = Literal[
    "reset_before",
    "reset_after",
    "reset_mid_body",
    "cut_answer",
    "status",
    "stall",
    "truncate",
    "corrupt",
]

#: conditional request headers, dropped when :attr:`FaultProxy.drop_conditions` is set
CONDITIONS = frozenset({"if-match", "if-none-match"})
#: request headers the proxy never forwards: hop-by-hop ones, and the host (its own)
_NOT_FORWARDED = frozenset(
    {
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
#: query parameters of a bucket GET that lists keys (ListObjectsV2, or the first version)
_LISTING = frozenset({"list-type", "prefix", "delimiter", "marker", "max-keys"})


@dataclass
class Fault:
    """One rule: which requests it hits (every given criterion must match) and what it does.

    ``key`` is a regular expression searched in the object key (the path after the bucket,
    URL-decoded; empty for bucket-level requests such as LIST). ``times`` bounds how often the
    rule fires; ``once_per_key`` fires on the first matching request for each key only.
    """

    kind: FaultKind
    method: str | None = None
    key: str | None = None
    probability: float = 1.0
    times: int | None = None
    once_per_key: bool = False
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    fired: int = 0
    _seen: set[str] = field(default_factory=set, repr=False)

    def matches(self, method: str, key: str, rng: random.Random) -> bool:
        """Whether this request is hit (and count it); call under the proxy's lock."""
        if self.method is not None and self.method != method:
            return False
        if self.key is not None and not re.search(self.key, key):
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        if self.once_per_key:
            if key in self._seen:
                return False
            self._seen.add(key)
        if self.probability < 1.0 and rng.random() >= self.probability:
            return False
        self.fired += 1
        return True


def _kind_of(method: str, key: str, query: dict[str, list[str]], headers: object) -> str:
    """The request's kind for the counters."""
    if method == "GET" and not key:
        return "LIST" if _LISTING.intersection(query) or not query else "GET"
    if method == "GET" and getattr(headers, "get", lambda _: None)("Range"):
        return "GET range"
    if method == "PUT" and "partNumber" in query:
        return "PUT part"
    return method


def _dechunked(stream: BufferedIOBase) -> bytes:
    """The body of a chunked request."""
    out = bytearray()
    while True:
        size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline().strip():  # trailers, up to the empty line
                pass
            return bytes(out)
        out += stream.read(size)
        stream.readline()  # the CRLF after each chunk


def _flipped(data: bytes) -> bytes:
    """``data`` with its middle byte inverted."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _error_xml(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>n5fs-fault-proxy</RequestId></Error>"
    ).encode()


class FaultProxy(ThreadingHTTPServer):
    """The proxy's server and its state (module docstring); :func:`fault_proxy` runs one."""

    daemon_threads = False  # joined by server_close, after their sockets are shut down
    #: the listen backlog: socketserver's default of 5 drops the SYNs of a client opening
    #: dozens of connections at once (TensorStore, a mount's read-ahead), which then wait for
    #: the kernel's retransmission, a second, as no real endpoint makes them wait
    request_queue_size = 1024

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host = parsed.hostname or "127.0.0.1"
        self.upstream_port = parsed.port or 80
        #: one-way delay, in seconds, of every request and of every answer
        self.latency = 0.0
        #: drop ``If-Match`` / ``If-None-Match`` (an endpoint that ignores them)
        self.drop_conditions = False
        self.faults: list[Fault] = []
        self.counts: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def inject(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def clear(self) -> None:
        """No faults from now on (counters are kept)."""
        with self._lock:
            self.faults.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.injected.clear()

    def pick(self, method: str, key: str, kind: str) -> Fault | None:
        """Count the request; the first fault that hits it, if any."""
        with self._lock:
            self.counts[kind] += 1
            for fault in self.faults:
                if fault.matches(method, key, self._rng):
                    self.injected[fault.kind] += 1
                    return fault
        return None

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


class _Reset(Exception):
    """The handler resets its client connection (a fault, not an error of the proxy)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultProxy

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read their own assertions, not an access log."""

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Reset:
            self._reset()
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _reset(self) -> None:
        """Close with an RST (SO_LINGER 0), as a reset by the network does."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _forward(self) -> None:
        proxy = self.server
        split = urllib.parse.urlsplit(self.path)
        _, _, key = urllib.parse.unquote(split.path).lstrip("/").partition("/")
        query = urllib.parse.parse_qs(split.query, keep_blank_values=True)
        body = b""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = _dechunked(self.rfile)
        elif self.headers.get("Content-Length"):
            body = self.rfile.read(int(self.headers["Content-Length"]))
        fault = proxy.pick(self.command, key, _kind_of(self.command, key, query, self.headers))
        if proxy.latency:
            time.sleep(proxy.latency)
        if fault is not None:
            if fault.kind == "stall":
                time.sleep(fault.seconds)
            elif fault.kind == "reset_before":
                raise _Reset
            elif fault.kind == "status":
                self._error(fault.status, fault.code)
                return
            elif fault.kind == "truncate":
                body = body[: len(body) // 2]
            elif fault.kind == "corrupt" and body:
                body = _flipped(body)
        dropped = _NOT_FORWARDED | (CONDITIONS if proxy.drop_conditions else frozenset())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
        if body or "Content-Length" in self.headers:
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            if fault is not None and fault.kind == "reset_after":
                answer.read()
                raise _Reset
            if proxy.latency:
                time.sleep(proxy.latency)
            self._answer(
                answer,
                cut=fault is not None and fault.kind == "reset_mid_body",
                flip=fault is not None and fault.kind == "corrupt" and not body,
                halve=fault is not None and fault.kind == "cut_answer",
            )
        finally:
            upstream.close()

    def _error(self, status: int, code: str) -> None:
        payload = _error_xml(code, f"injected by n5fs's fault proxy ({status})")
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def _answer(
        self, answer: http.client.HTTPResponse, *, cut: bool, flip: bool, halve: bool = False
    ) -> None:
        head = self.command == "HEAD"
        chunked = answer.chunked and not head
        whole = None
        if (
            cut
            or flip
            or halve
            or not (head or chunked or answer.getheader("Content-Length") is not None)
        ):
            whole = answer.read()  # to cut it, or to give it a length
            if halve:
                whole = whole[: len(whole) // 2]
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP and not (
                whole is not None and name.lower() == "content-length"
            ):
                self.send_header(name, value)
        if whole is not None:
            self.send_header("Content-Length", str(len(whole)))
            self.end_headers()
            if cut and len(whole) > 1:
                self.wfile.write(whole[: len(whole) // 2])
                self.wfile.flush()
                raise _Reset
            self.wfile.write(_flipped(whole) if flip and whole and answer.status < 300 else whole)
            return
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
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
def fault_proxy(endpoint: str, *, seed: int = 0) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` to ``endpoint`` on a free loopback port, serving until the
    context ends; then it stops, and every connection with it."""
    server = FaultProxy(endpoint, seed=seed)
    # shutdown() waits for the serving loop's next look at its flag: 0.05 s, not 0.5 s
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name="s3-fault-proxy",
        daemon=True,
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.close_connections()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def dropping_conditions(endpoint: str) -> Iterator[str]:
    """A proxy to ``endpoint`` that drops ``If-Match`` and ``If-None-Match``; yields its
    endpoint URL (an S3-compatible endpoint that ignores conditional writes)."""
    with fault_proxy(endpoint) as proxy:
        proxy.drop_conditions = True
        yield proxy.endpoint
