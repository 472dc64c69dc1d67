"""The S3 error table: boto3/botocore failures -> n5fs's error classes, in one place, so a
failure answers with the same class and errno whichever store call met it.

``translate`` names the store (bucket, endpoint) and the key in every message; callers
``raise translate(e, ...) from e`` so the boto3 exception stays as ``__cause__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    from collections.abc import Mapping

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
#: ``If-Match`` is one too: :mod:`n5fs.kvstore.s3.conditional`)
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
