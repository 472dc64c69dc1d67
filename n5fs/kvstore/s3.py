"""S3 (and S3-compatible servers) through boto3.

Keys live under the spec's ``path`` (a prefix: ``"vol"`` and ``"vol/"`` both mean the
folder ``vol/``). Durability: ``set`` is one PUT, or above :data:`MULTIPART_THRESHOLD` a
multipart upload that is completed only once every part is in (and aborted otherwise), so a
reader never sees a torn value. Errors are translated once, here, by :func:`translate`.

Limitations: S3 has no empty prefixes (a folder exists through its keys); objects whose
names are not valid keys (``dir/`` console markers, ``a//b``, ``./x``) are invisible to
``list`` but are removed by ``delete_prefix``. A HEAD cannot tell a missing bucket from a
missing key, so :meth:`S3Store.from_spec` checks the bucket once, at open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore import UNSIGNED
from botocore import exceptions as bce
from botocore.config import Config

from n5fs.errors import (
    AccessDenied,
    InvalidSource,
    KeyNotFound,
    N5fsError,
    NotSupported,
    StoreUnavailable,
)
from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, slice_bytes
from n5fs.kvstore.keys import check_key, check_prefix, dir_prefix
from n5fs.kvstore.spec import S3Spec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

log = logging.getLogger(__name__)

MiB = 1 << 20
#: values at least this large go up as a multipart upload (parts of :data:`PART_SIZE`)
MULTIPART_THRESHOLD = 16 * MiB
PART_SIZE = 16 * MiB
#: the largest object a single CopyObject may copy; above it, a multipart copy
SINGLE_COPY_LIMIT = 5 * 1024 * MiB
#: S3 caps a multipart upload at 10,000 parts and DeleteObjects at 1,000 keys
_MAX_PARTS = 10_000
_DELETE_BATCH = 1000
_PARTS_IN_FLIGHT = 4
_TRANSFER_THREADS = 8

# -- the error table (STYLE P4) --------------------------------------------------------------

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
    "MethodNotAllowed": NotSupported,
    "NotImplemented": NotSupported,
    "501": NotSupported,
}
#: GET answers for a key that is absent (the hot path: no exception leaves the store)
_ABSENT = frozenset({"NoSuchKey", "NotFound", "404"})
#: GET answers for a range that starts past the end (or any range of an empty object)
_EMPTY_RANGE = frozenset({"InvalidRange", "416"})

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


# -- the store -------------------------------------------------------------------------------


def _custom_endpoint(spec: S3Spec) -> bool:
    """S3-compatible servers (MinIO, Ceph, moto) rarely resolve ``bucket.host``: use paths."""
    return bool(
        spec.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )


def _client_for(spec: S3Spec, max_workers: int, max_attempts: int) -> Any:
    """A thread-safe boto3 client: the spec's endpoint, region, profile and credentials.

    Its connection pool has room for the store's workers plus one transfer (``put_file``,
    managed copy), so neither waits on a socket held by the other.
    """
    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        max_pool_connections=max_workers + _TRANSFER_THREADS,
        s3={"addressing_style": "path"} if _custom_endpoint(spec) else {},
        signature_version=UNSIGNED if spec.anonymous else None,
    )
    try:
        session = boto3.Session(profile_name=spec.profile)
        return session.client(
            "s3", endpoint_url=spec.endpoint, region_name=spec.aws_region, config=config
        )
    except (bce.BotoCoreError, ValueError) as exc:
        raise InvalidSource(f"cannot set up s3 access for {spec.to_url()}: {exc}") from exc


class S3Store(KvStore):
    """An S3 bucket and prefix. ``get_many`` and multipart parts share one bounded pool."""

    spec_type: ClassVar[type[S3Spec]] = S3Spec

    def __init__(
        self,
        spec: S3Spec,
        *,
        max_workers: int = 16,
        max_attempts: int = 4,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        part_size: int = PART_SIZE,
        single_copy_limit: int = SINGLE_COPY_LIMIT,
    ) -> None:
        if part_size < 5 * MiB:
            raise InvalidSource(f"S3 parts are at least 5 MiB, got part_size={part_size}")
        self._spec = spec
        self._prefix = dir_prefix(spec.path) if spec.path else ""
        self._client = _client_for(spec, max_workers, max_attempts)
        self._max_workers = max_workers
        self._threshold = multipart_threshold
        self._part_size = part_size
        self._copy_limit = single_copy_limit
        self._payer: dict[str, str] = {"RequestPayer": "requester"} if spec.requester_pays else {}
        self._pool_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_spec(cls, spec: S3Spec) -> S3Store:
        """Open the store and check its bucket, so a typo fails at open, not at first read."""
        store = cls(spec)
        try:
            store.check_bucket()
        except N5fsError:
            store.close()
            raise
        return store

    @property
    def spec(self) -> S3Spec:
        return self._spec

    @property
    def client(self) -> Any:
        """The boto3 client (for tools and tests that look behind the store)."""
        return self._client

    @property
    def where(self) -> str:
        return f"s3://{self._spec.bucket}/{self._prefix} at {self._client.meta.endpoint_url}"

    def check_bucket(self) -> None:
        """Raise KeyNotFound naming the bucket and endpoint when the bucket does not exist.

        A 403 passes: a public bucket may deny HeadBucket to anonymous callers yet serve GETs.
        """
        try:
            self._client.head_bucket(Bucket=self._spec.bucket)
        except bce.ClientError as exc:
            if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise KeyNotFound(f"s3 bucket does not exist: {self.where}") from exc
            if error_code(exc) not in ("403", "AccessDenied"):
                raise translate(exc, self.where) from exc
        except bce.BotoCoreError as exc:
            raise translate(exc, self.where) from exc

    @contextlib.contextmanager
    def _errors(self, key: str = "") -> Iterator[None]:
        try:
            yield
        except (bce.BotoCoreError, bce.ClientError, S3UploadFailedError) as exc:
            cause = unwrapped(exc)
            raise translate(cause, self.where, key) from cause

    def _full(self, key: str) -> str:
        return self._prefix + check_key(key)

    def _call(self, method: str, **kwargs: Any) -> Any:
        call: Callable[..., Any] = getattr(self._client, method)
        return call(Bucket=self._spec.bucket, **self._payer, **kwargs)

    # -- queries ----------------------------------------------------------------------------

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        full = self._full(key)
        if byte_range is not None and byte_range.length == 0:
            return None if self.stat(key) is None else b""
        extra = {"Range": byte_range.http_header()} if byte_range is not None else {}
        with self._errors(key):
            try:
                response = self._call("get_object", Key=full, **extra)
            except bce.ClientError as exc:
                code = error_code(exc)
                if code in _ABSENT:
                    return None
                if code in _EMPTY_RANGE:
                    return b""
                raise
            data: bytes = response["Body"].read()
        if byte_range is not None and "ContentRange" not in response:
            data = slice_bytes(data, byte_range)  # a server that ignored the Range header
        return data

    def stat(self, key: str) -> KeyInfo | None:
        full = self._full(key)
        with self._errors(key):
            try:
                head = self._call("head_object", Key=full)
            except bce.ClientError as exc:
                if error_code(exc) in _ABSENT:
                    return None
                raise
        return KeyInfo(key, int(head["ContentLength"]), head["LastModified"].timestamp())

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        check_prefix(prefix)
        keys: list[KeyInfo] = []
        prefixes: list[str] = []
        for page in self._pages(prefix, delimiter):
            for obj in page.get("Contents", ()):
                rel = self._relative(obj["Key"])
                if rel is not None:
                    keys.append(KeyInfo(rel, int(obj["Size"]), obj["LastModified"].timestamp()))
            for common in page.get("CommonPrefixes", ()):
                rel = self._relative(common["Prefix"], as_prefix=True)
                if rel is not None:
                    prefixes.append(rel)
        return Listing(tuple(keys), tuple(prefixes))

    def _pages(self, prefix: str, delimiter: str | None) -> Iterator[dict[str, Any]]:
        """Pages of ListObjectsV2 under ``prefix`` (S3 answers 1,000 keys per page)."""
        extra = {"Delimiter": delimiter} if delimiter else {}
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors(prefix):
            yield from paginator.paginate(
                Bucket=self._spec.bucket, Prefix=self._prefix + prefix, **self._payer, **extra
            )

    def _relative(self, full: str, *, as_prefix: bool = False) -> str | None:
        """The store key of an object name; ``None`` for names no key can spell."""
        rel = full[len(self._prefix) :]
        try:
            check_prefix(rel) if as_prefix else check_key(rel)
        except N5fsError:
            log.debug("s3: ignoring %r in %s: not a valid key", full, self.where)
            return None
        return rel

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        wanted = list(dict.fromkeys(keys))
        if len(wanted) <= 1:
            return {key: self.get(key) for key in wanted}
        return dict(zip(wanted, self._executor().map(self.get, wanted), strict=True))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="n5fs-s3")
            return self._pool

    # -- commands ---------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        full = self._full(key)
        self._check_writable(key)
        with self._errors(key):
            if len(value) < self._threshold:
                self._call("put_object", Key=full, Body=bytes(value))
            else:
                self._multipart(full, memoryview(value).cast("B"))

    def _checksum(self) -> dict[str, str]:
        """Mirror s3transfer: with default flexible checksums, parts carry a CRC32."""
        when = getattr(self._client.meta.config, "request_checksum_calculation", None)
        return {"ChecksumAlgorithm": "CRC32"} if when == "when_supported" else {}

    def _multipart(self, full: str, data: memoryview) -> None:
        """Upload parts on the pool; complete only when all are in, else abort.

        Parts go in windows of :data:`_PARTS_IN_FLIGHT`: botocore needs ``bytes`` bodies, so
        each part in flight is a copy, and the windows bound that extra memory.
        """
        size = max(self._part_size, -(-len(data) // _MAX_PARTS))
        checksum = self._checksum()
        upload = self._call("create_multipart_upload", Key=full, **checksum)["UploadId"]

        def put_part(number: int) -> dict[str, Any]:
            body = bytes(data[(number - 1) * size : number * size])
            answer = self._call(
                "upload_part", Key=full, UploadId=upload, PartNumber=number, Body=body, **checksum
            )
            part = {"ETag": answer["ETag"], "PartNumber": number}
            if "ChecksumCRC32" in answer and checksum:
                part["ChecksumCRC32"] = answer["ChecksumCRC32"]
            return part

        numbers = range(1, -(-len(data) // size) + 1)
        parts: list[dict[str, Any]] = []
        try:
            for start in range(0, len(numbers), _PARTS_IN_FLIGHT):
                window = numbers[start : start + _PARTS_IN_FLIGHT]
                parts.extend(self._executor().map(put_part, window))
            self._call(
                "complete_multipart_upload",
                Key=full,
                UploadId=upload,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            self._abort(full, upload)
            raise

    def _abort(self, full: str, upload: str) -> None:
        try:
            self._call("abort_multipart_upload", Key=full, UploadId=upload)
        except (bce.BotoCoreError, bce.ClientError):
            log.warning(
                "s3: could not abort upload %s of %r in %s", upload, full, self.where, exc_info=True
            )

    def _transfer_config(self) -> TransferConfig:
        return TransferConfig(
            multipart_threshold=self._threshold,
            multipart_chunksize=self._part_size,
            max_concurrency=_TRANSFER_THREADS,
        )

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Stream a local file up; boto3 goes multipart above the threshold (and aborts on
        failure), reading one part per worker at a time, so memory stays bounded."""
        full = self._full(key)
        self._check_writable(key)
        with self._errors(key):
            self._client.upload_file(
                os.fspath(path),
                self._spec.bucket,
                full,
                ExtraArgs=dict(self._payer) or None,
                Config=self._transfer_config(),
            )

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._check_writable(key)
        with self._errors(key):
            self._call("delete_object", Key=full)

    def copy(self, src: str, dst: str) -> None:
        """Server-side: CopyObject up to 5 GiB, a managed multipart copy above."""
        source, target = self._full(src), self._full(dst)
        self._check_writable(dst)
        info = self.stat(src)
        if info is None:
            raise KeyNotFound(f"copy source {src!r} does not exist in {self.where}")
        if source == target:
            return
        origin = {"Bucket": self._spec.bucket, "Key": source}
        with self._errors(src):
            if info.size <= self._copy_limit:
                self._call("copy_object", Key=target, CopySource=origin)
            else:
                self._client.copy(
                    origin,
                    self._spec.bucket,
                    target,
                    ExtraArgs=dict(self._payer) or None,
                    Config=self._transfer_config(),
                )

    def delete_prefix(self, prefix: str) -> int:
        """Page by page: every object under ``prefix`` (markers included), 1,000 a request."""
        check_prefix(prefix)
        self._check_writable(prefix or "/")
        removed = 0
        for page in self._pages(prefix, None):
            names = [obj["Key"] for obj in page.get("Contents", ())]
            for start in range(0, len(names), _DELETE_BATCH):
                removed += self._delete_batch(names[start : start + _DELETE_BATCH])
        return removed

    def _delete_batch(self, names: Sequence[str]) -> int:
        objects = [{"Key": name} for name in names]
        with self._errors(names[0]):
            answer = self._call("delete_objects", Delete={"Objects": objects, "Quiet": True})
        errors = answer.get("Errors", ())
        if errors:
            first = errors[0]
            fake = bce.ClientError({"Error": first}, "DeleteObjects")
            raise translate(fake, self.where, first.get("Key", "")[len(self._prefix) :])
        return len(names)

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._client.close()
