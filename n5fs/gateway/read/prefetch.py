"""Whole objects fetched once however many ask (single flight), and read-ahead across the
objects of a folder on a small bounded pool.

Why: on S3 every object is a request whose latency dwarfs its transfer for a 4 MiB chunk, and
the kernel asks for one file at a time. A reader that walks a folder's chunk files in listing
order (``cat *``, ``cp -r``, ``tar``, TensorStore reading a region chunk by chunk) gets the next
few objects of the folder fetched while it reads the current one; they land in the reader's
byte cache (:class:`~n5fs.gateway.read.byte_cache.ByteLRU`), the one memory budget for object bytes, and
are evicted like any other entry.

- :class:`Flights`: one fetch per key in flight. A read of an object being fetched (by the
  read-ahead or another reader) waits for that fetch instead of sending a second GET. A flight
  stores its bytes through a cache ticket, so a commit that overtook it keeps them out of the
  cache; a reader arriving after that commit (the ticket is stale) never joins it. The ticket
  reserves the object's size (as its listing gives it) in the byte cache's budget while the
  fetch is in flight: bytes on their way are memory too, and the cache makes room for them
  before they arrive, not after.
- :class:`Prefetcher`: per folder, where the last whole read stood in the listing. A read of
  the folder's first object, or of one within the window ahead of the last read, is a reader
  following the order: the next ``objects`` of the folder are fetched (those not cached or in
  flight, small enough for the cache). A reader that steps by the same stride twice (every
  5th chunk: a subsampled or strided region read) gets the objects at that stride fetched
  ahead instead; the last confirmed stride is the guess for the first read in the next folder
  the reader enters (a region read walks its row of chunks in every folder alike), so read-ahead
  starts there at once. Any other read resets the folder's window and forgets the guess,
  which stops the read-ahead (random access costs no fetches ahead). At most ``objects``
  fetches and ``max_bytes`` bytes are in flight at once for the whole mount; beyond that
  nothing is queued (read-ahead is an offer, not a debt).

Where the folder's listing comes from is the gateway's business (:attr:`Prefetcher.listing`:
the namespace's cached listings); without one there is no read-ahead.

Lock discipline: ``Flights._lock`` guards the flight table and is held for table work only; it
may take the byte cache's lock inside it (a leaf, :mod:`n5fs.gateway.read.byte_cache`), never the
reverse, so it ranks as an outer leaf (:data:`~n5fs.locking.OUTER_LEAF`). ``Prefetcher._lock``
guards the folder windows, the stride guess, the sorted-name memo and the in-flight budget; it
is a leaf, never held around a store call, a listing lookup or a submit to the pool. Store I/O
runs with no lock held, on the caller's thread or the pool's. The pool is the gateway's
(:class:`~n5fs.workers.Workers`, ``n5fs-read``): started at the first fetch ahead, drained and
stopped by the owner's shutdown.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.gateway.read.byte_cache import fits, version_of
from n5fs.kvstore.keys import basename, parent
from n5fs.locking import LEAF, OUTER_LEAF, assert_held, assert_none_held, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from n5fs.gateway.read.byte_cache import ByteLRU, Ticket, Version
    from n5fs.kvstore.base import KeyInfo
    from n5fs.workers import Pool

log = logging.getLogger(__name__)

#: folders whose read-ahead window is remembered
_FOLDERS = 256


@dataclass(eq=False)
class Flight:
    """One fetch of a whole object in progress."""

    version: Version
    ticket: Ticket
    done: threading.Event = field(default_factory=threading.Event)
    data: bytes | None = None
    failed: bool = False


class Flights:
    """Whole-object fetches, one per key at a time, stored through the byte cache."""

    def __init__(self, cache: ByteLRU, fetch: Callable[[str], bytes | None]) -> None:
        self.cache = cache
        self._fetch = fetch
        self._table: dict[str, Flight] = {}
        # an outer leaf: a new flight reserves its bytes in the byte cache (a leaf) under it
        self._lock = ranked_lock("read flights", OUTER_LEAF)
        self._joins = threading.Condition(self._lock)
        self.joined = 0  # reads that waited for a fetch already in flight

    def busy(self, key: str) -> bool:
        with self._lock:
            return key in self._table

    def load(self, key: str, version: Version) -> bytes | None:
        """The object's bytes: from a live fetch of the same version, else from a new one."""
        with self._lock:
            flight = self._table.get(key)
            joined = (
                flight is not None and not flight.ticket.stale and fits(flight.version, version)
            )
            if joined:
                self.joined += 1
                self._joins.notify_all()
            else:
                flight = self._start_locked(key, version)
        assert flight is not None
        if not joined:
            return self._run(key, flight)
        flight.done.wait()
        if flight.failed:  # the read-ahead's fetch failed: ask again, and see the error
            return self._run(key, self._start(key, version))
        return flight.data

    def wait_joined(self, count: int, timeout: float | None = None) -> bool:
        """Wait until ``count`` reads have joined a flight (tests); False on timeout."""
        with self._joins:
            return self._joins.wait_for(lambda: self.joined >= count, timeout)

    def start(self, key: str, version: Version) -> Flight | None:
        """A new flight of ``key`` for the read-ahead; None when one is already in the air."""
        with self._lock:
            if key in self._table:
                return None
            return self._start_locked(key, version)

    def _start(self, key: str, version: Version) -> Flight:
        with self._lock:
            return self._start_locked(key, version)

    def _start_locked(self, key: str, version: Version) -> Flight:
        assert_held(self._lock)
        flight = Flight(version, self.cache.ticket(key, reserve=_size_of(version)))
        self._table[key] = flight
        return flight

    def run(self, key: str, flight: Flight) -> None:
        """Fetch for a flight :meth:`start` made (on the pool). A failure is the reader's to
        see: the flight is marked failed, and a reader waiting for it fetches again."""
        try:
            self._run(key, flight)
        except Exception as exc:  # noqa: BLE001 - read-ahead is an offer; the reader retries
            log.debug("read-ahead of %s failed: %s", key, exc)

    def _run(self, key: str, flight: Flight) -> bytes | None:
        assert_none_held(OUTER_LEAF)  # the fetch is store I/O
        try:
            data = self._fetch(key)
        except BaseException:
            self.cache.release(flight.ticket)
            flight.failed = True
            self._land(key, flight)
            raise
        if data is None:
            self.cache.release(flight.ticket)
        else:
            self.cache.fill(flight.ticket, flight.version, data)
        flight.data = data
        self._land(key, flight)
        return data

    def _land(self, key: str, flight: Flight) -> None:
        with self._lock:
            if self._table.get(key) is flight:
                del self._table[key]
        flight.done.set()


