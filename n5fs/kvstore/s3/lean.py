"""GetObject without botocore's request pipeline: the store's reads at a fraction of the CPU.

Why: a read-only mount serving small chunks spends most of its CPU in botocore, some 1.5-2 ms
a GET (parameter validation, endpoint rules, a dozen event hooks, a model-driven parse of
the answer's headers, a date parse), several times what the request needs. On two cores
shared with the reader, that CPU is the mount's speed. This path sends the same request
(same URL, same headers, the same SigV4 signature) through the client's own connection pool
and hands :func:`~n5fs.kvstore.s3.integrity.read_body` an answer of the shape botocore's
``get_object`` returns.

What it keeps, and how:

- **the route is botocore's own**: nothing is used until botocore has sent a GetObject of
  this store (the store's first read goes through botocore); its URL, its constant headers
  (user agent, requester pays, checksum mode, payload hash) and the signing region and
  service are taken from that request. So addressing (path or virtual host), the endpoint,
  the region, requester pays are whatever botocore chose. The route is learned only if the
  URL is a base plus the quoted key and every header is one this module knows how to make,
  and if this module's signature of that very request equals botocore's (checked once,
  with botocore's own date and credentials): otherwise every read stays on botocore;
- **credentials** are the client's (refreshable ones refresh as they do for botocore, a
  session token is sent and signed); an anonymous client sends no signature;
- **transport** is the client's HTTP session: its pool, timeouts, proxies and TLS settings,
  and its translation of socket faults into botocore's exceptions;
- **retries, the silent-endpoint breaker and the throttle** are the store's own objects
  (:mod:`~n5fs.kvstore.s3.retries`), called where botocore's events would call them;
- **integrity**: the body is botocore's ``StreamingBody`` (a short body raises as it would);
  full-object checksums are checked by :mod:`~n5fs.kvstore.s3.integrity` (the answer is
  marked unchecked);
- **answers**: 200 and 206 are read here; 404 ``NoSuchKey`` and the transient answers
  (``5xx``, throttling) become the ``ClientError`` botocore would raise, after the
  policy's retries. Any other answer (a redirect, 403, 412, 416, another 404) is asked again
  through botocore, whose handling is then exactly the usual one.

What GETs share with the lean LISTs (:mod:`~n5fs.kvstore.s3.leanlist`) is
:class:`LeanPath`: the route learned from botocore's first request of an operation, the
signature, and the policy's retries, breaker and throttle around each request.

State: the learned route (set once, read without a lock: an immutable object replaced
whole) and a thread-local naming what a botocore request is about (for learning).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, urlsplit

from botocore import UNSIGNED
from botocore import exceptions as bce
from botocore.awsrequest import AWSPreparedRequest
from botocore.response import StreamingBody

from n5fs.kvstore.s3.integrity import UNCHECKED

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from n5fs.kvstore.s3.retries import RetryPolicy, SilentEndpoint, Throttle

log = logging.getLogger(__name__)

__all__ = ["Fallback", "LeanGets", "LeanPath"]

#: headers botocore makes per request (and those of the request's own arguments); the
#: route's other headers are constants
_PER_REQUEST = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-security-token",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "range",
        "if-match",
    }
)
#: headers botocore leaves out of the signature (those a GET of ours can carry; the
#: ``amz-sdk-*`` ones it adds after signing)
_UNSIGNED_HEADERS = frozenset({"user-agent", "amz-sdk-invocation-id", "amz-sdk-request"})
#: headers a route may hold (anything else: the route is not learned)
_KNOWN = _PER_REQUEST | frozenset(
    {"user-agent", "x-amz-request-payer", "x-amz-checksum-mode", "x-amz-content-sha256"}
)
_SCOPE = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,")
_ERROR_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_ERROR_MESSAGE = re.compile(rb"<Message>([^<]*)</Message>")
#: answer headers -> the ``get_object`` fields integrity and the store read
_FIELDS = {
    "etag": "ETag",
    "content-range": "ContentRange",
    "x-amz-checksum-crc32": "ChecksumCRC32",
    "x-amz-checksum-crc32c": "ChecksumCRC32C",
    "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME",
    "x-amz-checksum-sha1": "ChecksumSHA1",
    "x-amz-checksum-sha256": "ChecksumSHA256",
    "x-amz-checksum-type": "ChecksumType",
    "x-amz-server-side-encryption": "ServerSideEncryption",
    "x-amz-server-side-encryption-customer-algorithm": "SSECustomerAlgorithm",
}
#: answers turned into a ClientError here (besides a path's own): what the policy retries
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


class Fallback(Exception):
    """This request goes through botocore instead (an answer this path does not handle)."""


@dataclass(frozen=True)
class _Route:
    base: str  # a GET's URL is base + the quoted key, a LIST's base + '?' + its query
    host: str  # the host header botocore signed
    headers: tuple[tuple[str, str], ...]  # constant headers, as botocore sent them
    payload_hash: str  # x-amz-content-sha256 ('' for an anonymous route)
    region: str
    service: str
    signed: bool


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _host(url: str) -> str:
    """The host header botocore signs: the netloc, without a port the scheme implies."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return host if parts.port in (None, default) else f"{host}:{parts.port}"


