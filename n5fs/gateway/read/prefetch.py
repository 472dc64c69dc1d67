"""Whole objects fetched once however many ask (single flight), and read-ahead across the
objects of a folder, and on into the folders after it, deep enough to hide the store's
latency.

Why: on S3 every object is a request whose latency dwarfs its transfer for a small chunk, and
the kernel asks for one file at a time. A reader that walks a folder's chunk files in order
(``cat *``, ``find | xargs cat``, ``cp -r``, ``tar``, a program reading an array chunk by chunk)
gets the next objects fetched while it reads the current one; they land in the reader's byte
cache (:class:`~n5fs.gateway.read.byte_cache.ByteLRU`), the one memory budget for object
bytes, and are evicted like any other entry. To keep such a reader from ever waiting, an object
must be asked for one fetch time before the reader gets to it: the objects in flight must be
the fetch time over the reader's time per object (Little's law; 50 ms over 1 ms is 50 objects).

- :class:`Flights`: one fetch per key in flight. A read of an object being fetched (by the
  read-ahead or another reader) waits for that fetch instead of sending a second GET. A flight
  stores its bytes through a cache ticket, so a commit that overtook it keeps them out of the
  cache; a reader arriving after that commit (the ticket is stale) never joins it. The ticket
  reserves the object's size (as its listing gives it) in the byte cache's budget while the
  fetch is in flight: bytes on their way are memory too, and the cache makes room for them
  before they arrive, not after. Each fetch's time goes to the :class:`Pace`.
- :class:`Pace`: the depth of the read-ahead, from the medians of two recent measures: how long
  a whole-object fetch takes, and how long a reader that follows an order takes from getting
  one object to asking for the next (its own time: what it waited for is not counted, or a read-ahead too
  shallow would measure a slow reader and stay too shallow). The depth is the first over the
  second, never below the ``objects`` the reader was built with (a reader with no history gets
  what it always got) and never above the mount's bound on objects in flight.
- Orders (:class:`_Order`): a folder's names in listing order (sorted: what ``ls`` and ``find``
  show), and, where chunk indexes make it differ, in grid order (names that are chunk indexes,
  ``12`` or ``0.3.12``, by their numbers: 0, 1, 2, ... 10 where the listing has 0, 1, 10, 11,
  ... 2). A program reading an array along its fastest axis asks in grid order; ``cat *`` in
  listing order.
- :class:`Prefetcher`: per folder, where the last whole read stood in the order it follows. A
  read of the next object in that order, or of one within the window fetched ahead, is a
  reader following it; a read of the next object in the folder's other order switches the
  window to that order. A reader that steps by the same stride twice (every 5th chunk: a
  subsampled or strided region read) gets the objects at that stride fetched ahead instead.
  The last confirmed stride and order are the guess for the first read in the next folder the
  reader enters (a region read walks its row of chunks in every folder alike), so read-ahead
  starts there at once. A reader following an order in steps of one whose window reaches the
  end of the folder gets the first objects of the next folders fetched too: the next folder in
  the same order among the folders of the parent (climbing to the parent's next sibling and
  back down at the end of a row of a deeper chunk tree), as ``find`` walks a tree and a grid
  reader walks an array. A reader following an order in steps of one is a *sweep*, and a
  sweep may be several threads (TensorStore's file driver reads a region's chunks on a few,
  each folder's in an order of its own): a read behind the furthest one read, within what the
  sweep read or fetched (or a few objects below that), is one of its readers, not one leaving
  the order; the furthest read stays where it was. A read of the object before the last one
  (a reader going down the order), or one below everything the sweep read, gets the objects
  below it fetched ahead instead (as deep as above an ascending reader, and nothing above).
  Such readers may start a folder in no order at all (four threads take its chunks 5, 3, 1
  and 0): :data:`BURST` reads of a folder, each closer to the first than a fetch takes (no
  single reader asks that fast: it waits for each), are a sweep too, as is the next folder's
  first read then.
  Any other read resets the folder's window and forgets the guess, which stops the
  read-ahead: random access costs no fetches ahead. A first read of a folder's
  first object with no guess to go by gets ``objects`` fetched ahead (no more: one read
  confirms nothing), and only a confirmed reader gets the :class:`Pace`'s depth or the next
  folders.

Bounds: at most ``max_objects`` fetches and ``max_bytes`` bytes are in flight at once for the
whole mount (the bytes also reserved in the byte cache); beyond that nothing is queued
(read-ahead is an offer, not a debt), and the next read offers again from where the last
offer stopped. A folder's window records how far ahead it offered, so each read offers only
the objects new to the window (not the whole depth again).

Where a folder's files and its subfolders come from is the gateway's business
(:attr:`Prefetcher.listing`, :attr:`Prefetcher.folders`: the namespace's cached listings,
never a LIST); without the files there is no read-ahead, without the folders none past the
folder's end.

Lock discipline: ``Flights._lock`` guards the flight table and is held for table work only; it
may take the byte cache's lock inside it (a leaf, :mod:`n5fs.gateway.read.byte_cache`), never the
reverse, so it ranks as an outer leaf (:data:`~n5fs.locking.OUTER_LEAF`). ``Prefetcher._lock``
guards the folder windows, the stride and order guesses, the order memos and the in-flight
budget; ``Pace._lock`` guards the recent samples. Both are leaves, never held together, around
a store call, a listing lookup or a submit to the pool. Store I/O runs with no lock held, on
the caller's thread or the pool's. The pool is the gateway's (:class:`~n5fs.workers.Workers`,
``n5fs-read``): started at the first fetch ahead, its threads started one per fetch waiting
for one up to its bound (threads waiting on the network cost no CPU), drained and stopped by
the owner's shutdown.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from n5fs.gateway.read.byte_cache import fits, version_of
from n5fs.kvstore.keys import basename, parent
from n5fs.locking import LEAF, OUTER_LEAF, assert_held, assert_none_held, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping

    from n5fs.gateway.read.byte_cache import ByteLRU, Ticket, Version
    from n5fs.kvstore.base import KeyInfo
    from n5fs.workers import Pool

log = logging.getLogger(__name__)

#: folders whose read-ahead window (and whose orders) are remembered
_FOLDERS = 256
#: folders past the end of the one being read that one read's read-ahead goes on into
_NEXT_FOLDERS = 16
#: levels climbed to find the next folder (a 3-D chunk tree's next row: two)
_CLIMB = 4
#: the recent samples the :class:`Pace` takes the median of
_SAMPLES = 15
#: the shortest time per object a reader is taken to have (one FUSE round trip is longer)
_MIN_PACE = 1e-4
#: reads of one folder in no order, each closer to the first than a fetch takes, that make a
#: sweep (several readers at once: TensorStore reads a region's chunks on a few threads)
BURST = 3
#: the orders a folder's names are followed in (indexes into a folder's orders)
LISTING, GRID = 0, 1


class Pace:
    """How deep the read-ahead goes: a fetch's time over a reader's own time per object
    (module docstring), between ``floor`` and ``ceiling`` objects.

    Times come from ``clock``; a clock that does not move (tests) gives fetches of no time,
    and so the floor, unless a test moves it.
    """

    def __init__(self, clock: Callable[[], float], floor: int, ceiling: int) -> None:
        self.clock = clock
        self.floor = floor
        self.ceiling = max(floor, ceiling)
        self._fetch: deque[float] = deque(maxlen=_SAMPLES)  # seconds of whole-object fetches
        self._pace: deque[float] = deque(maxlen=_SAMPLES)  # a reader's, object to object
        self._served: float | None = None  # when a whole read last got its bytes
        self._lock = ranked_lock("read pace", LEAF)

    def fetched(self, seconds: float) -> None:
        """A whole-object fetch took ``seconds``."""
        with self._lock:
            self._fetch.append(max(0.0, seconds))

    def served(self) -> None:
        """A whole read got its bytes (from the cache, a flight or a fetch of its own)."""
        now = self.clock()
        with self._lock:
            self._served = now

    def stepped(self, now: float) -> None:
        """A reader following an order asked for its next object at ``now``."""
        with self._lock:
            if self._served is not None:
                self._pace.append(max(0.0, now - self._served))

    def depth(self) -> int:
        """Objects to have in flight ahead of a reader that follows an order."""
        fetch, pace = self.times()
        if fetch is None or pace is None:
            return self.floor
        wanted = math.ceil(fetch / max(pace, _MIN_PACE))
        return max(self.floor, min(self.ceiling, wanted))

    def times(self) -> tuple[float | None, float | None]:
        """The median of the recent fetch times and of a reader's recent times per object
        (None: none seen yet). Medians: a stall of the reader's own (a lookup that lists a
        folder) or one slow GET says nothing of the next hundred objects."""
        with self._lock:
            fetch, pace = list(self._fetch), list(self._pace)
        return _median(fetch), _median(pace)


def _median(samples: list[float]) -> float | None:
    return statistics.median(samples) if samples else None


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

    def __init__(
        self, cache: ByteLRU, fetch: Callable[[str], bytes | None], pace: Pace | None = None
    ) -> None:
        self.cache = cache
        self._fetch = fetch
        #: told each fetch's time (None: not timed)
        self.pace = pace
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
        pace = self.pace
        start = pace.clock() if pace is not None else 0.0
        try:
            data = self._fetch(key)
        except BaseException:
            self.cache.release(flight.ticket)
            flight.failed = True
            self._land(key, flight)
            raise
        if pace is not None:
            pace.fetched(pace.clock() - start)
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
class _Order:
    """A folder's names in one order, and each name's index in it."""

    names: list[str]
    index: dict[str, int]


def _grid_key(name: str) -> tuple[int, tuple[int, ...], str]:
    """Chunk indexes (``12``, ``0.3.12``) by their numbers, after every other name."""
    parts = name.split(".")
    if all(part.isascii() and part.isdigit() for part in parts):
        return (1, tuple(int(part) for part in parts), name)
    return (0, (), name)


def _orders(names: Iterable[str]) -> tuple[_Order, ...]:
    """The listing order, and the grid order where it differs."""
    listing = sorted(names)
    orders = [_Order(listing, {name: i for i, name in enumerate(listing)})]
    grid = sorted(listing, key=_grid_key)
    if grid != listing:
        orders.append(_Order(grid, {name: i for i, name in enumerate(grid)}))
    return tuple(orders)


@dataclass(frozen=True, slots=True)
class _Window:
    """Where a folder's last read stood: its index in the order it follows (-1: no read yet,
    the read-ahead came here from the folder before; in a sweep, the highest index read), the
    last index offered ahead, and the stride the reads follow (1: the order itself; 0: none
    yet; > 1: every stride-th). A sweep (stride 1) also records the lowest index read in it
    (``low``, -1: none yet) and the lowest offered below that (``behind``, -1: none)."""

    last: int
    ahead: int
    stride: int = 1
    order: int = LISTING
    low: int = -1
    behind: int = -1
    #: reads of the folder in no order so far, the first of them at ``since``, the lowest
    #: index among them ``low`` and the highest ``high`` (a burst, if they came fast)
    scattered: int = 0
    since: float = 0.0
    high: int = -1

    def floor(self) -> int:
        """A sweep's lowest index read or offered (``last`` before any read below it)."""
        low = self.low if self.low >= 0 else self.last
        return min(low, self.behind) if self.behind >= 0 else low


