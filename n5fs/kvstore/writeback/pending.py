"""What a write-back store has accepted and not uploaded: the table every read, write and
upload of it asks, and the waits on it (room, ``fsync``, barriers).

State (all of it under one condition, ``_cond``, a leaf: nothing else is locked while it is
held, no I/O is done under it, and waits on it release it):

- ``_newest``: the newest accepted job per key. A read of a key in it is answered from the
  journal (read-your-writes); a later write of the key replaces the job, whose upload is then
  skipped (never sent after its successor: see ``_uploading``);
- ``_ready``: a heap of (not before, wanted, ticket, job) in the order jobs may start (a
  job a waiter waits for goes before the others; otherwise first come, first served); a job whose
  key is being uploaded waits in ``_parked`` until that upload ends, so two values of one key
  are never in flight at once and the later one always lands last;
- ``_uploading``: key -> the job being uploaded;
- ``_charged``: bytes of the journal in use (each job at least :data:`MIN_CHARGE`), against
  ``limit``: a writer waits for room, at most ``room_wait`` seconds (then its caller writes
  synchronously: never a hang, never an unbounded journal).

A job ends *settled* (uploaded, replaced by a later write of its key, or dropped by a delete
of its key) or stays with its last error and a time to try again (backing off to
:data:`MAX_BACKOFF`). A waiter (:meth:`Pending.settle`) asks for the jobs it waits for to be
tried at once and returns when each is settled, or raises once one of them has failed an
attempt made after the wait began: an ``fsync`` answers in bounded time, with the error.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.locking import LEAF, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from n5fs.kvstore.writeback.journal import Entry

__all__ = ["Job", "Pending", "UploadFailed"]

#: the least a job is charged against the journal's limit (a file system block and change)
MIN_CHARGE = 4096
#: the longest a failing job waits before it is tried again
MAX_BACKOFF = 60.0
#: how long a write waits before its upload starts: a writer's temp file renamed over its
#: chunk a moment later (zarr-python, TensorStore, rsync) then moves inside the journal and
#: is never uploaded under its temp name (a PUT, then a copy and a DELETE on S3)
UPLOAD_DELAY = 0.5
#: bytes of values read into memory for uploads at once (one larger goes alone)
IN_FLIGHT_BYTES = 256 << 20


class UploadFailed(Exception):
    """An attempt a waiter waited for failed (the job stays journaled and is retried)."""

    def __init__(self, job: Job, error: BaseException) -> None:
        super().__init__(f"/{job.entry.key}: {error}")
        self.job = job
        self.error = error


@dataclass(eq=False)
class Job:
    """One accepted write and what became of it (identity matters: ``eq=False``)."""

    entry: Entry
    attempts: int = 0
    #: the last attempt's failure, None before one failed
    error: BaseException | None = None
    #: uploaded, replaced or dropped: nothing more will be done with it
    settled: bool = False
    #: ``_ended`` when its last attempt ended
    ended: int = 0
    not_before: float = 0.0
    #: in the heap right now (a job is pushed at most once)
    queued: bool = field(default=False, repr=False)
    #: a waiter waits for it: it goes before the others
    wanted: bool = False

    @property
    def charge(self) -> int:
        return max(self.entry.size, MIN_CHARGE)


class Pending:
    """The table of accepted, not yet uploaded writes (module docstring)."""

    def __init__(self, limit: int, *, room_wait: float = 30.0, delay: float = 0.0) -> None:
        self.limit = limit
        self.room_wait = room_wait
        #: how long an accepted write waits before its upload may start (unless waited for)
        self.delay = delay
        lock = ranked_lock("write-back jobs", LEAF)
        #: waiters for changes (room, settled jobs, uploads ending)
        self._cond = threading.Condition(lock)
        #: uploaders waiting for a job: woken one per job, not all per change
        self._work = threading.Condition(lock)
        self._newest: dict[str, Job] = {}
        #: (not before, 0 for a job a waiter wants, else 1, ticket, job)
        self._ready: list[tuple[float, int, int, Job]] = []
        self._parked: dict[str, Job] = {}
        self._uploading: dict[str, Job] = {}
        self._charged = 0
        self._in_flight_bytes = 0
        self._closed = False
        #: attempts ended so far (a clock for "an attempt made after the wait began")
        self._ended = 0
        self.uploaded = 0
        self.failures = 0
        self.replayed = 0
        self._jobs = 0
        self._ticket = itertools.count()

    # -- accepting --------------------------------------------------------------------------

    def wait_for_room(self, size: int) -> bool:
        """Wait until a value of ``size`` bytes fits in the journal (True), or for
        ``room_wait`` seconds (False: the caller writes it synchronously)."""
        charge = max(size, MIN_CHARGE)
        deadline = time.monotonic() + self.room_wait
        with self._cond:
            while self._charged and self._charged + charge > self.limit:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)
            return True

    def add(self, entry: Entry, *, replayed: bool = False) -> Job | None:
        """Take a journaled ``entry`` as the newest value of its key; returns the job it
        replaces when that one's journal entry can go now (not in flight)."""
        job = Job(entry, not_before=0.0 if replayed else time.monotonic() + self.delay)
        with self._cond:
            old = self._newest.get(entry.key)
            self._newest[entry.key] = job
            self._charged += job.charge
            self._jobs += 1
            if replayed:
                self.replayed += 1
            gone = None
            if old is not None:
                self._settle(old)
                if self._uploading.get(entry.key) is not old:
                    gone = old
            if entry.key in self._uploading:
                self._parked[entry.key] = job
            else:
                self._push(job)
            if old is not None:
                self._cond.notify_all()  # its charge is free
        return gone

    def drop(self, key: str, timeout: float) -> Job | None:
        """A delete of ``key`` is next: settle its pending job (waiting out an upload of it in
        flight, at most ``timeout`` seconds) and return it, its journal entry to remove."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while key in self._uploading:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"/{key}: its upload is still in flight")
                self._cond.wait(left)
            job = self._newest.pop(key, None)
            self._parked.pop(key, None)
            if job is not None:
                self._settle(job)
                self._cond.notify_all()
            return job

    # -- reading ------------------------------------------------------------------------------

    def newest(self, key: str) -> Entry | None:
        with self._cond:
            job = self._newest.get(key)
        return None if job is None else job.entry

    def entries_under(self, prefix: str) -> list[Entry]:
        """The newest pending entry of every key starting with ``prefix``."""
        with self._cond:
            if not self._newest:
                return []
            jobs = [j for k, j in self._newest.items() if k.startswith(prefix)]
        return [j.entry for j in jobs]

    # -- uploading ----------------------------------------------------------------------------

    def take(self, idle: float) -> Job | None:
        """The next job to upload (marked in flight), waiting at most ``idle`` seconds for
        one; None on timeout or once closed."""
        deadline = time.monotonic() + idle
        with self._cond:
            while True:
                if self._closed:
                    return None
                now = time.monotonic()
                job = self._next_ready(now)
                if job is not None:
                    self._uploading[job.entry.key] = job
                    self._in_flight_bytes += job.entry.size
                    return job
                wake = deadline
                if self._ready:
                    wake = min(wake, self._ready[0][0])
                if now >= deadline:
                    return None
                self._work.wait(max(0.0, wake - now))

    def _next_ready(self, now: float) -> Job | None:
        while self._ready and self._ready[0][0] <= now:
            job = self._ready[0][3]
            if job.settled:
                heapq.heappop(self._ready)
                job.queued = False
                continue
            if self._in_flight_bytes and self._in_flight_bytes + job.entry.size > IN_FLIGHT_BYTES:
                return None  # memory: wait for an upload to end
            heapq.heappop(self._ready)
            job.queued = False
            return job
        return None

    def finished(self, job: Job, error: BaseException | None) -> bool:
        """An upload attempt of ``job`` ended; returns whether its journal entry can go (it
        landed, or a later write replaced it and this attempt was its last): the caller
        removes it, then calls :meth:`released`."""
        with self._cond:
            key = job.entry.key
            del self._uploading[key]
            self._in_flight_bytes -= job.entry.size
            self._ended += 1
            job.ended = self._ended
            job.attempts += 1
            removable = False
            if error is None:
                job.error = None
                self.uploaded += 1
                if self._newest.get(key) is job:
                    del self._newest[key]  # the store holds it now: reads go there
                removable = True  # settled by :meth:`released`, once its entry is gone
            else:
                self.failures += 1
                job.error = error
                if job.settled:  # replaced meanwhile: the successor carries the key on
                    removable = True
                else:
                    job.not_before = time.monotonic() + min(MAX_BACKOFF, 0.5 * 2**job.attempts)
                    self._push(job)
            successor = self._parked.pop(key, None)
            if successor is not None and not successor.settled:
                self._push(successor)
            self._cond.notify_all()
            self._work.notify()  # room in flight again
            return removable

    def released(self, job: Job) -> None:
        """``job``'s journal entry is removed (after :meth:`finished` said it could go): a
        waiter for it may return now."""
        with self._cond:
            if not job.settled:
                self._settle(job)
            self._cond.notify_all()

    # -- waiting -------------------------------------------------------------------------------

    def settle(self, select: Callable[[str], bool], timeout: float | None = None) -> int:
        """Have every pending job whose key ``select`` picks tried now, and wait until each
        is settled; raises :class:`UploadFailed` once one fails an attempt begun after this
        call, TimeoutError after ``timeout`` seconds. Returns how many were waited for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            began = self._ended
            # the newest job of each key is all there is to wait for: one it replaced is
            # settled, and a successor never starts before the upload in flight ended
            jobs = [j for k, j in self._newest.items() if select(k)]
            self._requeue_now(jobs)
            for job in jobs:
                while not job.settled:
                    if job.error is not None and job.ended > began:
                        raise UploadFailed(job, job.error)
                    if self._closed:
                        raise UploadFailed(job, RuntimeError("the write-back store is closed"))
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"/{job.entry.key}: not uploaded in time")
                    self._cond.wait(left)
            return len(jobs)

    def _requeue_now(self, jobs: Iterable[Job]) -> None:
        """Jobs a waiter waits for go first, failing ones without waiting out their back-off
        (caller holds _cond)."""
        changed = False
        for job in jobs:
            if job.queued and (job.not_before > 0 or not job.wanted):
                job.not_before = 0.0
                job.wanted = True
                changed = True
        if changed:
            self._ready = [(j.not_before, 0 if j.wanted else 1, t, j) for _, _, t, j in self._ready]
            heapq.heapify(self._ready)
            self._work.notify_all()

    # -- reporting -----------------------------------------------------------------------------

    def report(self) -> dict[str, int]:
        """``stats.json``'s figures: pending files and bytes, the oldest one's age in seconds,
        how many are failing, and what was uploaded, failed and replayed so far."""
        now = time.time()
        with self._cond:
            jobs = list(self._newest.values())
            return {
                "writeback_pending_files": len(jobs),
                "writeback_pending_bytes": sum(j.entry.size for j in jobs),
                "writeback_oldest_seconds": int(
                    max((now - j.entry.accepted for j in jobs), default=0.0)
                ),
                "writeback_failing": sum(1 for j in jobs if j.error is not None),
                "writeback_uploaded": self.uploaded,
                "writeback_upload_failures": self.failures,
                "writeback_replayed": self.replayed,
            }

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def close(self) -> None:
        """Wake every waiter and uploader: nothing more is taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._work.notify_all()

    # -- inside the lock ------------------------------------------------------------------------

    def _push(self, job: Job) -> None:
        if not job.queued:
            job.queued = True
            entry = (job.not_before, 0 if job.wanted else 1, next(self._ticket), job)
            heapq.heappush(self._ready, entry)
            self._work.notify()

    def _settle(self, job: Job) -> None:
        job.settled = True
        self._charged -= job.charge
