"""S3 multipart uploads: sending a large value in parts, and never losing track of one.

A multipart upload that is neither completed nor aborted stays in the bucket, invisible to
listings and billed, until someone aborts it. n5fs completes or aborts every upload it
starts, unless the process dies in between (``kill -9``, OOM, power loss). So every upload
this process starts is written down first in a small local journal, and a later mount
(``KvStore.sweep``) aborts the uploads whose writer is gone.

The journal: one file per writer, ``<writer tag>.uploads`` (see :mod:`n5fs.kvstore.tempnames`)
in :func:`journal_dir`, a JSON line per upload in flight (``bucket``, ``key``, ``upload_id``);
the line goes when the upload completes or aborts, the file when it holds no line. Lines are
written by hooks on the boto3 client's events (:func:`watch_uploads`), so the uploads boto3's
managed transfers start (``upload_file``, multipart ``copy``) are journaled like our own.

An upload is its writer's leftover, safe to abort (:func:`upload_is_dead`), when its journal's
writer is known to be dead (same host: pid gone, pid reused, or rebooted since), or when it is
in no journal of this host (another host, an older n5fs, a journal that could not be written)
and older than :data:`~n5fs.kvstore.tempnames.STALE_AFTER`. A writer on another host sharing
this journal directory (a shared home) cannot be asked either: its uploads age out the same way.

Lock discipline: one process-wide lock serialises every journal change of this process. Each
process appends only to its own file; a sweeper rewrites only the files of dead writers
(atomically: temp file + rename), so no two processes ever write one file at the same time.
A journal that cannot be written (read-only home) costs a warning, never an upload.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from n5fs.errors import StoreUnavailable
from n5fs.kvstore import tempnames
from n5fs.kvstore.s3.integrity import Digest, expected_etag, stored_exactly
from n5fs.kvstore.state import state_home
from n5fs.kvstore.tempnames import Leftover, Liveness, Writer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

log = logging.getLogger(__name__)

#: journal files end so; the name before it is the writer's tag
SUFFIX = ".uploads"
#: S3 caps a multipart upload at 10,000 parts
MAX_PARTS = 10_000
#: parts of one in-memory value in flight at once (each is a copy: botocore wants bytes)
PARTS_IN_FLIGHT = 4
#: sends of one part whose answer shows other bytes stored than sent
PART_ATTEMPTS = 5
#: the clock leftovers are aged by (tests replace it)
now: Callable[[], float] = time.time

_LOCK = threading.Lock()
_warned = False


def journal_dir() -> Path:
    """``uploads`` in n5fs's persistent state (:func:`~n5fs.kvstore.state.state_home`)."""
    return state_home() / "uploads"


@dataclass(frozen=True, slots=True)
class Upload:
    """One multipart upload: its bucket, full object key and upload id."""

    bucket: str
    key: str
    upload_id: str

    def line(self) -> str:
        return json.dumps({"bucket": self.bucket, "key": self.key, "upload_id": self.upload_id})

    @classmethod
    def parse(cls, line: str) -> Upload | None:
        """The upload of a journal line; None for a torn or foreign line."""
        try:
            doc = json.loads(line)
            upload = cls(doc["bucket"], doc["key"], doc["upload_id"])
        except (ValueError, KeyError, TypeError):
            return None
        fields = (upload.bucket, upload.key, upload.upload_id)
        return upload if all(isinstance(f, str) for f in fields) else None


