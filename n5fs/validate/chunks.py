"""Chunks checked while the store is still being listed: batches on a bounded pool.

Why batches: a batch is one read pass (local files, or one ``store.get_many`` that a network
store runs on its own pool) followed by the checks, so the cost of a future, a lock and a
thread wake-up is paid per batch, not per chunk: for 16x16 chunks on a local disk that
overhead was most of the time (scripts/bench_validate.py --store).

Why while listing: the listing and the classification of keys run on the caller's thread;
reads and decoders (zlib, zstd, blosc, lzma release the GIL) run on the workers, so on a
machine with two cores both are busy, and on S3 the next listing page is in flight while
chunks are fetched. Batches start small and grow with the number of chunks seen, so a small
array still spreads over every worker and a large one pays little per chunk.

Why local reads: where the store keeps a folder on a local disk
(:meth:`~n5fs.kvstore.abilities.LocalFiles.local_folder`), a batch opens each of its folders
once and reads every chunk relative to it, ``openat`` with ``O_NOFOLLOW`` and one ``read`` of
the size the listing gave, instead of ``get``'s full path
resolution and buffered file object, or a path resolved per chunk (two ``lstat`` calls and a
walk of the path by the kernel: of the order of checking a small zstd chunk itself). A chunk that
cannot be opened so (a link, gone) is asked of ``get``, which decides, as before, whether the
key is there and where a link may lead.

Memory stays bounded: at most ``2 * jobs`` batches are submitted and not finished, each
holding at most :data:`BATCH_BYTES` of chunk bytes (or one larger chunk) while it runs; the
caller blocks in :meth:`ChunkChecker.add` until a slot is free.

What a worker cannot read is reported, never lost: a key whose bytes the store cannot give
(any :class:`N5fsError` other than a refusal, or an ``OSError`` a local store let through, or
a key gone since it was listed) becomes an ``unreadable`` finding of :class:`Report`, so the
run is not called valid; only a refusal of the bytes themselves is ``invalid``.

Lock discipline: batches are built and submitted by the caller's thread only (``_batch``,
``_pending`` are not shared); workers touch shared state only through :meth:`Report.add` and
``_count``, both under the report's lock.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, TypeAlias

from n5fs.errors import N5fsError, Rejected
from n5fs.kvstore.abilities import local_files
from n5fs.validate.report import Finding, finding

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

    from n5fs.formats.base import ArrayNode
    from n5fs.kvstore.base import KvStore
    from n5fs.validate.report import Progress, Report

#: a batch stops growing at this many stored bytes (or at one chunk, if that is larger): the
#: per-batch overhead only matters for small chunks, and each worker holds one batch's bytes
BATCH_BYTES = 4 << 20
#: ... or at this many chunks
BATCH_CHUNKS = 256
#: batches hold at most (chunks seen so far) / (this * workers) chunks: early batches are
#: small, so a few chunks still spread over all workers
SPREAD = 4
#: bytes asked of each further ``read`` of a file that grew since it was listed
_READ_MORE = 1 << 16
#: a chunk file: never through a link (``get`` checks where it leads), never blocking (a FIFO
#: planted at a chunk's name reads as empty: judged, not waited on)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: a folder whose chunks are opened relative to it
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: errors that make a key unreadable rather than end the run: every n5fs error (a refusal
#: is told apart where it can occur) and the ``OSError`` a local store's read lets through
#: (EIO, EACCES); anything else is a bug and ends the run
STORE_FAULTS = (N5fsError, OSError)
#: the reason of a key that was listed but is gone when read (deleted since, e.g. by a
#: writer still at work): its bytes were never seen, so it is unreadable, not valid
VANISHED = "vanished while validating (listed, then gone when read)"

#: why a key has no bytes to judge
Unread: TypeAlias = N5fsError | OSError


@dataclass(frozen=True, slots=True)
class ChunkJob:
    """One listed chunk: the array that judges it, its key, grid position and stored size."""

    array: ArrayNode
    key: str
    position: tuple[int, ...]
    size: int


@dataclass(frozen=True, slots=True)
class ChunkVerdict:
    finding: Finding
    #: the chunk could not be read or decoded (a store fault): not checked, as opposed to
    #: read and judged invalid
    unreadable: bool


class ChunkChecker:
    """Checks the chunks it is given on ``jobs`` worker threads; use as a context manager.

    :meth:`add` and :meth:`finish` are called from one thread (the listing's)."""

    def __init__(self, store: KvStore, report: Report, progress: Progress, jobs: int) -> None:
        self.store = store
        #: the store's local files, if it has them (:mod:`n5fs.kvstore.abilities`)
        self.local = local_files(store)
        self.report = report
        self.progress = progress
        self.jobs = max(1, jobs)
        self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="n5fs-validate")
        self._pending: set[Future[None]] = set()
        self._batch: list[ChunkJob] = []
        self._batch_bytes = 0
        self._seen = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None:
            for future in self._pending:
                future.cancel()
        self._pool.shutdown(wait=True)

    def add(self, job: ChunkJob) -> None:
        """Queue one chunk; submits a batch when it is full (blocking while the window is)."""
        self._seen += 1
        self.progress.total_chunks = self._seen
        most = max(1, min(BATCH_CHUNKS, self._seen // (SPREAD * self.jobs)))
        if self._batch and (len(self._batch) >= most or self._batch_bytes + job.size > BATCH_BYTES):
            self._submit()
        self._batch.append(job)
        self._batch_bytes += job.size

    def flush(self) -> None:
        """Submit the chunks queued so far (the listing is over, or paused for long)."""
        if self._batch:
            self._submit()

    def finish(self) -> None:
        """Submit what is queued and wait for every batch; a worker's error is raised here."""
        self.flush()
        while self._pending:
            done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()

    def _submit(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        while len(self._pending) >= 2 * self.jobs:
            done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
        self._pending.add(self._pool.submit(self._check_batch, batch))

    # -- on the workers ------------------------------------------------------------------------

    def _check_batch(self, batch: list[ChunkJob]) -> None:
        fetched = self._fetch_batch(batch)
        invalid: list[Finding] = []
        unreadable: list[Finding] = []
        for job in batch:
            verdict = judge(job, fetched.pop(job.key))
            if verdict is not None:
                (unreadable if verdict.unreadable else invalid).append(verdict.finding)
        nbytes = sum(job.size for job in batch)
        self.report.add_chunks(len(batch), nbytes, invalid, unreadable, self.progress)

    def _fetch_batch(self, batch: list[ChunkJob]) -> dict[str, bytes | Unread]:
        """Local files read directly, folder by folder; the other keys with one ``get_many``,
        and if that fails (one key's fault fails them all), each key alone, so only the
        faulty key is unreadable. Every key of ``batch`` gets its bytes or its error."""
        fetched: dict[str, bytes | Unread] = {}
        remote: list[str] = []
        for folder, jobs in groupby(batch, _folder_of):
            self._read_local(folder, list(jobs), fetched, remote)
        if not remote:
            return fetched
        try:
            got = self.store.get_many(remote)
            fetched.update((key, _present(got.get(key))) for key in remote)
        except STORE_FAULTS:
            fetched.update((key, self._get_alone(key)) for key in remote)
        return fetched

    def _read_local(
        self,
        folder: str,
        jobs: list[ChunkJob],
        fetched: dict[str, bytes | Unread],
        remote: list[str],
    ) -> None:
        """The chunks of ``folder`` that have a local file go to ``fetched``, the others (no
        local folder, a link, a file that cannot be read) to ``remote``: ``get`` decides."""
        path = None if self.local is None else self.local.local_folder(folder)
        try:
            directory = -1 if path is None else os.open(path, _DIR_FLAGS)
        except OSError:
            directory = -1
        if directory < 0:
            remote.extend(job.key for job in jobs)
            return
        try:
            start = len(folder)
            for job in jobs:
                data = _read_file(directory, job.key[start:], job.size)
                if data is None:
                    remote.append(job.key)
                else:
                    fetched[job.key] = data
        finally:
            os.close(directory)

    def _get_alone(self, key: str) -> bytes | Unread:
        try:
            return _present(self.store.get(key))
        except STORE_FAULTS as exc:
            return exc


def _folder_of(job: ChunkJob) -> str:
    return job.key[: job.key.rfind("/") + 1]


def _read_file(directory: int, name: str, size: int) -> bytes | None:
    """File ``name`` of the open folder ``directory``, read with one ``read`` of its listed
    ``size`` (plus one byte, to see that it did not grow since). None for a link (``get``
    decides where it leads), a missing file, or one that cannot be read."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=directory)
    except OSError:
        return None
    try:
        data = os.read(fd, size + 1)
        if len(data) <= size:
            return data  # a short read of a regular file is its end
        parts = [data, more := os.read(fd, _READ_MORE)]  # it grew since it was listed
        while more:
            more = os.read(fd, _READ_MORE)
            parts.append(more)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def _present(data: bytes | None) -> bytes | Unread:
    return N5fsError(VANISHED) if data is None else data


def judge(job: ChunkJob, data: bytes | Unread) -> ChunkVerdict | None:
    """None for a valid chunk; an unreadable verdict for a read that failed (``data`` is
    its error) or a check that failed for another reason than the bytes (any error but
    :class:`Rejected`); an invalid one only when the bytes were read and refused."""
    if not isinstance(data, bytes):
        return ChunkVerdict(finding(job.key, data), unreadable=True)
    try:
        job.array.validate_chunk(job.position, data, path=job.key)
    except Rejected as exc:
        return ChunkVerdict(finding(job.key, exc), unreadable=False)
    except N5fsError as exc:  # not an OSError: decoding reads no store, so that is a bug
        return ChunkVerdict(finding(job.key, exc), unreadable=True)
    return None