def _burst(window: _Window, now: float, span: float) -> bool:
    """Is a read at ``now`` the :data:`BURST`-th of reads of the folder in no order, each
    within ``span`` (a fetch's time) of the first: readers at once?"""
    return window.scattered > 0 and window.scattered + 1 >= BURST and now - window.since <= span


class _Offer(Enum):
    TAKEN = "taken"  # fetched ahead now, or there already (cached, in flight, too large)
    FULL = "full"  # the mount's bound on objects or bytes in flight is reached (or closed)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one read fetches ahead: indexes ``first`` to ``stop`` (exclusive) by ``stride``
    in ``order``; ``confirmed``: the read follows an order seen before (or guessed from the
    folder before), so it gets the pace's depth and the next folders."""

    order: int
    first: int
    stop: int
    stride: int
    confirmed: bool
    depth: int = 0  # objects ahead of the read
    front: int = 0  # the index the objects ahead are counted from (a sweep's highest read)
    below: int = -1  # a sweep read below everything read in it: offer down from here ...
    bottom: int = -1  # ... to here (exclusive)


class Prefetcher:
    """Read-ahead of whole objects of a folder and the folders after it, in the order a
    reader follows, on a bounded pool (module docstring)."""

    def __init__(
        self,
        flights: Flights,
        *,
        objects: int,
        max_bytes: int,
        small_object: int,
        pool: Pool,
        max_objects: int | None = None,
        pace: Pace | None = None,
    ) -> None:
        """``objects``: fetched ahead of a reader with no history (and the least ahead of
        any reader that follows an order); ``max_objects``: in flight at once for the mount
        (default ``objects``); ``pace``: the depth for a reader that follows an order (default:
        ``objects`` always)."""
        self.flights = flights
        self.objects = objects
        self.max_objects = max(objects, max_objects or objects)
        self.max_bytes = max_bytes
        self.small_object = small_object
        self.pace = pace or Pace(lambda: 0.0, objects, objects)
        #: the read pool (its owner's: :class:`~n5fs.workers.Workers`), drained at shutdown
        self._pool = pool
        #: the folder's files (the namespace's cached listing); set by the gateway
        self.listing: Callable[[str], Mapping[str, KeyInfo] | None] | None = None
        #: the folder's subfolders (the namespace's cached listing); set by the gateway
        self.folders: Callable[[str], Collection[str] | None] | None = None
        self._windows: dict[str, _Window] = {}
        self._stride = 0  # the last stride a reader was seen to follow (0: none)
        self._order = LISTING  # the order it followed
        self._files: dict[str, tuple[object, tuple[_Order, ...]]] = {}
        self._subfolders: dict[str, tuple[object, tuple[_Order, ...]]] = {}
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._closed = False
        self._lock = ranked_lock("read-ahead", LEAF)
        self._landed = threading.Condition(self._lock)
        self.started = 0  # objects fetched ahead

    def read_whole(self, key: str) -> None:
        """A reader starts reading ``key`` whole: fetch the next objects if it follows an
        order of the folder."""
        listing = self.listing
        if listing is None or self.objects <= 0:
            return
        now = self.pace.clock()
        folder = parent(key)
        files = listing(folder + "/" if folder else "")
        if not files:
            return
        orders = self._memo(self._files, folder, files)
        name = basename(key)
        at = tuple(order.index.get(name, -1) for order in orders)
        info = files.get(name)
        if at[0] < 0 or info is None:
            return
        # no deeper than the bytes in flight may be: what lands must stay cached until read
        reach = max(1, self.max_bytes // max(1, info.size))
        plan = self._plan(folder, at, orders, min(self.pace.depth(), reach), reach, now)
        if plan.confirmed:
            self.pace.stepped(now)
        if not plan.stride:
            return
        names = orders[plan.order].names
        full = self._ahead_in(folder, files, names, plan)
        if not full and plan.below > plan.bottom:
            full = self._behind_in(folder, files, names, plan)
        if plan.confirmed and plan.stride == 1 and not full and plan.stop == len(names):
            self._next_folders(folder, plan.order, plan.depth - (len(names) - 1 - plan.front))

    def _memo(
        self, memo: dict[str, tuple[object, tuple[_Order, ...]]], folder: str, names: Iterable[str]
    ) -> tuple[_Order, ...]:
        """The orders of ``names`` (a folder's files or subfolders), sorted once per listing."""
        with self._lock:
            known = memo.get(folder)
        if known is not None and known[0] is names:
            return known[1]
        orders = _orders(names)
        with self._lock:
            memo[folder] = (names, orders)
            while len(memo) > _FOLDERS:
                del memo[next(iter(memo))]
        return orders

    def _plan(
        self,
        folder: str,
        at: tuple[int, ...],
        orders: tuple[_Order, ...],
        depth: int,
        reach: int,
        now: float,
    ) -> _Plan:
        """What a read at ``at`` (its index in each order) fetches ahead: ``depth`` objects if
        it follows a confirmed order, else at most ``reach`` of the ``objects`` a reader
        with no history gets; records the folder's window."""
        span = self.pace.times()[0] or 0.0  # reads closer than a fetch: readers at once
        with self._lock:
            window = self._windows.pop(folder, None)
            stride, order, confirmed = self._follows(window, at, orders, now, span)
            index = front = low = at[order]
            below = bottom = behind = -1
            down = burst = False
            if stride:
                ahead = depth if confirmed else min(self.objects, reach)
                if stride == 1 and window is not None and _burst(window, now, span):
                    # readers at once: a sweep from the lowest to the highest they read,
                    # offered between (what they skipped so far), above and below
                    burst = True
                    front = max(index, window.high)
                    low = min(index, window.low if window.low >= 0 else window.last)
                    below, bottom = low - 1, max(-1, low - 1 - ahead)
                elif (
                    stride == 1
                    and window is not None
                    and window.last >= 0
                    and window.order == order
                    and (window.stride == 1 or index == window.last - 1)
                ):
                    # a sweep goes on, in whatever order its readers take: its front never
                    # moves back, and a read below all it read offers what lies below
                    read_low = window.low if window.low >= 0 else window.last
                    front, low, behind = (
                        max(index, window.last),
                        min(index, read_low),
                        window.behind,
                    )
                    down = index < read_low
                    if down:
                        below = min(index, behind if behind >= 0 else index) - 1
                        bottom = max(-1, index - 1 - ahead)
                first = front + stride
                if window is not None and (window.order, window.stride) == (order, stride):
                    first = max(first, window.ahead + stride)  # offered already up to there
                if burst:
                    first = low + 1
                stop = min(len(orders[order].names), front + 1 + stride * ahead)
                if down:  # what lies above the sweep waits for a read up there
                    first = stop = 0
                done = window.ahead if window is not None and window.order == order else front
                self._windows[folder] = _Window(front, max(front, done), stride, order, low, behind)
            else:
                first = stop = ahead = 0
                step = index - window.last if window is not None and window.last >= 0 else 0
                scattered, since, low, high = 1, now, index, index
                if window is not None and window.scattered and now - window.since <= span:
                    scattered, since = window.scattered + 1, window.since
                    low, high = min(low, window.low), max(high, window.high)
                self._windows[folder] = _Window(
                    index, index, max(step, 0), order, low, -1, scattered, since, high
                )
            self._trim_locked()
        return _Plan(order, first, stop, stride, confirmed, ahead, front, below, bottom)

    def _follows(
        self,
        window: _Window | None,
        at: tuple[int, ...],
        orders: tuple[_Order, ...],
        now: float,
        span: float,
    ) -> tuple[int, int, bool]:
        """The stride a read at ``at`` follows (0: none), in which order, and whether that is
        confirmed (by the folder's window or the guess from the folder before, or by a burst
        of reads: ``span`` is how close together reads come from readers at once). Caller
        holds the lock."""
        assert_held(self._lock)
        if window is None or window.last < 0:  # the folder's first read
            guess = self._order if self._order < len(at) else LISTING
            if self._stride:
                return self._stride, guess, True
            for order in (guess, *range(len(at))):
                if at[order] == 0:  # its first object: the order, perhaps
                    return 1, order, False
            return 0, guess, False
        order = window.order if window.order < len(at) else LISTING
        step = at[order] - window.last
        if window.stride > 1 and step == window.stride:
            return self._confirm(step, order)
        if step == 1:
            return self._confirm(1, order)
        last = orders[order].names[window.last] if window.last < len(orders[order].names) else None
        for other in range(len(at)):
            if other != order and last is not None:
                was = orders[other].index.get(last, -2)
                if at[other] == was + 1:  # the next object in the other order: switch
                    return self._confirm(1, other)
        if window.last < at[order] <= window.ahead:  # within the window fetched ahead
            return self._confirm(1, order)
        if window.stride == 1 and window.floor() - self.objects <= at[order] < window.last:
            return self._confirm(1, order)  # behind a sweep's front: its readers' disorder
        if step == -1:  # the object before: a reader going down the order
            return self._confirm(1, order)
        if _burst(window, now, span):
            return self._confirm(1, order)  # readers at once: a sweep in an order of their own
        self._stride = 0  # a read out of every pattern: guess none in the next folder
        return 0, order, False

    def _confirm(self, stride: int, order: int) -> tuple[int, int, bool]:
        assert_held(self._lock)
        self._stride, self._order = stride, order
        return stride, order, True

    def _trim_locked(self) -> None:
        while len(self._windows) > _FOLDERS:
            del self._windows[next(iter(self._windows))]

    def _ahead_in(
        self, folder: str, files: Mapping[str, KeyInfo], names: list[str], plan: _Plan
    ) -> bool:
        """Offer the plan's objects; record how far; True when the bounds stopped it."""
        last, full = None, False
        for index in range(plan.first, plan.stop, plan.stride):
            info = files.get(names[index])
            if info is not None and self._offer(info) is _Offer.FULL:
                full = True
                break
            last = index
        if last is not None:
            with self._lock:
                window = self._windows.get(folder)
                if window is not None and window.order == plan.order and window.ahead < last:
                    self._windows[folder] = dataclasses.replace(window, ahead=last)
        return full

    def _behind_in(
        self, folder: str, files: Mapping[str, KeyInfo], names: list[str], plan: _Plan
    ) -> bool:
        """Offer the plan's objects below the sweep, downwards; record how far; True when the
        bounds stopped it."""
        lowest, full = None, False
        for index in range(plan.below, plan.bottom, -1):
            info = files.get(names[index])
            if info is not None and self._offer(info) is _Offer.FULL:
                full = True
                break
            lowest = index
        if lowest is not None:
            with self._lock:
                window = self._windows.get(folder)
                if (
                    window is not None
                    and window.order == plan.order
                    and (window.behind < 0 or lowest < window.behind)
                ):
                    self._windows[folder] = dataclasses.replace(window, behind=lowest)
        return full

    def _next_folders(self, folder: str, order: int, budget: int) -> None:
        """Offer the first ``budget`` objects past the end of ``folder``: those of the folders
        after it, in ``order``."""
        listing = self.listing
        for _ in range(_NEXT_FOLDERS):
            if budget <= 0 or listing is None:
                return
            after = self._folder_after(folder, order)
            if after is None:
                return
            folder = after
            files = listing(folder + "/")
            if not files:
                continue
            orders = self._memo(self._files, folder, files)
            mine = order if order < len(orders) else LISTING
            names = orders[mine].names
            with self._lock:
                window = self._windows.get(folder)
                if window is None:
                    self._windows[folder] = window = _Window(-1, -1, 1, mine)
                    self._trim_locked()
            first = window.ahead + 1 if window.order == mine else 0
            stop = min(len(names), budget)
            if first < stop and self._ahead_in(
                folder, files, names, _Plan(mine, first, stop, 1, confirmed=True)
            ):
                return
            budget -= len(names)

    def _folder_after(self, folder: str, order: int) -> str | None:
        """The folder after ``folder`` in ``order`` at the same depth (the parent's next
        subfolder; at the parent's last, the first of the next parent's, and so up to
        :data:`_CLIMB` levels); None where no cached listing says."""
        path, climbed = folder, 0
        while path and climbed < _CLIMB:
            up = parent(path)
            siblings = self._subfolders_of(up, order)
            at = -1 if siblings is None else siblings.index.get(basename(path), -1)
            if siblings is None or at < 0:
                return None
            climbed += 1
            if at + 1 < len(siblings.names):
                after = f"{up}/{siblings.names[at + 1]}" if up else siblings.names[at + 1]
                for _ in range(climbed - 1):  # back down to the same depth, first of each
                    below = self._subfolders_of(after, order)
                    if below is None or not below.names:
                        return None
                    after = f"{after}/{below.names[0]}"
                return after
            path = up
        return None

    def _subfolders_of(self, folder: str, order: int) -> _Order | None:
        folders = self.folders
        names = None if folders is None else folders(folder + "/" if folder else "")
        if not names:
            return None
        orders = self._memo(self._subfolders, folder, names)
        return orders[order if order < len(orders) else LISTING]

    def _offer(self, info: KeyInfo) -> _Offer:
        version = version_of(info)
        if info.size > self.small_object or not self.flights.cache.admits(info.size):
            return _Offer.TAKEN  # never fetched ahead: the reader reads it by range
        if self.flights.cache.holds(info.key, version) or self.flights.busy(info.key):
            return _Offer.TAKEN
        with self._lock:
            if self._closed or self._in_flight >= self.max_objects:
                return _Offer.FULL
            if self._in_flight_bytes + info.size > self.max_bytes:
                return _Offer.FULL
            self._in_flight += 1
            self._in_flight_bytes += info.size
        flight = self.flights.start(info.key, version)
        if flight is None:
            self._done(info.size)
            return _Offer.TAKEN
        self.started += 1
        try:
            self._pool.submit(self._run, info.key, info.size, flight)
        except RuntimeError:  # shut down meanwhile (WorkersClosed): the flight must still land
            self._run(info.key, info.size, flight)
        return _Offer.TAKEN

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