class UploadJournal:
    """The journal files in one directory (module docstring)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = journal_dir() if directory is None else directory

    def file_of(self, writer: Writer) -> Path:
        return self.directory / f"{writer.tag}{SUFFIX}"

    def record(self, upload: Upload, writer: Writer | None = None) -> None:
        """Write ``upload`` down for ``writer`` (this process by default), durably."""
        path = self.file_of(writer or tempnames.current())
        data = (upload.line() + "\n").encode()
        with _LOCK:
            try:
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                _warn(f"cannot journal multipart upload {upload.upload_id} in {path}: {exc}")

    def forget(self, upload: Upload, writer: Writer | None = None) -> None:
        """Remove ``upload`` from ``writer``'s journal (this process's by default)."""
        self.drop(writer or tempnames.current(), {upload})

    def drop(self, writer: Writer, uploads: Iterable[Upload]) -> None:
        """Remove ``uploads`` (and torn lines) from ``writer``'s journal; remove an emptied one.

        Only for this process's journal or a dead writer's: a live writer appends to its own.
        """
        gone = set(uploads)
        path = self.file_of(writer)
        with _LOCK:
            try:
                _rewrite(path, lambda up: up is not None and up not in gone)
            except OSError as exc:
                _warn(f"cannot update the upload journal {path}: {exc}")

    def writers(self) -> dict[Writer, set[Upload]]:
        """Every journal in the directory: its writer and the uploads it holds."""
        found: dict[Writer, set[Upload]] = {}
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return found
        for name in names:
            writer = tempnames.writer_of(name)
            if name.startswith(".") or not name.endswith(SUFFIX) or writer is None:
                continue
            uploads = {up for up in _read(self.directory / name) if up is not None}
            found.setdefault(writer, set()).update(uploads)
        return found


def _read(path: Path) -> list[Upload | None]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [Upload.parse(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _rewrite(path: Path, keep: Callable[[Upload | None], bool]) -> None:
    """Keep the lines of ``path`` that ``keep`` accepts: a temp file renamed over it (a crash
    leaves the old journal or the new one), or no file once no line is left."""
    lines = _read(path)
    kept = [up for up in lines if keep(up)]
    if len(kept) == len(lines):
        return
    if not kept:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(up.line() + "\n" for up in kept if up is not None)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _warn(message: str) -> None:
    """Warn once per process: a journal that cannot be written fails the same way each time."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("%s (uploads a crash interrupts are then aborted only once a day old)", message)
    else:
        log.debug("%s", message)


# -- hooks on the client ---------------------------------------------------------------------

_CONTEXT_KEY = "n5fs_upload"


def watch_uploads(client: Any, journal: UploadJournal) -> None:
    """Journal every multipart upload ``client`` starts, and forget it when it ends."""
    events = client.meta.events
    for op in ("CreateMultipartUpload", "CompleteMultipartUpload", "AbortMultipartUpload"):
        events.register(f"before-parameter-build.s3.{op}", _remember_params)

    def started(http_response: Any, parsed: Mapping[str, Any], context: Any, **_: Any) -> None:
        upload_id = parsed.get("UploadId")
        target = context.get(_CONTEXT_KEY)
        if http_response.status_code < 300 and target is not None and upload_id:
            journal.record(Upload(target[0], target[1], str(upload_id)))

    def ended(http_response: Any, parsed: Mapping[str, Any], context: Any, **_: Any) -> None:
        target = context.get(_CONTEXT_KEY)
        code = parsed.get("Error", {}).get("Code")
        if target is None or not target[2]:
            return
        if http_response.status_code < 300 or code == "NoSuchUpload":
            journal.forget(Upload(*target))

    events.register("after-call.s3.CreateMultipartUpload", started)
    events.register("after-call.s3.CompleteMultipartUpload", ended)
    events.register("after-call.s3.AbortMultipartUpload", ended)


def _remember_params(params: Mapping[str, Any], context: Any, **_: Any) -> None:
    context[_CONTEXT_KEY] = (
        str(params.get("Bucket", "")),
        str(params.get("Key", "")),
        str(params.get("UploadId", "")),
    )


# -- leftovers -------------------------------------------------------------------------------


def upload_is_dead(writer: Writer | None, initiated: float, at: float) -> bool:
    """Whether an upload begun at ``initiated`` by ``writer`` (None: in no journal here) may
    be aborted at time ``at`` (module docstring)."""
    if writer is not None:
        state = tempnames.liveness(writer)
        if state is not Liveness.UNKNOWN:
            return state is Liveness.DEAD
    return at - initiated > tempnames.STALE_AFTER


def leftover_of(
    upload: Upload, initiated: float, path: str, owners: Mapping[Upload, Writer]
) -> Leftover:
    """What ``validate`` reports and ``sweep`` removes for one upload on the server. Its size
    is 0: the listing carries no part sizes (a ListParts request per upload would)."""
    writer = owners.get(upload)
    return Leftover(
        path=path,
        what="multipart upload",
        size=0,
        mtime=initiated,
        writer=str(writer) if writer is not None else "a writer with no journal on this host",
        dead=upload_is_dead(writer, initiated, now()),
    )


