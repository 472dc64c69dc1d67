"""Single-flight, generation-checked caches with a TTL and an injected clock.

Why this shape: FUSE calls arrive on many threads. A cache that loads outside its lock and
stores what it loaded can store an answer that was already stale when it arrived (a LIST that
began before a commit, stored after the commit invalidated the folder: the committed name then
answers ENOENT until the TTL). Here every load is a *flight*:

- one flight per key: threads that miss the same key wait for one load (one LIST per folder,
  however many threads ask);
- every invalidation of a key (``invalidate``, ``invalidate_prefix``, ``replace``, ``clear``)
  marks the flights of that key stale and forgets them: a stale flight's value is handed to the
  callers that were already waiting (their question began before the change) but never stored,
  and a caller that arrives after the invalidation starts a fresh flight;
- values are immutable: ``replace`` swaps in ``change(old)``, it never mutates ``old`` in place,
  so a reader iterating a value can never see it change under it;
- failures of the types named in ``negative`` are cached too (a negative entry), and re-raised
  on a hit; others are never cached;
- a *batch* (``batch``) answers many keys under one prefix from one load (a walk of a whole
  array answers every folder below it), each value with the time its own read began. The
  rule holds key by key: every invalidation of a key under the batch's prefix while the batch
  is open is noted with its time, and a value read before that time is not stored; a value
  read after it is (it saw the change). A batch only fills holes: a key with a live entry
  keeps it (every change since that entry's load patched it, so it is as current as this
  cache can know). A batch is not single-flight by itself: its owner shares it (the
  gateway's walks of arrays).

A value derived from another cache's value (detection from a folder's listing) may be no
fresher than that one: its loader ``cap``-s its flight to the time the other value expires
(``get_until``), and the stored value expires then if its TTL would keep it longer.

With ``revalidate_after`` (the gateway's folder listings), a value past its TTL whose load took
at least that long is served at once while one flight refreshes it on a small pool
(:data:`REFRESHERS` threads), as HTTP's stale-while-revalidate: a folder whose LIST takes
seconds (50,000 keys on a slow endpoint) then never stalls the lookups in it. Such a value
lives the TTL or four times as long as its load took, whichever is longer (so refreshes keep
the store busy a quarter of the time at most), plus one refresh. A quick load is simply repeated at expiry (the next
caller sees the store as it is then). Only expiry is served stale: an invalidation (a commit)
drops the value, and the next caller waits for a fresh one. The same pool runs the loads a
caller foresees (``load_behind``: the gateway lists the folder a lookup is about to enter):
a flight like any, which later callers join.

With ``weigh`` and ``max_bytes`` (the gateway's folder listings), the values are weighed (about
the bytes each holds) and the least recently used are dropped while the weights together
exceed ``max_bytes``: memory is bounded by bytes, not only by the number of entries. The value
stored last always stays (one folder larger than the whole budget is cached alone, not listed
at every question). A dropped value is loaded again at the next question, as an expired one.

Lock discipline: one internal lock guards the entries and the flight table; it is held only for
dictionary operations, never while a loader runs, so a loader may use other caches (the
detector's loads of a folder use its parent's entry). It is a leaf of the gateway's lock order
(:mod:`n5fs.locking`; a loader runs with no leaf lock held, checked in debug mode). The refresh
pool is a :class:`~n5fs.workers.Workers` pool, taken under the lock once and submitted to
outside it. This module imports only the standard library, :mod:`n5fs.locking` and
:mod:`n5fs.workers` (standard library only too): detection (below the gateway) and the
gateway both use it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from n5fs.locking import LEAF, OUTER_LEAF, assert_held, assert_none_held, ranked_lock
from n5fs.workers import Pool, Workers

V = TypeVar("V")

Clock = Callable[[], float]

#: ``Batch.fill`` stores this many values per hold of the lock
_FILL_SLICE = 1024
#: the pool refreshing expired values behind the callers (``revalidate_after``): its threads'
#: name, and how many (per :class:`~n5fs.workers.Workers`: the gateway's listings are its
#: only cache that refreshes so); it drains at shutdown, as a caller may wait on a refresh
REFRESH_POOL = "n5fs-refresh"
REFRESHERS = 2
#: with ``revalidate_after``, a value lives at least this many times as long as it took to load
SLOW_LIFETIME = 4.0


@dataclass(eq=False)
class _Flight(Generic[V]):
    """One load in progress; ``stale`` once an invalidation touched its key."""

    done: threading.Event = field(default_factory=threading.Event)
    value: V | None = None
    error: BaseException | None = None
    stale: bool = False
    #: the value is fresh until this time at the latest (:meth:`LoadingCache.cap`)
    until: float | None = None


class Batch(Generic[V]):
    """An open batch of one cache (:meth:`LoadingCache.batch`): what invalidations touched
    under ``prefix`` since it opened, and when."""

    def __init__(self, cache: LoadingCache[V], prefix: str) -> None:
        self.cache = cache
        self.prefix = prefix
        self.touched: dict[str, float] = {}  # key -> time of its latest invalidation
        #: (prefix, time) of invalidations of many keys at once (a prefix, ``clear``)
        self.touched_under: list[tuple[str, float]] = []

    def spoiled(self, key: str, born: float) -> bool:
        """Did an invalidation of ``key`` come no earlier than a read that began at ``born``?"""
        if self.touched.get(key, born - 1.0) >= born:
            return True
        return any(t >= born and key.startswith(p) for p, t in self.touched_under)

    def fill(self, items: Iterable[tuple[str, V, float]]) -> int:
        """Store each ``(key, value, born)`` — ``born`` the time the read behind ``value``
        began — where the key has no live entry and ``spoiled`` says no; returns how many.

        Stored :data:`_FILL_SLICE` at a time, the lock taken for each slice (a walk of
        100,000 folders must not stall every other lookup); check and store of one key are
        in one section, so no invalidation slips between them.
        """
        items = list(items)
        stored = 0
        for start in range(0, len(items), _FILL_SLICE):
            stored += self.cache._fill(self, items[start : start + _FILL_SLICE])
        return stored

    def close(self) -> None:
        self.cache._close(self)

    def __enter__(self) -> Batch[V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Entry(Generic[V]):
    #: when the value was stored: it is fresh for ``ttl`` from then. Not from when its load
    #: began (what the flight and batch rules compare with): a folder whose LIST takes longer
    #: than the TTL (50,000 keys on a slow endpoint) would be stale on arrival and listed
    #: again at every lookup, forever. So a value is at most ``ttl`` plus its load's
    #: duration old.
    arrived: float
    value: V | None = None
    error: BaseException | None = None
    #: how long the load took (from when it began to when it arrived)
    took: float = 0.0
    #: what ``weigh`` said of the value (0 without ``weigh``)
    weight: int = 0
    #: no longer fresh from this time on, whatever the TTL says (None: the TTL alone)
    until: float | None = None


class LoadingCache(Generic[V]):
    """str-keyed answers, fresh for ``ttl`` seconds (None: until invalidated); LRU past
    ``max_entries``, and past ``max_bytes`` of ``weigh``-ed values. See the module docstring
    for the flight rules."""

    def __init__(
        self,
        ttl: float | None,
        *,
        max_entries: int = 100_000,
        clock: Clock = time.monotonic,
        negative: tuple[type[BaseException], ...] = (),
        revalidate_after: float | None = None,
        workers: Workers | None = None,
        weigh: Callable[[V], int] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """``workers``: whose ``n5fs-refresh`` pool runs the refreshes (a gateway's: declared
        on it here); None: a :class:`~n5fs.workers.Workers` of this cache's own, made at the
        first refresh and never shut down (its threads end with the process)."""
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._negative = negative
        self._data: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._weigh = weigh
        self.max_bytes = max_bytes
        self._bytes = 0  # the weights of the entries in _data
        self.evicted = 0  # entries dropped for room (count or bytes)
        self._flights: dict[str, _Flight[V]] = {}
        self._batches: list[Batch[V]] = []
        self._lock = ranked_lock("loading cache", LEAF)
        self.hits = 0
        self.misses = 0
        self.discarded = 0  # loads not stored because an invalidation overtook them
        self.revalidate_after = revalidate_after
        self.stale_hits = 0  # expired values served while a refresh ran behind
        self.loaded_behind = 0  # loads started by load_behind
        self._refresher: Pool | None = None
        if revalidate_after is not None and workers is not None:
            self._refresher = workers.pool(REFRESH_POOL, REFRESHERS, drain=True)

    # -- reading -------------------------------------------------------------------------------

    def _fresh(self, key: str, now: float, *, drop: bool = True) -> _Entry[V] | None:
        """The live entry of ``key`` (caller holds the lock). An expired one is dropped
        (unless ``drop`` is False: a question that loads nothing leaves it for
        :meth:`peek`), unless it may be served while it is refreshed (``revalidate``, a
        positive entry)."""
        assert_held(self._lock)
        entry = self._data.get(key)
        if entry is None:
            return None
        if self.ttl is not None and now - entry.arrived >= self._lifetime(entry):
            if drop and not self._serves_stale(entry):
                self._drop(key)
            return None
        if entry.until is not None and now >= entry.until:
            if drop:
                self._drop(key)
            return None
        self._data.move_to_end(key)
        return entry

    def _lifetime(self, entry: _Entry[V]) -> float:
        """The TTL; with ``revalidate_after``, at least :data:`SLOW_LIFETIME` times what the
        load took, so refreshing a slow value keeps the store busy a quarter of the time at
        most (a LIST of 50,000 keys that takes 20 s is read again every 80 s, not every 5)."""
        assert self.ttl is not None
        if self.revalidate_after is None:
            return self.ttl
        return max(self.ttl, SLOW_LIFETIME * entry.took)

    def _serves_stale(self, entry: _Entry[V]) -> bool:
        """May this expired entry answer while it is refreshed? A value whose load took at
        least ``revalidate_after`` seconds: a quick one is simply loaded again."""
        after = self.revalidate_after
        return after is not None and entry.error is None and entry.took >= after

    def get(self, key: str) -> V | None:
        """The cached value, or None (absent, expired, or a negative entry); never loads (nor
        drops an expired value: :meth:`peek` may still see it, and :meth:`load` drops it)."""
        with self._lock:
            entry = self._fresh(key, self._clock(), drop=False)
        return entry.value if entry is not None else None

    def get_until(self, key: str) -> tuple[V, float] | None:
        """The cached value and the time (on this cache's clock) until which it stays fresh
        (``inf`` without a TTL), or None (absent, expired, or a negative entry); never
        loads. The time is what a value derived from this one may :meth:`cap` itself to."""
        with self._lock:
            entry = self._fresh(key, self._clock(), drop=False)
            if entry is None or entry.value is None:
                return None
            until = math.inf if self.ttl is None else entry.arrived + self._lifetime(entry)
            if entry.until is not None:
                until = min(until, entry.until)
            return entry.value, until

    def cap(self, key: str, until: float) -> None:
        """The load of ``key`` in flight (the caller's own, from inside its loader) is
        derived from something fresh only until ``until``: its value, once stored, expires
        then if its TTL would keep it longer. No flight of ``key``: nothing happens."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                flight.until = until if flight.until is None else min(flight.until, until)

    def peek(self, key: str) -> V | None:
        """The value held for ``key`` even past its TTL (None: none, or a negative entry);
        never loads, never drops. For guesses only (the read-ahead guesses what a reader will
        ask next from a folder's listing): whatever is read still goes by a live value."""
        with self._lock:
            entry = self._data.get(key)
        return None if entry is None else entry.value

    def answers(self, key: str) -> bool:
        """Would :meth:`load` answer ``key`` without waiting (a live value, or an expired one
        it serves while refreshing)? Never loads."""
        with self._lock:
            now = self._clock()
            if self._fresh(key, now) is not None:
                return True
            return key in self._data  # kept by _fresh only when it serves stale

    def load(self, key: str, loader: Callable[[], V]) -> V:
        """The cached value, else the value of one shared call of ``loader``; an expired
        value whose load was slow (``revalidate_after``) at once, while one call refreshes it
        behind."""
        with self._lock:
            entry = self._fresh(key, self._clock())
            if entry is not None:
                self.hits += 1
                return _unwrap(entry.value, entry.error)
            stale = self._data.get(key)  # kept by _fresh only to be served while refreshed
            flight = self._flights.get(key)
            owner = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            if stale is None:
                self.misses += 1
            else:
                self.stale_hits += 1
        if stale is not None:
            if owner:
                self._refresh(key, flight, loader)
            return _unwrap(stale.value, None)
        if not owner:
            flight.done.wait()
            return _unwrap(flight.value, flight.error)
        self._fly(key, flight, loader)
        return _unwrap(flight.value, flight.error)

    def load_behind(self, key: str, loader: Callable[[], V]) -> bool:
        """Start the load of ``key`` on the refresh pool and return at once, unless a value
        (live, or expired and kept) or a flight is there: a load a caller foresees (the
        gateway lists the folder a lookup is about to enter while it lists the one above).
        A caller that asks meanwhile joins the flight, as any. True if one started."""
        with self._lock:
            self._fresh(key, self._clock())  # (drops an expired value it would not serve)
            if key in self._data or key in self._flights:
                return False
            flight = self._flights[key] = _Flight[V]()
            self.loaded_behind += 1
        self._refresh(key, flight, loader)
        return True

    def _refresh(self, key: str, flight: _Flight[V], loader: Callable[[], V]) -> None:
        """Run the flight on the refresh pool (inline once the pool is shut down: the
        gateway closing, or the interpreter)."""
        with self._lock:
            if self._refresher is None:
                self._refresher = Workers().pool(REFRESH_POOL, REFRESHERS, drain=True)
            pool = self._refresher
        try:
            pool.submit(self._fly, key, flight, loader)
        except RuntimeError:  # WorkersClosed, or an interpreter shutting down
            self._fly(key, flight, loader)

    def _fly(self, key: str, flight: _Flight[V], loader: Callable[[], V]) -> None:
        assert_none_held(OUTER_LEAF)  # a load is store I/O: outside every cache lock
        began = self._clock()
        try:
            flight.value = loader()
        except BaseException as exc:  # noqa: BLE001  # handed to every waiting caller
            flight.error = exc
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
            keep = not flight.stale and (
                flight.error is None or isinstance(flight.error, self._negative)
            )
            if keep:
                now = self._clock()
                entry = _Entry(now, flight.value, flight.error, now - began, until=flight.until)
                self._store(key, entry)
            elif flight.stale:
                self.discarded += 1
            else:  # a failed load: an expired value it was refreshing must not outlive it
                self._drop(key)  # (the next caller loads, and sees the failure)
        flight.done.set()

    def batch(self, prefix: str) -> Batch[V]:
        """Open a batch for keys under ``prefix`` (module docstring): open it before the
        first read whose values it will ``fill``, close it after the last fill (any thread;
        a ``with`` block closes it too)."""
        batch = Batch(self, prefix)
        with self._lock:
            self._batches.append(batch)
        return batch

    def _close(self, batch: Batch[V]) -> None:
        with self._lock:
            if batch in self._batches:
                self._batches.remove(batch)

    def _fill(self, batch: Batch[V], items: list[tuple[str, V, float]]) -> int:
        with self._lock:
            now, stored = self._clock(), 0
            for key, value, born in items:
                if not key.startswith(batch.prefix):
                    continue
                if batch.spoiled(key, born):
                    self.discarded += 1
                elif self._fresh(key, now) is None:
                    self._store(key, _Entry(now, value, took=now - born))
                    stored += 1
            return stored

    # -- writing -------------------------------------------------------------------------------

    def _weighed(self, entry: _Entry[V]) -> _Entry[V]:
        if self._weigh is None or entry.value is None:
            return entry
        return dataclasses.replace(entry, weight=self._weigh(entry.value))

    def _store(self, key: str, entry: _Entry[V]) -> None:
        """Put ``entry`` under ``key``, most recently used, then drop the least recently used
        entries past the bounds (never this one: it is the last)."""
        entry = self._weighed(entry)
        self._drop(key)
        self._data[key] = entry
        self._bytes += entry.weight
        limit = self.max_bytes
        while len(self._data) > self.max_entries or (
            limit is not None and self._bytes > limit and len(self._data) > 1
        ):
            self._drop(next(iter(self._data)))
            self.evicted += 1

    def _drop(self, key: str) -> None:
        entry = self._data.pop(key, None)
        if entry is not None:
            self._bytes -= entry.weight

    @property
    def nbytes(self) -> int:
        """The weights of the values held (0 without ``weigh``)."""
        with self._lock:
            return self._bytes

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._ground(key)
            self._store(key, _Entry(self._clock(), value))

    def replace(self, key: str, change: Callable[[V], V]) -> bool:
        """Swap a live entry for ``change(old)`` (keeping its age); False if there is none.

        Flights of ``key`` are grounded either way: they may have read the store before the
        change this call records.
        """
        with self._lock:
            self._ground(key)
            entry = self._fresh(key, self._clock())
            if entry is None or entry.value is None:
                self._drop(key)  # a negative entry says nothing about the change
                return False
            changed = _Entry(entry.arrived, change(entry.value), took=entry.took, until=entry.until)
            self._store(key, changed)
            return True

    def _ground(self, key: str) -> None:
        flight = self._flights.pop(key, None)
        if flight is not None:
            flight.stale = True
        if self._batches:
            now = self._clock()
            for batch in self._batches:
                if key.startswith(batch.prefix):
                    batch.touched[key] = now

    def invalidate(self, key: str) -> None:
        with self._lock:
            self._ground(key)
            self._drop(key)

    def invalidate_prefix(self, prefix: str) -> int:
        with self._lock:
            for key in [k for k in self._flights if k.startswith(prefix)]:
                self._ground(key)
            now = self._clock()
            for batch in self._batches:
                if batch.prefix.startswith(prefix) or prefix.startswith(batch.prefix):
                    batch.touched_under.append((prefix, now))
            stale = [k for k in self._data if k.startswith(prefix)]
            for key in stale:
                self._drop(key)
            return len(stale)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._flights):
                self._ground(key)
            now = self._clock()
            for batch in self._batches:
                batch.touched_under.append(("", now))
            self._data.clear()
            self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


def _unwrap(value: V | None, error: BaseException | None) -> V:
    if error is not None:
        # a shared (cached) exception: drop the traceback of earlier raises, or every hit
        # would lengthen it
        raise error.with_traceback(None)
    return value  # type: ignore[return-value]  # a successful load stored a V