def _size_of(version: Version) -> int:
    """The object's size as its listing gave it (0: unknown)."""
    return 0 if version is None else version[0]


@dataclass(frozen=True, slots=True)
class _Window:
    """Where a folder's last read stood: its index, the last index fetched ahead, and the
    stride the reads follow (1: the listing order; 0: none yet; > 1: every stride-th)."""

    last: int
    ahead: int
    stride: int = 1


class Prefetcher:
    """Read-ahead of whole objects of one folder, in listing order, on a bounded pool."""

    def __init__(
        self,
        flights: Flights,
        *,
        objects: int,
        max_bytes: int,
        small_object: int,
        pool: Pool,
    ) -> None:
        self.flights = flights
        self.objects = objects
        self.max_bytes = max_bytes
        self.small_object = small_object
        #: the read pool (its owner's: :class:`~n5fs.workers.Workers`), drained at shutdown
        self._pool = pool
        #: the folder's files (the namespace's cached listing); set by the gateway
        self.listing: Callable[[str], Mapping[str, KeyInfo] | None] | None = None
        self._windows: dict[str, _Window] = {}
        self._stride = 0  # the last stride a reader was seen to follow (0: none)
        self._names: dict[str, tuple[Mapping[str, KeyInfo], list[str]]] = {}
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._closed = False
        self._lock = ranked_lock("read-ahead", LEAF)
        self._landed = threading.Condition(self._lock)
        self.started = 0  # objects fetched ahead

    def read_whole(self, key: str) -> None:
        """A reader starts reading ``key`` whole: fetch the next objects if it follows the
        folder's order."""
        listing = self.listing
        if listing is None or self.objects <= 0:
            return
        folder = parent(key)
        files = listing(folder + "/" if folder else "")
        if not files:
            return
        names = self._sorted(folder, files)
        name = basename(key)
        at = bisect.bisect_left(names, name)
        if at == len(names) or names[at] != name:
            return
        todo = self._plan(folder, at, len(names))
        for index in todo:
            info = files.get(names[index])
            if info is not None:
                self._offer(info)

    def _sorted(self, folder: str, files: Mapping[str, KeyInfo]) -> list[str]:
        with self._lock:
            memo = self._names.get(folder)
        if memo is not None and memo[0] is files:
            return memo[1]
        names = sorted(files)
        with self._lock:
            self._names[folder] = (files, names)
            while len(self._names) > _FOLDERS:
                del self._names[next(iter(self._names))]
        return names

    def _plan(self, folder: str, at: int, count: int) -> range:
        """The indexes to fetch ahead of a read at ``at``; records the folder's window."""
        with self._lock:
            stride, candidate = self._follows(self._windows.pop(folder, None), at)
            if stride:
                end = min(count, at + 1 + stride * self.objects)
                todo = range(at + stride, end, stride)  # cached or in flight: _offer skips
                self._windows[folder] = _Window(at, todo[-1] if todo else at, stride)
            else:
                todo = range(0)
                self._windows[folder] = _Window(at, at, candidate)
            while len(self._windows) > _FOLDERS:
                del self._windows[next(iter(self._windows))]
        return todo

    def _follows(self, window: _Window | None, at: int) -> tuple[int, int]:
        """The stride a read at ``at`` follows (0: none), and when none, a step that may turn
        out to be one (the next read at the same step confirms it). Caller holds the lock."""
        assert_held(self._lock)
        if window is None:  # the folder's first read: the listing order, or the last stride
            return self._stride or (1 if at == 0 else 0), 0
        step = at - window.last
        if window.stride > 1 and step == window.stride:
            self._stride = step
            return step, 0
        if window.last < at <= max(window.last + 1, window.ahead):
            self._stride = 1
            return 1, 0
        self._stride = 0  # a read out of every pattern: guess none in the next folder
        return 0, max(step, 0)

    def _offer(self, info: KeyInfo) -> None:
        version = version_of(info)
        if info.size > self.small_object or not self.flights.cache.admits(info.size):
            return
        if self.flights.cache.holds(info.key, version) or self.flights.busy(info.key):
            return
        with self._lock:
            if self._closed or self._in_flight >= self.objects:
                return
            if self._in_flight_bytes + info.size > self.max_bytes:
                return
            self._in_flight += 1
            self._in_flight_bytes += info.size
        flight = self.flights.start(info.key, version)
        if flight is None:
            self._done(info.size)
            return
        self.started += 1
        try:
            self._pool.submit(self._run, info.key, info.size, flight)
        except RuntimeError:  # shut down meanwhile (WorkersClosed): the flight must still land
            self._run(info.key, info.size, flight)

    def _run(self, key: str, size: int, flight: Flight) -> None:
        try:
            self.flights.run(key, flight)
        finally:
            self._done(size)

    def _done(self, size: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self._in_flight_bytes -= size
            if not self._in_flight:
                self._landed.notify_all()

    def idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is being fetched ahead; False if ``timeout`` passed first."""
        with self._landed:
            return self._landed.wait_for(lambda: not self._in_flight, timeout)

    def in_flight(self) -> tuple[int, int]:
        """Objects and bytes being fetched ahead now."""
        with self._lock:
            return self._in_flight, self._in_flight_bytes

    def pool(self) -> Pool | None:
        """The bounded pool (for ranged reads too); None once closed."""
        with self._lock:
            closed = self._closed
        return None if closed or self._pool.closed else self._pool

    def close(self) -> None:
        """No read-ahead starts from now on. The fetches queued or running finish on the
        pool, whose owner's shutdown waits for them (the pool drains: their flights must
        land, a reader may be waiting on one)."""
        with self._lock:
            self._closed = True
