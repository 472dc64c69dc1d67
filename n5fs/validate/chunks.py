"""Chunks checked while the store is still being listed: batches on bounded pools.

Why batches: the cost of handing work over (a future, a lock, a thread wake-up, or a message
through a pipe) is paid per batch, not per chunk: for small chunks that overhead was most of
the time (scripts/bench_validate.py).

Why while listing: the listing and the classification of keys run on the caller's thread;
reads and checks on the workers, so on a machine with two cores both are busy, and on S3 the
next listing page is in flight while chunks are fetched.

Two kinds of worker:

- threads (:meth:`ChunkChecker._check_batch`), for every store: a batch reads its local files
  (where the store keeps them, :meth:`~n5fs.kvstore.abilities.LocalFiles.local_folder`: each
  folder opened once, each chunk ``openat`` relative to it and read with one ``read``, see
  :mod:`.check`) and asks the other keys of one ``store.get_many``; decoders that release the
  GIL (zlib, zstd, blosc, lzma) run in parallel. Batches start small and grow with the number
  of chunks seen, so a small array still spreads over every worker.
- worker processes (:mod:`.procs`), for a store with local files once a run has met
  ``processes_after`` chunks (:data:`PROCESSES_AFTER` by default; a smaller run ends before
  processes would be ready): with threads, small local chunks are bound by the GIL (each
  return from a system call waits for it), so two cores did less than one. Until every
  process is ready (about a second) chunks go on to the threads. A batch names the chunks of
  each folder and the folder's path as the store resolved it; a chunk a process could not open
  or read comes back and is checked on a thread, through ``get``, which decides as everywhere
  else (a link, a file gone). An array that cannot be pickled is checked on threads only.

Memory stays bounded: at most ``2 * jobs`` thread batches are submitted and not finished,
each holding at most :data:`BATCH_BYTES` of bytes fetched through ``get_many`` (or one
larger chunk; a chunk listed without its size counts as its decoded size) and one local chunk
at a time; each process holds one chunk at a time and at most
:data:`~n5fs.validate.procs.DEPTH` batches of names. The caller blocks in
:meth:`ChunkChecker.add` until a slot is free.

What a worker cannot read is reported, never lost: a key whose bytes the store cannot give
(any :class:`N5fsError` other than a refusal, or an ``OSError`` a local store let through, or
a key gone since it was listed) becomes an ``unreadable`` finding of :class:`Report`, so the
run is not called valid; only a refusal of the bytes themselves is ``invalid``. A worker
process that dies ends the run (:class:`~n5fs.validate.procs.WorkerDied`).

Lock discipline: batches are built and submitted, and process outcomes taken in, by the
caller's thread only (``_batch``, ``_local``, ``_pending``, ``_workers`` are not shared);
thread workers touch shared state only through :meth:`Report.add_chunks`, under the report's
lock.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING

from n5fs.errors import N5fsError
from n5fs.kvstore.abilities import local_files
from n5fs.validate.check import (
    DIR_FLAGS,
    STORE_FAULTS,
    VANISHED,
    Unread,
    first_read,
    judge,
    read_file,
)
from n5fs.validate.procs import Group, Outcome, Workers

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

    from n5fs.formats.base import ArrayNode
    from n5fs.kvstore.base import KvStore
    from n5fs.validate.report import Finding, Progress, Report

__all__ = [
    "BATCH_BYTES",
    "BATCH_CHUNKS",
    "PROCESSES_AFTER",
    "STORE_FAULTS",
    "UNKNOWN_SIZE",
    "VANISHED",
    "ChunkChecker",
    "ChunkJob",
]

log = logging.getLogger(__name__)

#: a thread batch stops growing at this many stored bytes (or at one chunk, if that is larger):
#: the per-batch overhead only matters for small chunks
BATCH_BYTES = 4 << 20
#: ... or at this many chunks
BATCH_CHUNKS = 256
#: thread batches hold at most (chunks seen so far) / (this * workers) chunks: early batches
#: are small, so a few chunks still spread over all workers
SPREAD = 4
#: a run on a store with local files starts worker processes once it has met this many chunks
PROCESSES_AFTER = 20_000
#: a batch for a worker process stops at this many chunks ...
PROCESS_BATCH = 1024
#: ... or at this many decoded bytes (what checking a batch costs, for chunks of any size)
PROCESS_BATCH_DECODED = 32 << 20
#: the size of a chunk listed without one (a local scan: the reader learns it)
UNKNOWN_SIZE = -1


@dataclass(frozen=True, slots=True)
class ChunkJob:
    """One listed chunk: the array that judges it, its key, grid position and stored size
    (:data:`UNKNOWN_SIZE` when it was listed without one)."""

    array: ArrayNode
    key: str
    position: tuple[int, ...]
    size: int


@dataclass
class _Tally:
    """What a thread batch found: the chunks it judged (read or not), bytes read, findings."""

    count: int = 0
    nbytes: int = 0
    invalid: list[Finding] = field(default_factory=list)
    unreadable: list[Finding] = field(default_factory=list)

    def judge(self, job: ChunkJob, data: bytes | Unread) -> None:
        self.count += 1
        if isinstance(data, bytes):
            self.nbytes += len(data)
        verdict = judge(job.array, job.key, job.position, data)
        if verdict is not None:
            (self.unreadable if verdict.unreadable else self.invalid).append(verdict.finding)


@dataclass(frozen=True, slots=True)
class _Known:
    """An array met in this run: the token processes know it by, the size of its decoded
    chunks, and its pickled form (None: it does not pickle, so threads check its chunks)."""

    token: int
    decoded: int
    pickled: bytes | None


class ChunkChecker:
    """Checks the chunks it is given on ``jobs`` workers; use as a context manager.

    ``processes_after``: the number of chunks after which a store with local files goes on
    in worker processes (None: never). :meth:`add`, :meth:`flush` and :meth:`finish` are
    called from one thread (the listing's)."""

    def __init__(
        self,
        store: KvStore,
        report: Report,
        progress: Progress,
        jobs: int,
        *,
        processes_after: int | None = PROCESSES_AFTER,
    ) -> None:
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
        #: when to start processes; None once they are not to be (started) any more
        self._processes_after = processes_after if self.local is not None else None
        #: the worker processes, once started; ``_working`` once every one is ready
        self._workers: Workers[ChunkJob] | None = None
        self._working = False
        #: chunks the processes have judged (read, or unreadable when judged)
        self.in_processes = 0
        #: the batch being built for the processes, and its decoded bytes
        self._local: list[ChunkJob] = []
        self._local_decoded = 0
        #: what is known of each array met, by ``id`` (``_arrays`` keeps them alive, so an
        #: ``id`` is never reused for another array during the run)
        self._known: dict[int, _Known] = {}
        self._arrays: list[ArrayNode] = []
        #: pickled arrays by token, for the processes
        self._pickled: dict[int, bytes] = {}

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
        if self._workers is not None:
            self._workers.close(wait=kind is None)
        self._pool.shutdown(wait=True)

    def add(self, job: ChunkJob) -> None:
        """Queue one chunk; submits a batch when it is full (blocking while the window is)."""
        self._seen += 1
        self.progress.total_chunks = self._seen
        if self._working or (self._processes_after is not None and self._processes_ready()):
            known = self._know(job.array)
            if known.pickled is not None:
                self._local.append(job)
                self._local_decoded += known.decoded
                if len(self._local) >= PROCESS_BATCH or (
                    self._local_decoded >= PROCESS_BATCH_DECODED
                ):
                    self._send_local()
                return
        self._queue(job)

    def flush(self) -> None:
        """Submit the chunks queued so far (the listing is over, or paused for long)."""
        if self._local:
            self._send_local()
        if self._batch:
            self._submit()

    def finish(self) -> None:
        """Submit what is queued and wait for every batch; a worker's error is raised here."""
        if self._local:
            self._send_local()
        if self._workers is not None:
            for jobs, outcome in self._workers.drain():
                self._settle(jobs, outcome)
        self.flush()
        while self._pending:
            done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()

    def _know(self, array: ArrayNode) -> _Known:
        known = self._known.get(id(array))
        if known is None:
            token = len(self._arrays)
            try:
                pickled: bytes | None = pickle.dumps(array, pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 (any reducer's error: threads check it)
                log.debug("validate: %r does not pickle (%s); checked on threads", array, exc)
                pickled = None
            decoded = math.prod(array.chunks) * array.dtype.itemsize
            known = self._known[id(array)] = _Known(token, decoded, pickled)
            self._arrays.append(array)
            if pickled is not None:
                self._pickled[token] = pickled
        return known

    # -- worker threads ------------------------------------------------------------------------

    def _queue(self, job: ChunkJob) -> None:
        """Add ``job`` to the thread batch; submit it when full."""
        most = max(1, min(BATCH_CHUNKS, self._seen // (SPREAD * self.jobs)))
        size = job.size if job.size >= 0 else self._know(job.array).decoded
        if self._batch and (len(self._batch) >= most or self._batch_bytes + size > BATCH_BYTES):
            self._submit()
        self._batch.append(job)
        self._batch_bytes += size

    def _submit(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        while len(self._pending) >= 2 * self.jobs:
            done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
        self._pending.add(self._pool.submit(self._check_batch, batch))

    def _check_batch(self, batch: list[ChunkJob]) -> None:
        """On a thread: local files read and judged one at a time, folder by folder; the
        other keys fetched with one ``get_many``, and if that fails (one key's fault fails
        them all), each key alone, so only the faulty key is unreadable."""
        tally = _Tally()
        remote: list[ChunkJob] = []
        for folder, jobs in groupby(batch, _folder_of):
            self._check_local(folder, list(jobs), tally, remote)
        if remote:
            keys = [job.key for job in remote]
            fetched: dict[str, bytes | Unread]
            try:
                got = self.store.get_many(keys)
                fetched = {key: _present(got.get(key)) for key in keys}
            except STORE_FAULTS:
                fetched = {key: self._get_alone(key) for key in keys}
            for job in remote:
                tally.judge(job, fetched.pop(job.key))
        self.report.add_chunks(
            tally.count, tally.nbytes, tally.invalid, tally.unreadable, self.progress
        )

    def _check_local(
        self, folder: str, jobs: list[ChunkJob], tally: _Tally, remote: list[ChunkJob]
    ) -> None:
        """The chunks of ``folder`` that have a local file, read and judged; the others (no
        local folder, a link, a file that cannot be read) go to ``remote``: ``get`` decides."""
        path = None if self.local is None else self.local.local_folder(folder)
        try:
            directory = -1 if path is None else os.open(path, DIR_FLAGS)
        except OSError:
            directory = -1
        if directory < 0:
            remote.extend(jobs)
            return
        try:
            start = len(folder)
            for job in jobs:
                data = read_file(directory, job.key[start:], first_read(job.size))
                if data is None:
                    remote.append(job)
                else:
                    tally.judge(job, data)
        finally:
            os.close(directory)

    def _get_alone(self, key: str) -> bytes | Unread:
        try:
            return _present(self.store.get(key))
        except STORE_FAULTS as exc:
            return exc

    # -- worker processes ----------------------------------------------------------------------

    def _processes_ready(self) -> bool:
        """Are the processes ready to take chunks? Starts them once the run has met
        ``processes_after`` chunks; gives up on them (threads go on) if they cannot start."""
        assert self._processes_after is not None
        try:
            if self._workers is None:
                if self._seen <= self._processes_after:
                    return False
                self._workers = Workers(self.jobs)
            self._working = self._workers.ready()
        except OSError as exc:  # no processes here (a sandbox, no interpreter): threads go on
            log.debug("validate: worker processes not started (%s); threads go on", exc)
            if self._workers is not None:
                self._workers.close(wait=False)
            self._workers = self._processes_after = None
            return False
        if self._working and self._batch:
            self._submit()  # what the threads were to take until now
        return self._working

    def _send_local(self) -> None:
        """The process batch to the least busy process, folder by folder; chunks of a folder
        with no local path (a link on the way) to the threads."""
        assert self._workers is not None
        batch, self._local, self._local_decoded = self._local, [], 0
        groups: list[Group] = []
        sent: list[ChunkJob] = []
        for folder, run in groupby(batch, _folder_of):
            jobs = list(run)
            path = None if self.local is None else self.local.local_folder(folder)
            if path is None:
                for job in jobs:
                    self._queue(job)
                continue
            start = len(folder)
            for ident, same in groupby(jobs, _array_of):  # (one folder is one array's)
                chunks = list(same)
                names = [job.key[start:] for job in chunks]
                positions = [job.position for job in chunks]
                token = self._known[ident].token
                groups.append(Group(folder, path, token, names, positions))
                sent += chunks
        if groups:
            for jobs, outcome in self._workers.submit(sent, groups, self._pickled):
                self._settle(jobs, outcome)

    def _settle(self, jobs: list[ChunkJob], outcome: Outcome) -> None:
        """A process batch done: counted; the chunks it could not read, to the threads."""
        self.in_processes += outcome.judged
        self.report.add_chunks(
            outcome.judged, outcome.nbytes, outcome.invalid, outcome.unreadable, self.progress
        )
        for index in outcome.retry:
            self._queue(jobs[index])


def _folder_of(job: ChunkJob) -> str:
    return job.key[: job.key.rfind("/") + 1]


def _array_of(job: ChunkJob) -> int:
    return id(job.array)


def _present(data: bytes | None) -> bytes | Unread:
    return N5fsError(VANISHED) if data is None else data