class _Keys:
    """The SigV4 signing key of (secret, day, region, service), derived once a day."""

    def __init__(self) -> None:
        self._held: tuple[tuple[str, str, str, str], bytes] | None = None

    def key(self, secret: str, day: str, region: str, service: str) -> bytes:
        wanted = (secret, day, region, service)
        held = self._held
        if held is not None and held[0] == wanted:
            return held[1]
        k = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
        for part in (region, service, "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        self._held = (wanted, k)
        return k


def sign(
    keys: _Keys,
    route: _Route,
    path: str,
    headers: Mapping[str, str],
    credentials: Any,
    stamp: str,
    query: str = "",
) -> str:
    """The Authorization header of a GET of ``path`` and ``query`` (as the URL spells them,
    percent-encoded) with ``headers`` (which hold every signed header but host) at ``stamp``
    (``YYYYMMDDTHHMMSSZ``): SigV4 as botocore's ``S3SigV4Auth`` makes it (S3 paths are not
    normalized; the query's pairs are sorted as the URL encodes them)."""
    signed = {name.lower(): " ".join(str(value).split()) for name, value in headers.items()}
    for name in _UNSIGNED_HEADERS:
        signed.pop(name, None)
    signed["host"] = route.host
    names = sorted(signed)
    canonical = "\n".join(
        [
            "GET",
            path,
            canonical_query(query),
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            route.payload_hash,
        ]
    )
    day = stamp[:8]
    scope = f"{day}/{route.region}/{route.service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = keys.key(credentials.secret_key, day, route.region, route.service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )


def canonical_query(query: str) -> str:
    """A URL's query as SigV4 signs it (botocore's ``_canonical_query_string_url``)."""
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(f"{name}={value}" for name, value in pairs)


class LeanPath:
    """One operation's requests past botocore's pipeline, on the route botocore's first
    request of it showed (module docstring); :class:`LeanGets` and
    :class:`~n5fs.kvstore.s3.leanlist.LeanLists` say what the URL of a request is and what
    its answer becomes."""

    #: the operation whose first botocore request teaches the route
    operation: ClassVar[str]
    #: an answer's body is read by the caller (a GET's), not by the session
    stream_output: ClassVar[bool]
    #: statuses read by :meth:`_accept`
    accepted: ClassVar[frozenset[int]]
    #: non-transient error answers (status, code) that become a ClientError here
    answered_here: ClassVar[frozenset[tuple[int, str]]] = frozenset()

    def __init__(
        self,
        client: Any,
        policy: RetryPolicy,
        silent: SilentEndpoint,
        throttle: Throttle,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._policy = policy
        self._silent = silent
        self._throttle = throttle
        self._sleep = sleep
        self._route: _Route | None = None
        self._keys = _Keys()
        self._expected = threading.local()
        self.refused: str | None = None  # why no route was learned (for logs and tests)
        self._session = getattr(getattr(client, "_endpoint", None), "http_session", None)
        signer = getattr(client, "_request_signer", None)
        self._signer = signer
        if self._session is None or signer is None:
            self.refused = "the client has no HTTP session or signer to use"
            return
        client.meta.events.register(f"before-send.s3.{self.operation}", self._learn)

    @property
    def ready(self) -> bool:
        return self._route is not None

    def expecting(self, what: str) -> _Expecting:
        """Around a botocore request of this operation about ``what`` (a GET's key, a
        LIST's query): learn the route from it."""
        return _Expecting(self._expected, what)

    # -- learning ------------------------------------------------------------------------------

    def _learn(self, request: AWSPreparedRequest, **_: Any) -> None:
        what = getattr(self._expected, "key", None)
        if what is None or self._route is not None or self.refused is not None:
            return
        try:
            route = self._route_of(request, what)
        except Exception as exc:  # noqa: BLE001  # a route we cannot read is not used
            route = f"unreadable request: {exc!r}"
        if isinstance(route, _Route):
            self._route = route
            log.debug("s3: lean %s via %s", self.operation, route.base)
        else:
            self.refused = route
            log.info("s3: %s stays on botocore's path: %s", self.operation, route)

    def _route_of(self, request: AWSPreparedRequest, what: str) -> _Route | str:
        """The route of ``request`` (about ``what``), or why there is none."""
        raise NotImplementedError

    def _learned(self, request: AWSPreparedRequest, base: str) -> _Route | str:
        """The route of ``request``, whose URL is ``base`` and what this path adds to it:
        its constant headers and signing scope, if this path can make every header and
        signs the request exactly as botocore did; else why not."""
        url = request.url
        headers = {_text(name): _text(value) for name, value in request.headers.items()}
        lower = {name.lower(): value for name, value in headers.items()}
        unknown = set(lower) - _KNOWN
        if unknown:
            return f"headers this path cannot make: {sorted(unknown)}"
        constant = tuple(
            (name, value) for name, value in headers.items() if name.lower() not in _PER_REQUEST
        )
        auth = lower.get("authorization")
        anonymous = getattr(self._client.meta.config, "signature_version", None) is UNSIGNED
        if auth is None:
            if not anonymous:
                return f"an unsigned {self.operation} from a signing client"
            return _Route(base, _host(url), constant, "", "", "", signed=False)
        match = _SCOPE.match(auth)
        if match is None:
            return "a signature other than SigV4"
        _, _, region, service = match.groups()
        route = _Route(
            base,
            _host(url),
            tuple(pair for pair in constant if pair[0].lower() != "x-amz-content-sha256"),
            lower.get("x-amz-content-sha256", ""),
            region,
            service,
            signed=True,
        )
        credentials = self._credentials()
        if credentials is None:
            return "no credentials to sign with"
        signed = {
            name: value
            for name, value in headers.items()
            if name.lower() not in ("authorization", "amz-sdk-invocation-id", "amz-sdk-request")
        }
        parts = urlsplit(url)
        stamp = lower["x-amz-date"]
        mine = sign(self._keys, route, parts.path, signed, credentials, stamp, parts.query)
        if mine != auth:
            return "this path's SigV4 signature differs from botocore's"
        return route

    def _credentials(self) -> Any:
        held = getattr(self._signer, "_credentials", None)
        return None if held is None else held.get_frozen_credentials()

    # -- requests ------------------------------------------------------------------------------

    def _exchange(self, route: _Route, url: str, extra: Mapping[str, str]) -> Any:
        """One request of ``url`` (with the ``extra`` headers) on ``route``, attempted as the
        policy says, between the breaker's steps: what :meth:`_accept` makes of its answer;
        the ClientError botocore would raise for an absent key or a transient answer the
        policy gave up on; :class:`Fallback` for any other answer."""
        credentials = self._credentials() if route.signed else None
        if route.signed and credentials is None:
            raise Fallback("no credentials")  # botocore raises NoCredentialsError
        context: dict[str, Any] = {}
        self._silent.before_call(context)
        try:
            answer = self._attempts(route, credentials, url, extra, context)
        except Fallback:
            self._silent.answered(context)
            raise
        except bce.ClientError:
            self._silent.answered(context)
            raise
        except BaseException as exc:
            self._silent.failed(exc, context)
            raise
        self._silent.answered(context)
        return answer

    def _attempts(
        self,
        route: _Route,
        credentials: Any,
        url: str,
        extra: Mapping[str, str],
        context: dict[str, Any],
    ) -> Any:
        parts = urlsplit(url)
        request_dict = {"context": context}
        attempts = 0
        while True:
            attempts += 1
            wait = self._throttle.acquire()
            if wait > 0:
                self._sleep(wait)
            request = self._request(route, credentials, url, parts.path, parts.query, extra)
            try:
                response = self._session.send(request)  # type: ignore[union-attr]
                if response.status_code in self.accepted:
                    return self._accept(response)
            except (bce.BotoCoreError, bce.HTTPClientError) as exc:
                delay = self._policy.needs_retry(
                    attempts, caught_exception=exc, request_dict=request_dict
                )
                if delay is None:
                    raise
                self._sleep(delay)
                continue
            error = self._error(response)
            delay = self._policy.needs_retry(
                attempts, response=(response, error), request_dict=request_dict
            )
            if delay is None:
                raise bce.ClientError(error, self.operation)  # type: ignore[arg-type]
            self._sleep(delay)

    def _accept(self, response: Any) -> Any:
        """What an accepted answer becomes; an answer broken on the way raises
        :class:`~botocore.exceptions.HTTPClientError` (retried), one this path cannot read
        :class:`Fallback`."""
        raise NotImplementedError

    def _request(
        self,
        route: _Route,
        credentials: Any,
        url: str,
        path: str,
        query: str,
        extra: Mapping[str, str],
    ) -> AWSPreparedRequest:
        headers = dict(route.headers)
        headers.update(extra)
        if route.signed:
            headers["X-Amz-Date"] = stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            headers["X-Amz-Content-SHA256"] = route.payload_hash
            if credentials.token:
                headers["X-Amz-Security-Token"] = credentials.token
            headers["Authorization"] = sign(
                self._keys, route, path, headers, credentials, stamp, query
            )
        headers["amz-sdk-invocation-id"] = str(uuid.uuid4())
        headers["amz-sdk-request"] = "attempt=1; max=1"
        # a plain dict: the session hands the headers to urllib3 as they are (botocore's
        # HTTPHeaders would cost an email.Message per request)
        return AWSPreparedRequest("GET", url, headers, None, self.stream_output)  # type: ignore[arg-type]

    def _error(self, response: Any) -> dict[str, Any]:
        """The error answer as botocore parses it, for the codes handled here; any other
        answer raises :class:`Fallback` (botocore asks again and handles it)."""
        status = response.status_code
        body = response.content or b""
        code_match = _ERROR_CODE.search(body)
        code = code_match.group(1).decode(errors="replace") if code_match else ""
        if (status, code) not in self.answered_here and status not in _TRANSIENT_STATUS:
            raise Fallback(f"an answer {status} {code}")
        message = _ERROR_MESSAGE.search(body)
        return {
            "Error": {
                "Code": code or str(status),
                "Message": message.group(1).decode(errors="replace") if message else "",
            },
            "ResponseMetadata": {
                "HTTPStatusCode": status,
                "HTTPHeaders": dict(response.headers),
            },
        }


class LeanGets(LeanPath):
    """GetObject for one store's client (module docstring). ``get(full_key, **args)``
    (``Range``, ``IfMatch``) answers as ``client.get_object`` would, or raises
    :class:`Fallback` before anything reached the caller."""

    operation = "GetObject"
    stream_output = True
    accepted = frozenset({200, 206})
    answered_here = frozenset({(404, "NoSuchKey")})

    def _route_of(self, request: AWSPreparedRequest, what: str) -> _Route | str:
        url = request.url
        quoted = quote(what, safe="/~")
        if "?" in url or not url.endswith(quoted) or request.method != "GET":
            return f"a GetObject URL that is not base + key: {url}"
        return self._learned(request, url[: len(url) - len(quoted)])

    def get(self, full_key: str, **args: Any) -> dict[str, Any]:
        route = self._route
        if route is None or set(args) - {"Range", "IfMatch"}:
            raise Fallback("no route")
        extra: dict[str, str] = {}
        if "Range" in args:
            extra["Range"] = str(args["Range"])
        if args.get("IfMatch") is not None:
            extra["If-Match"] = str(args["IfMatch"])
        answer: dict[str, Any] = self._exchange(
            route, route.base + quote(full_key, safe="/~"), extra
        )
        return answer

    def _accept(self, response: Any) -> dict[str, Any]:
        headers = response.headers
        length = headers.get("content-length")
        answer: dict[str, Any] = {
            field: headers[name] for name, field in _FIELDS.items() if name in headers
        }
        if length is not None:
            answer["ContentLength"] = int(length)
        answer["Body"] = StreamingBody(response.raw, length)
        answer[UNCHECKED] = True
        return answer


class _Expecting:
    def __init__(self, local: threading.local, what: str) -> None:
        self._local = local
        self._what = what

    def __enter__(self) -> None:
        self._local.key = self._what

    def __exit__(self, *exc: object) -> None:
        self._local.key = None
