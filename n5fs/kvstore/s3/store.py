"""S3 (and S3-compatible servers) through boto3.

Keys live under the spec's ``path`` (a prefix: ``"vol"`` and ``"vol/"`` both mean the
folder ``vol/``). Durability: ``set`` is one PUT, or above :data:`MULTIPART_THRESHOLD` a
multipart upload that is completed only once every part is in (and aborted otherwise), so a
reader never sees a torn value. Every multipart upload is journaled, so one that a killed
process left is aborted by a later :meth:`S3Store.sweep` (:mod:`n5fs.kvstore.s3.uploads`).
Errors are translated once, by :func:`~n5fs.kvstore.s3.errors.translate`.

Timeouts and addressing are the client's (:mod:`~n5fs.kvstore.s3.client`), retries the
policy's (:mod:`~n5fs.kvstore.s3.retries`): a reset or a ``5xx`` is retried, a silent endpoint
costs a POSIX call an EIO within about 12 s, never a hang. Integrity is
:mod:`~n5fs.kvstore.s3.integrity`'s: a write is acknowledged only once the store is known to
hold exactly its bytes (``Content-MD5``, the answer's ETag, a HEAD for a lost answer), a read
hands on only bytes that are the object's (resumed by range, checked against its checksum).
Reads after the first take :mod:`~n5fs.kvstore.s3.lean`'s path: the request botocore's first
GetObject showed, sent without its pipeline, with the same retries, breaker, throttle and
checks (any answer but an object, an absent key or a transient fault is asked again through
botocore). LIST pages likewise, once botocore's first LIST showed the route and its page
was parsed alike (:mod:`~n5fs.kvstore.s3.leanlist`).

Timestamps: user metadata ``x-amz-meta-mtime``, seconds with nine decimals (rclone's form;
s3fs-fuse reads it too), which ``stat`` (HEAD) reports, else LastModified (``list`` always
reports LastModified: a LIST carries no user metadata). :meth:`S3Store.set_with_mtime` sends
it with the PUT; :meth:`S3Store.set_mtime` copies the object onto itself with it. ``copy``
and ``rename`` keep the source's time, headers, user metadata and storage class (not ACLs).
Every time kept so is also noted in its folder's hidden times index, which a LIST names, so
that ``list`` and ``walk`` show kept times without a HEAD per object once a mount asks
(:meth:`S3Store.show_kept_times`; :mod:`~n5fs.kvstore.s3.times` says when and at what cost);
no file may be called ``.n5fs-mtimes`` (AccessDenied).

Conditional writes (:meth:`S3Store.set_if`, :mod:`n5fs.kvstore.s3.conditional`): ``If-Match``
(``If-None-Match: *`` to create) on the PUT or on CompleteMultipartUpload; a refusal is
VersionConflict (EAGAIN), never EIO, never retried; versions are ETags compared as opaque
strings; whether the endpoint honours them is probed once with a hidden scratch object.

Limitations: S3 has no empty prefixes (a folder exists through its keys); objects whose
names are not valid keys (``dir/`` console markers, ``a//b``, ``./x``) are invisible to
``list`` but are removed by ``delete_prefix``. A HEAD cannot tell a missing bucket from a
missing key, so :meth:`S3Store.from_spec` checks the bucket once, at open.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from boto3.exceptions import S3UploadFailedError
from botocore import exceptions as bce

from n5fs.errors import (
    AccessDenied,
    InvalidSource,
    KeyNotFound,
    N5fsError,
    NotSupported,
    StoreUnavailable,
)
from n5fs.kvstore.abilities import StoreTraits
from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, Versioned, slice_bytes
from n5fs.kvstore.keys import check_key, check_prefix, dir_prefix, folder_of
from n5fs.kvstore.s3 import conditional, integrity, retries, uploads
from n5fs.kvstore.s3.client import checksum_args, client_for, transfer_config
from n5fs.kvstore.s3.errors import (
    ABSENT,
    EMPTY_RANGE,
    error_code,
    translate,
    unwrapped,
)
from n5fs.kvstore.s3.headers import MTIME_META, copy_args, format_mtime, mtime_of
from n5fs.kvstore.s3.lean import Fallback, LeanGets
from n5fs.kvstore.s3.leanlist import LeanLists
from n5fs.kvstore.s3.leftovers import S3Leftovers
from n5fs.kvstore.s3.times import KeptTimes, index_key, is_index
from n5fs.kvstore.s3.uploads import Upload, UploadJournal
from n5fs.kvstore.spec import S3Spec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from n5fs.kvstore.tempnames import Leftover

log = logging.getLogger(__name__)

MiB = 1 << 20
#: values at least this large go up as a multipart upload (parts of :data:`PART_SIZE`)
MULTIPART_THRESHOLD = 16 * MiB
PART_SIZE = 16 * MiB
#: the largest object a single CopyObject may copy; above it, a multipart copy
SINGLE_COPY_LIMIT = 5 * 1024 * MiB
#: attempts of one write whose answer shows other bytes stored than sent
PUT_ATTEMPTS = 5
#: S3 caps DeleteObjects at 1,000 keys
_DELETE_BATCH = 1000
#: keys per request of a :meth:`S3Store.walk` (S3's cap, asked for explicitly so that an
#: S3-compatible server with a larger default keeps to it: the gateway relies on it)
WALK_PAGE = 1000

__all__ = ["MiB", "S3Store", "error_code", "translate"]

Meta = dict[str, str] | None  # user metadata
Args = dict[str, Any]  # a request's parameters

# -- the store -------------------------------------------------------------------------------


class S3Store(KvStore):
    """An S3 bucket and prefix, with :class:`~n5fs.kvstore.abilities.ConditionalWrites`.

    ``get_many``, multipart parts and ``copy_many`` share one bounded pool of the store's own
    (``n5fs-s3``): the store lives below the gateway and is used without one (``validate``,
    the CLI), so its threads are its own, started at first use and shut down by ``close``.
    """

    spec_type: ClassVar[type[S3Spec]] = S3Spec
    #: a LIST carries LastModified, not the ``mtime`` metadata: ``stat`` reports that, and
    #: listings do once asked (:meth:`show_kept_times`, the times indexes). One
    #: request per folder is the cost of a chunk tree listed folder by folder; a walk answers
    #: 1,000 keys of any folders per request. Many mounts may share a bucket. A write and a
    #: read are a round trip at least.
    traits = StoreTraits(
        listing_mtimes=False,
        flat_listing_preferred=True,
        shared_versions=True,
        remote_writes=True,
        remote_reads=True,
    )

    def __init__(
        self,
        spec: S3Spec,
        *,
        max_workers: int = 16,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        part_size: int = PART_SIZE,
        single_copy_limit: int = SINGLE_COPY_LIMIT,
    ) -> None:
        if part_size < 5 * MiB:
            raise InvalidSource(f"S3 parts are at least 5 MiB, got part_size={part_size}")
        self._spec = spec
        self._prefix = dir_prefix(spec.path) if spec.path else ""
        self._client = client_for(spec, max_workers)
        #: the faults this store handled (:meth:`fault_counters`)
        self.tally = retries.Tally()
        self._silent, self.throttle, policy = retries.attach(
            self._client, self.where, spec.max_attempts, self.tally
        )
        #: GETs past botocore's pipeline, once its first GET showed the route
        self._lean = LeanGets(self._client, policy, self._silent, self.throttle)
        #: LIST pages likewise, once botocore's first LIST showed the route and the parse
        self._lean_lists = LeanLists(self._client, policy, self._silent, self.throttle)
        self._max_workers = max_workers
        self._threshold = multipart_threshold
        self._part_size = part_size
        self._copy_limit = single_copy_limit
        self._payer: dict[str, str] = {"RequestPayer": "requester"} if spec.requester_pays else {}
        self._pool_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        journal = UploadJournal()
        uploads.watch_uploads(self._client, journal)
        self._leftovers = S3Leftovers(
            spec.bucket,
            self._prefix,
            journal,
            objects=lambda prefix: self._pages(prefix, None),
            uploads=self._uploads_under,
            abort=self._abort,
        )
        #: the kept times its LISTs show (:mod:`~n5fs.kvstore.s3.times`)
        self._times = KeptTimes(self, format_mtime)

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
        if byte_range is not None and byte_range.length == 0:
            return None if self.stat(key) is None else b""
        read = self._read(key, byte_range.http_header() if byte_range is not None else None)
        if read is None:
            return None
        answer, data = read
        if byte_range is not None and "ContentRange" not in answer:
            data = slice_bytes(data, byte_range)  # a server that ignored the Range header
        return data

    def get_versioned(self, key: str) -> Versioned | None:
        """One GetObject: the body and the ETag it was read at (quoted, as S3 gives it)."""
        read = self._read(key, None)
        if read is None:
            return None
        answer, data = read
        return Versioned(data, answer.get("ETag"))

    def _read(self, key: str, range_header: str | None) -> tuple[dict[str, Any], bytes] | None:
        """A GET read whole, resumed and checked (:func:`~n5fs.kvstore.s3.integrity.read_body`);
        None for an absent key, empty bytes for a range past the end."""
        full = self._full(key)
        with self._errors(key):
            try:
                return integrity.read_body(
                    partial(self._get_object, full), key, self.where, range_header, self.tally.add
                )
            except bce.ClientError as exc:
                code = error_code(exc)
                if code in ABSENT:
                    return None
                if code in EMPTY_RANGE and range_header is not None:
                    return {}, b""
                raise

    def _get_object(self, full: str, **args: Any) -> dict[str, Any]:
        """One GetObject of ``full``: the lean path (:mod:`~n5fs.kvstore.s3.lean`) where it
        knows the route and the answer, else botocore's (which teaches it the route)."""
        if self._lean.ready:
            try:
                return self._lean.get(full, **args)
            except Fallback as exc:
                log.debug("s3: GET of %r through botocore: %s", full, exc)
        with self._lean.expecting(full):
            answer: dict[str, Any] = self._call("get_object", Key=full, **args)
        return answer

    def stat(self, key: str) -> KeyInfo | None:
        """Size and time from a HEAD: the ``mtime`` metadata if any, else LastModified."""
        head = self._head(key)
        if head is None:
            return None
        return KeyInfo(key, int(head["ContentLength"]), mtime_of(head), head.get("ETag"))

    def _head(self, key: str) -> dict[str, Any] | None:
        full = self._full(key)
        with self._errors(key):
            try:
                head: dict[str, Any] = self._call("head_object", Key=full)
            except bce.ClientError as exc:
                if error_code(exc) in ABSENT:
                    return None
                raise
        return head

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        check_prefix(prefix)
        keys: list[KeyInfo] = []
        prefixes: list[str] = []
        indexes: dict[str, str] = {}
        for page in self._pages(prefix, delimiter):
            keys.extend(self._infos(page, indexes))
            for common in page.get("CommonPrefixes", ()):
                rel = self._relative(common["Prefix"], as_prefix=True)
                if rel is not None:
                    prefixes.append(rel)
        whole = prefix if delimiter == "/" and (not prefix or prefix.endswith("/")) else None
        keys = self._times.listed(keys, indexes, whole=whole)
        return Listing(tuple(keys), tuple(prefixes))

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        """Page by page, in key order (S3 lists in UTF-8 byte order, which is the order of
        Python strings), at most :data:`WALK_PAGE` keys a request: a page is requested when
        the caller gets to it, so a caller that stops early stops the requests, and a key
        was read no earlier than the caller asked for the key a page before it."""
        check_prefix(prefix)
        seen: dict[str, str] = {}
        for page in self._pages(prefix, None, page_size=WALK_PAGE):
            indexes: dict[str, str] = {}
            infos = list(self._infos(page, indexes))
            yield from self._times.listed(infos, indexes, shown=seen)
            seen.update(indexes)

    def _infos(self, page: Mapping[str, Any], indexes: dict[str, str]) -> Iterator[KeyInfo]:
        """The keys of a LIST page; the times indexes it names go to ``indexes`` (folder ->
        ETag), never to the keys."""
        for obj in page.get("Contents", ()):
            rel = self._relative(obj["Key"])
            if rel is None or conditional.is_scratch(rel):
                continue
            if is_index(rel):
                indexes[folder_of(rel)] = obj.get("ETag", "")
                continue
            mtime = obj["LastModified"].timestamp()
            yield KeyInfo(rel, int(obj["Size"]), mtime, obj.get("ETag"))

    def _pages(
        self, prefix: str, delimiter: str | None, *, page_size: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Pages of ListObjectsV2 under ``prefix`` (S3 answers 1,000 keys per page), each
        requested when the caller gets to it. Paginated by the rules of botocore's
        paginator: a page that is not truncated, or names no next token, is the last; a
        page naming the token it was asked with is an error."""
        args: dict[str, Any] = {"Prefix": self._prefix + prefix}
        if delimiter:
            args["Delimiter"] = delimiter
        if page_size is not None:
            args["MaxKeys"] = page_size
        with self._errors(prefix):
            while True:
                page = self._list_page(dict(args))
                yield page
                token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
                if not token:
                    return
                if token == args.get("ContinuationToken"):
                    message = f"The same next token was received twice: {token!r}"
                    raise bce.PaginationError(message=message)
                args["ContinuationToken"] = token

    def _list_page(self, args: dict[str, Any]) -> dict[str, Any]:
        """One ListObjectsV2 page: the lean path (:mod:`~n5fs.kvstore.s3.leanlist`) where
        it knows the route and reads the answer, else botocore's (which teaches it)."""
        if self._lean_lists.ready:
            try:
                return self._lean_lists.page(args)
            except Fallback as exc:
                log.debug("s3: LIST of %r through botocore: %s", args, exc)
        return self._lean_lists.through_botocore(
            args, partial(self._call, "list_objects_v2", **args)
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
        self._check_writable(key)
        with self._errors(key):
            self._put(self._full(key), value, {})
        self._times.removed(key)

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        """One PUT carrying the time as metadata (no HEAD, no copy after it)."""
        self._check_writable(key)
        with self._errors(key):
            answer = self._put(self._full(key), value, {}, {MTIME_META: format_mtime(mtime)})
        self._times.kept(key, mtime, answer.get("ETag"), len(value))
        return True

    def _put(
        self, full: str, value: bytes | memoryview, condition: dict[str, str], meta: Meta = None
    ) -> Any:
        """Store ``value`` and return the answer that made the object: one PUT, or a
        multipart upload above the threshold (``condition`` on its CompleteMultipartUpload,
        ``meta`` user metadata). Acknowledged only once the store is known to hold exactly
        these bytes (:mod:`~n5fs.kvstore.s3.integrity`): an answer showing other bytes is a
        failed attempt, a failure whose outcome is unknown is resolved by a HEAD."""
        view = memoryview(value).cast("B")
        if len(view) < self._threshold:
            digests = [integrity.Digest(view)]
            extra = {"Metadata": meta} if meta else {}

            def send(cond: dict[str, str]) -> Any:
                sums = {"ContentMD5": digests[0].content_md5, "ChecksumCRC32": digests[0].crc32}
                return self._call("put_object", Key=full, Body=bytes(view), **sums, **cond, **extra)

        else:
            digests = uploads.part_digests(view, self._part_size)

            def send(cond: dict[str, str]) -> Any:
                return uploads.upload_in_parts(
                    self._call,
                    self._executor(),
                    full,
                    view,
                    self._part_size,
                    digests,
                    checksum_args(self._client),
                    metadata=meta,
                    **cond,
                )

        multipart = len(view) >= self._threshold
        etag = integrity.expected_etag(digests, multipart=multipart)
        crc32 = None if multipart else digests[0].crc32
        damaged: str | None = None  # the ETag of damaged bytes our last attempt stored
        for attempt in range(1, PUT_ATTEMPTS + 1):
            try:
                answer = send(condition)
            except (bce.BotoCoreError, bce.ClientError) as exc:
                if self._resolvable(exc) and self._holds(full, etag, crc32):
                    log.info("s3: %r landed although its answer was lost (%s)", full, exc)
                    self.tally.add("s3_writes_resolved")
                    return {"ETag": etag}
                if damaged is not None:
                    self._remove_damaged(full, damaged)
                raise
            if integrity.stored_exactly(answer, etag, crc32) is not False:
                return answer
            damaged = answer.get("ETag")
            self.tally.add("s3_writes_resent")
            log.warning(
                "s3: %r stored other bytes than sent (ETag %s, sent %s; attempt %d of %d)",
                full,
                answer.get("ETag"),
                etag,
                attempt,
                PUT_ATTEMPTS,
            )
            if condition:
                condition = conditional.conditions(damaged)  # replace our own
        if damaged is not None:
            self._remove_damaged(full, damaged)
        raise StoreUnavailable(
            f"s3: {full!r} in {self.where}: the endpoint stored other bytes than sent "
            f"{PUT_ATTEMPTS} times (ETags differ from the MD5 of the bytes)"
        )

    def _remove_damaged(self, full: str, etag: str) -> None:
        """Delete the damaged bytes a failed write left at ``full`` (only while they are
        still there: ``If-Match``), so readers find the key absent rather than corrupt. Our
        write had replaced whatever was there before, so nothing good is lost. An endpoint
        that ignores ``If-Match`` on deletes could remove another writer's bytes that landed
        in between; one that refuses it keeps the damaged bytes: either is logged."""
        try:
            self._call("delete_object", Key=full, IfMatch=etag)
        except (bce.BotoCoreError, bce.ClientError):
            log.exception("s3: could not remove the damaged bytes stored at %r", full)
            return
        log.warning("s3: removed the damaged bytes a failed write stored at %r", full)
        self.tally.add("s3_damaged_removed")

    def _resolvable(self, exc: BaseException) -> bool:
        """Whether a failed write may have landed all the same: the connection broke, or an
        error answered a retry (an earlier attempt may have landed: a retried create is then
        refused as a conflict). Not a first attempt's answer: nothing landed before it. Not
        while the endpoint is silent: the HEAD could not answer either."""
        if self._silent.silent:
            return False
        if isinstance(exc, bce.ClientError):
            return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0
        return isinstance(exc, retries.BROKEN)

    def _holds(self, full: str, etag: str, crc32: str | None) -> bool:
        def head() -> dict[str, Any] | None:
            try:
                answer: dict[str, Any] = self._call("head_object", Key=full, ChecksumMode="ENABLED")
            except bce.ClientError as exc:
                if error_code(exc) in ABSENT:
                    return None
                raise
            return answer

        return integrity.holds(head, etag, crc32)

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        """A PUT with ``If-Match: version`` (``If-None-Match: *`` for None); above the
        multipart threshold the condition goes on CompleteMultipartUpload. Returns the new
        ETag; a refusal (412, 409, or 404 to an ``If-Match``) is VersionConflict."""
        full = self._full(key)
        self._check_writable(key)
        condition = conditional.conditions(version)
        try:
            answer = self._put(full, value, condition)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            code = error_code(exc) if isinstance(exc, bce.ClientError) else ""
            refused = conditional.conflict(code, key, version, self.where)
            raise (refused or translate(exc, self.where, key)) from exc
        etag: str | None = answer.get("ETag")
        self._times.removed(key)
        return etag

    def fault_counters(self) -> dict[str, int]:
        """Retries, timeouts, throttling answers (and the current request-rate limit, 0 for
        none), requests failed at once on a silent endpoint, writes sent again or resolved,
        damaged bytes removed, reads resumed or begun anew."""
        rate = self.throttle.rate
        return {**self.tally.snapshot(), "s3_rate_limit": 0 if rate is None else round(rate)}

    def probe_conditional_writes(self) -> str | None:
        """Ask the endpoint (:func:`~n5fs.kvstore.s3.conditional.probe`); never raises."""
        return conditional.probe(self)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a local file, checked like any value (:meth:`_upload`)."""
        self._upload(key, path, None)
        self._times.removed(key)

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        size, answer = self._upload(key, path, {MTIME_META: format_mtime(mtime)})
        self._times.kept(key, mtime, answer.get("ETag"), size)
        return True

    def _upload(self, key: str, path: str | os.PathLike[str], meta: Meta) -> tuple[int, Any]:
        """The file's bytes through :meth:`_put` (checked like any value): read whole below
        the multipart threshold, mapped above it (parts are copied a window at a time), so
        memory stays bounded. Returns the size and the answer that made the object."""
        self._check_writable(key)
        full = self._full(key)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < self._threshold:
                with self._errors(key):
                    return size, self._put(full, f.read(), {}, meta)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    with self._errors(key):
                        return size, self._put(full, view, {}, meta)
                finally:
                    view.release()

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._check_writable(key)
        with self._errors(key):
            self._call("delete_object", Key=full)
        self._times.removed(key)

    def copy(self, src: str, dst: str) -> None:
        """Server-side: CopyObject up to 5 GiB, a managed multipart copy above. The copy
        keeps the source's time (as ``mtime`` metadata) and headers (module docstring)."""
        source, target = self._full(src), self._full(dst)
        self._check_writable(dst)
        head = self._head(src)
        if head is None:
            raise KeyNotFound(f"copy source {src!r} does not exist in {self.where}")
        if source == target:
            return
        mtime = mtime_of(head)
        with self._errors(src):
            etag = self._copy(source, target, head, copy_args(head, mtime))
        self._times.kept(dst, mtime, etag, int(head["ContentLength"]))

    def set_mtime(self, key: str, mtime: float) -> None:
        """A copy onto itself with ``mtime`` metadata (other headers kept); an object that
        changes meanwhile keeps its own time."""
        full = self._full(key)
        self._check_writable(key)
        head = self._head(key)
        if head is None:
            raise KeyNotFound(f"cannot set the time of {key!r}: absent in {self.where}")
        args = {**copy_args(head, mtime), "CopySourceIfMatch": head["ETag"]}
        with self._errors(key):
            try:
                etag = self._copy(full, full, head, args)
            except bce.ClientError as exc:
                if error_code(exc) not in ("PreconditionFailed", "412"):
                    raise
                log.debug("s3: %r changed while its time was set; it keeps its own", key)
                return
        self._times.kept(key, mtime, etag, int(head["ContentLength"]))

    def _copy(self, source: str, target: str, head: Args, args: Args) -> str | None:
        """Copy and return the copy's ETag (a multipart copy's from a HEAD after it)."""
        origin = {"Bucket": self._spec.bucket, "Key": source}
        if int(head["ContentLength"]) <= self._copy_limit:
            answer = self._call("copy_object", Key=target, CopySource=origin, **args)
            etag: str | None = answer.get("CopyObjectResult", {}).get("ETag")
            return etag
        self._client.copy(
            origin,
            self._spec.bucket,
            target,
            ExtraArgs={**self._payer, **args},
            Config=transfer_config(self._threshold, self._part_size),
        )
        made = self._call("head_object", Key=target)
        return str(made["ETag"]) if made.get("ETag") else None

    def delete_prefix(self, prefix: str) -> int:
        """Page by page: every object under ``prefix`` (markers included), 1,000 a request."""
        check_prefix(prefix)
        self._check_writable(prefix or "/")
        self._times.drop_under(prefix)
        removed = 0
        for page in self._pages(prefix, None):
            names = [obj["Key"] for obj in page.get("Contents", ())]
            for start in range(0, len(names), _DELETE_BATCH):
                removed += self._delete_batch(names[start : start + _DELETE_BATCH])
        return removed

    def copy_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Server-side copies on the store's pool (a folder rename moves keys this way)."""
        if len(pairs) <= 1:
            for src, dst in pairs:
                self.copy(src, dst)
            return
        for _ in self._executor().map(lambda pair: self.copy(*pair), pairs):
            pass  # re-raises the first failure

    def delete_many(self, keys: Sequence[str]) -> None:
        """DeleteObjects, 1,000 keys a request."""
        self._check_writable(keys[0] if keys else "/")
        names = [self._full(key) for key in keys]
        for start in range(0, len(names), _DELETE_BATCH):
            self._delete_batch(names[start : start + _DELETE_BATCH])
        for key in keys:
            self._times.removed(key)

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

    # -- leftovers of killed writers: multipart uploads ------------------------------------

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        """Incomplete multipart uploads and probe scratch objects
        (:mod:`~n5fs.kvstore.s3.leftovers`)."""
        return self._leftovers.find(prefix)

    def remove_leftover(self, leftover: Leftover) -> None:
        """Abort the upload(s) behind ``leftover`` (journals pruned); delete a scratch object."""
        self._check_writable(leftover.path or "/")
        if leftover.what == conditional.SCRATCH_WHAT:
            self.delete(leftover.path)
            return
        self._leftovers.abort(leftover)

    def sweep(self, prefix: str = "") -> tuple[Leftover, ...]:
        """Abort dead writers' uploads under ``prefix``, then prune their journal lines."""
        return self._leftovers.sweep(prefix, self.remove_leftover)

    def _uploads_under(self, full_prefix: str) -> Iterator[dict[str, Any]]:
        """ListMultipartUploads, page by page; nothing where the server has no such call."""
        paginator = self._client.get_paginator("list_multipart_uploads")
        pages = paginator.paginate(Bucket=self._spec.bucket, Prefix=full_prefix, **self._payer)
        try:
            with self._errors(full_prefix):
                for page in pages:
                    yield from page.get("Uploads", ())
        except NotSupported as exc:
            log.debug("s3: cannot list multipart uploads in %s: %s", self.where, exc)

    def _abort(self, upload: Upload, key: str) -> None:
        """Abort one multipart upload; one that is gone already is fine."""
        with self._errors(key):
            try:
                self._call("abort_multipart_upload", Key=upload.key, UploadId=upload.upload_id)
            except bce.ClientError as exc:
                if error_code(exc) not in ("NoSuchUpload", "404"):
                    raise

    # -- kept times in listings (:mod:`~n5fs.kvstore.s3.times`) -------------------------------

    def show_kept_times(self, on: bool) -> None:
        """Listings show the times n5fs kept (one GET per folder that has an index) or only
        LastModified (no request more)."""
        self._times.shown = on

    def remove_prefix(self, prefix: str) -> None:
        """An emptied folder goes with its times index (which alone would keep it listed)."""
        folder = dir_prefix(prefix)
        if folder and self._times.index_known(folder):
            self._times.drop_under(folder)
            self.delete_index(index_key(folder))

    def flush(self) -> None:
        """Write the kept times not yet in their indexes (a mount's ``fsync``)."""
        self._times.flush()

    def read_index(self, key: str) -> tuple[bytes, str] | None:
        read = self._read(key, None)
        if read is None:
            return None
        answer, data = read
        return data, answer.get("ETag", "")

    def write_index(self, key: str, data: bytes, version: str | None) -> str:
        super()._check_writable(key)
        try:
            answer = self._put(self._full(key), data, conditional.conditions(version))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            code = error_code(exc) if isinstance(exc, bce.ClientError) else ""
            refused = conditional.conflict(code, key, version, self.where)
            raise (refused or translate(exc, self.where, key)) from exc
        etag: str = answer.get("ETag", "")
        return etag

    def delete_index(self, key: str) -> None:
        super()._check_writable(key)
        with self._errors(key):
            self._call("delete_object", Key=self._full(key))

    def _check_writable(self, key: str) -> None:
        super()._check_writable(key)
        if is_index(key):
            raise AccessDenied(f"{key!r}: n5fs keeps the folder's kept times there")

    def close(self) -> None:
        self._times.close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._client.close()