def owners_of(journals: Mapping[Writer, set[Upload]]) -> dict[Upload, Writer]:
    return {up: writer for writer, uploads in journals.items() for up in uploads}


# -- uploading an in-memory value ------------------------------------------------------------


def part_size_of(length: int, part_size: int) -> int:
    """The size of the parts of a value of ``length`` bytes (at most :data:`MAX_PARTS`)."""
    return max(part_size, -(-length // MAX_PARTS))


def part_digests(data: memoryview, part_size: int) -> list[Digest]:
    """The digest of each part ``data`` is uploaded in (what the answers are checked with)."""
    size = part_size_of(len(data), part_size)
    return [Digest(data[start : start + size]) for start in range(0, len(data), size)]


def upload_in_parts(
    call: Callable[..., Any],
    pool: ThreadPoolExecutor,
    full: str,
    data: memoryview,
    part_size: int,
    digests: Sequence[Digest],
    checksum: Mapping[str, str],
    *,
    metadata: Mapping[str, str] | None = None,
    **complete_args: str,
) -> dict[str, Any]:
    """Upload ``data`` as the object ``full`` in parts on ``pool``; complete only when all are
    in, else abort (and re-raise). ``call(method, **kwargs)`` adds bucket and payer;
    ``digests`` are :func:`part_digests` of ``data``: each part carries its ``Content-MD5``
    and an answer whose ETag is not that MD5 is sent again (then StoreUnavailable);
    ``complete_args`` go to CompleteMultipartUpload (a condition: ``IfMatch``/``IfNoneMatch``,
    which S3 checks there, so a refused one is aborted like any failure); ``metadata`` goes to
    CreateMultipartUpload (the object's user metadata). Returns the answer of
    CompleteMultipartUpload (its ``ETag``, which the caller checks).

    Parts go in windows of :data:`PARTS_IN_FLIGHT`: botocore needs ``bytes`` bodies, so each
    part in flight is a copy, and the windows bound that extra memory.
    """
    size = part_size_of(len(data), part_size)
    meta = {"Metadata": dict(metadata)} if metadata else {}
    upload = call("create_multipart_upload", Key=full, **checksum, **meta)["UploadId"]

    def put_part(number: int) -> dict[str, Any]:
        digest = digests[number - 1]
        for attempt in range(1, PART_ATTEMPTS + 1):
            answer = call(
                "upload_part",
                Key=full,
                UploadId=upload,
                PartNumber=number,
                Body=bytes(data[(number - 1) * size : number * size]),
                ContentMD5=digest.content_md5,
                **checksum,
                **({"ChecksumCRC32": digest.crc32} if checksum else {}),
            )
            if stored_exactly(answer, expected_etag([digest]), digest.crc32) is not False:
                break
            log.warning(
                "s3: part %d of %r stored other bytes than sent (attempt %d)", number, full, attempt
            )
        else:
            raise StoreUnavailable(
                f"s3: part {number} of {full!r} stored other bytes than sent {PART_ATTEMPTS} times"
            )
        part = {"ETag": answer["ETag"], "PartNumber": number}
        if "ChecksumCRC32" in answer and checksum:
            part["ChecksumCRC32"] = answer["ChecksumCRC32"]
        return part

    numbers = range(1, len(digests) + 1)
    parts: list[dict[str, Any]] = []
    try:
        for start in range(0, len(numbers), PARTS_IN_FLIGHT):
            parts.extend(pool.map(put_part, numbers[start : start + PARTS_IN_FLIGHT]))
        answer: dict[str, Any] = call(
            "complete_multipart_upload",
            Key=full,
            UploadId=upload,
            MultipartUpload={"Parts": parts},
            **complete_args,
        )
    except BaseException:
        abort(call, full, upload)
        raise
    return answer


def abort(call: Callable[..., Any], full: str, upload: str) -> None:
    """Abort an upload, logging (not raising) a failure: the journal keeps it for a sweep."""
    try:
        call("abort_multipart_upload", Key=full, UploadId=upload)
    except Exception:
        log.warning("s3: could not abort upload %s of %r", upload, full, exc_info=True)
