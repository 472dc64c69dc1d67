"""The S3 error table (STYLE P4): boto3/botocore failures -> n5fs's error classes, in one place.

``translate`` names the store (bucket, endpoint) and the key in every message; callers
``raise translate(e, ...) from e`` so the boto3 exception stays as ``__cause__``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from boto3.exceptions import S3UploadFailedError
from botocore import exceptions as bce

from n5fs.errors import (
    AccessDenied,
    InvalidSource,
    KeyNotFound,
    N5fsError,
    NotSupported,
    StoreUnavailable,
    VersionConflict,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: S3 error codes (and bare HTTP statuses, which HEAD answers carry) -> our error classes
ERROR_CODES: Mapping[str, type[N5fsError]] = {
    "NoSuchKey": KeyNotFound,
    "NotFound": KeyNotFound,
    "404": KeyNotFound,
    "NoSuchBucket": KeyNotFound,
    "AccessDenied": AccessDenied,
    "AllAccessDisabled": AccessDenied,
    "AccountProblem": AccessDenied,
    "InvalidAccessKeyId": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "ExpiredToken": AccessDenied,
    "InvalidToken": AccessDenied,
    "RequestTimeTooSkewed": AccessDenied,
    "403": AccessDenied,
    "SlowDown": StoreUnavailable,
    "Throttling": StoreUnavailable,
    "ServiceUnavailable": StoreUnavailable,
    "InternalError": StoreUnavailable,
    "RequestTimeout": StoreUnavailable,
    "429": StoreUnavailable,
    "500": StoreUnavailable,
    "502": StoreUnavailable,
    "503": StoreUnavailable,
    "504": StoreUnavailable,
    # a conditional write (If-Match / If-None-Match) lost to another writer: not a fault of
    # the endpoint (never EIO) and not transient (botocore retries neither 409 nor 412)
    "PreconditionFailed": VersionConflict,
    "ConditionalRequestConflict": VersionConflict,
    "412": VersionConflict,
    "MethodNotAllowed": NotSupported,
    "NotImplemented": NotSupported,
    "501": NotSupported,
}
#: GET answers for a key that is absent (the hot path: no exception leaves the store)
ABSENT = frozenset({"NoSuchKey", "NotFound", "404"})
#: answers to a conditional write that another writer won (a NoSuchKey answering an
#: ``If-Match`` is one too: :mod:`n5fs.kvstore.s3_conditional`)
CONFLICT = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412"})
#: GET answers for a range that starts past the end (or any range of an empty object)
EMPTY_RANGE = frozenset({"InvalidRange", "416"})

_BOTOCORE: tuple[tuple[tuple[type[Exception], ...], type[N5fsError]], ...] = (
    ((bce.ConnectionError, bce.HTTPClientError, bce.IncompleteReadError), StoreUnavailable),
    (
        (
            bce.NoCredentialsError,
            bce.PartialCredentialsError,
            bce.CredentialRetrievalError,
            bce.TokenRetrievalError,
            bce.NoAuthTokenError,
        ),
        AccessDenied,
    ),
    (
        (
            bce.ProfileNotFound,
            bce.ConfigParseError,
            bce.NoRegionError,
            bce.InvalidRegionError,
            bce.InvalidDNSNameError,
            bce.ParamValidationError,
        ),
        InvalidSource,
    ),
)


def error_code(exc: bce.ClientError) -> str:
    """The S3 error code of a ClientError, else its HTTP status as text."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code:
        return code
    return str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def _class_of(exc: BaseException) -> tuple[type[N5fsError], str]:
    if isinstance(exc, bce.ClientError):
        code = error_code(exc)
        if code in ERROR_CODES:
            return ERROR_CODES[code], code
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return ERROR_CODES.get(str(status), N5fsError), code or "error"
    for kinds, cls in _BOTOCORE:
        if isinstance(exc, kinds):
            return cls, type(exc).__name__
    return N5fsError, type(exc).__name__


def unwrapped(exc: BaseException) -> BaseException:
    """The ClientError behind boto3's S3UploadFailedError, which re-raises without the code."""
    if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, bce.ClientError):
        return exc.__context__
    return exc


def translate(exc: BaseException, where: str, key: str = "") -> N5fsError:
    """Our error for a boto3/botocore failure; ``where`` names the store (bucket, endpoint).

    Callers ``raise translate(e, ...) from e`` so the boto3 exception stays as ``__cause__``.
    """
    cls, code = _class_of(exc)
    if code == "NoSuchBucket":
        return cls(f"s3 bucket does not exist: {where} (NoSuchBucket)")
    what = f" for key {key!r}" if key else ""
    return cls(f"s3 {code}{what} in {where}: {exc}")


class SilentEndpoint:
    """Fail fast while the endpoint is known not to answer.

    One request on a silent endpoint costs its whole timeout budget (connect, read, retries:
    ~12 s by default), and one POSIX call may make several requests one after another (a
    lookup of each path component: a LIST, then a detection round). Once a request has timed
    out with all its retries, the next ``cooldown`` seconds of requests fail at once with
    StoreUnavailable (EIO) instead of each waiting again; the first request after that asks
    the endpoint again. So a call on a hung endpoint answers EIO within about one request's
    budget, however many requests it would have made. Requests already waiting finish their
    own timeouts.

    State: one float (``_silent_until``), assigned and read whole (atomic under the GIL);
    no lock. Hooked into the client's events, so every request counts: the store's own calls,
    paginated LISTs and boto3's managed transfers alike.
    """

    _TIMEOUTS = (
        bce.ConnectTimeoutError,
        bce.ReadTimeoutError,
        bce.EndpointConnectionError,
        bce.ConnectionClosedError,
    )

    def __init__(
        self, where: str, cooldown: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.where = where
        self.cooldown = cooldown
        self.clock = clock
        self._silent_until = 0.0
        self._since = 0.0

    def attach(self, client: Any) -> SilentEndpoint:
        client.meta.events.register("before-call.s3", self._before_call)
        client.meta.events.register("after-call-error.s3", self._after_error)
        return self

    def _before_call(self, **_: Any) -> None:
        now = self.clock()
        if now < self._silent_until:
            raise StoreUnavailable(
                f"s3 endpoint of {self.where} did not answer a request "
                f"{now - self._since:.0f} s ago (timed out after its retries); failing at once "
                f"for {self._silent_until - now:.0f} s more, then asking again"
            )

    def _after_error(self, exception: BaseException | None = None, **_: Any) -> None:
        if isinstance(exception, self._TIMEOUTS):
            now = self.clock()
            self._since = now
            self._silent_until = now + self.cooldown
