"""Object bytes kept in memory, and the gateway's counters.

``ByteLRU`` holds whole small objects up to one byte budget. An entry carries the *version* of
the object it came from (size, mtime and, where the store keeps one, the ETag, as the folder's
listing reports them: :func:`version_of`): a reader asks for the version it believes current,
and bytes of another version are dropped, so a change made behind the mount's back is seen as
soon as the listing is (the TTL), never later. The ETag matters: S3's LastModified has one
second's resolution, so another mount replacing an object by one of the same size within the
second changes nothing else (:func:`fits` says when cached bytes answer a request).

A read that began before a commit must not put its (old) bytes in the cache after the commit
dropped them: a reader takes a *ticket* before it reads the store and stores through it;
``invalidate``/``put`` of the key make outstanding tickets stale, and a stale ticket stores
nothing.

Bytes on their way count too: a whole-object fetch takes its ticket with a *reservation* of
the size the listing gave (:meth:`ByteLRU.ticket`), which counts against the budget from then
on (older entries are evicted to make room) until the bytes are stored or the fetch ends
(:meth:`ByteLRU.fill`, :meth:`ByteLRU.release`). So cached bytes plus those being fetched by
readers and read-ahead stay within ``max_bytes`` (:attr:`ByteLRU.used`), instead of the cache
filling up to its budget and every GET in flight coming on top.

``ByteLRU`` hears of every change the mount makes to a key (the committer puts or drops the
key's bytes after each commit, rename, unlink, ``utimens``, consolidated rewrite), so it also
keeps :class:`OpenedStamps`, the version each key had when it was last opened: an open of a
version the kernel may already hold, with no change of ours since, lets the kernel keep its
pages (``keep_cache``), so re-reads on a read-write mount run at page-cache speed.

Lock discipline: each object here has one internal lock, held for dictionary work only (never
around store I/O); they are leaf locks — nothing else is acquired while one is held (a
``ByteLRU`` tells its ``OpenedStamps`` after releasing its own lock).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.locking import LEAF, ranked_lock
from n5fs.singleflight import Clock, LoadingCache

if TYPE_CHECKING:
    from n5fs.kvstore.base import KeyInfo

__all__ = [
    "ByteLRU",
    "Clock",
    "Counters",
    "LoadingCache",
    "OpenedStamps",
    "Stamp",
    "Ticket",
    "Version",
    "fits",
    "stamp_of",
    "version_of",
]

#: (size, mtime[, etag]) of a stored object as its listing reports it; None when unknown
Version = tuple[int, float] | tuple[int, float, str | None] | None
#: what identifies the bytes an open reads: (inode, size, mtime_ns) of a local file, else the
#: listing's (size, mtime[, etag])
Stamp = tuple[float | str | None, ...]
#: keys whose stamp at open is remembered (about 200 bytes each); the oldest are forgotten
OPENED_KEYS = 1 << 16


def version_of(info: KeyInfo | None) -> Version:
    """The version of the object a listing entry describes (None: no entry)."""
    return None if info is None else (info.size, info.mtime, info.etag)


def stamp_of(info: KeyInfo) -> Stamp:
    """What stands for an object's bytes at open where there is no local file to ``fstat``:
    size, mtime and ETag (two versions of one size in one second differ by their ETag)."""
    return (info.size, info.mtime, info.etag)


def _etag(version: tuple[int, float] | tuple[int, float, str | None]) -> str | None:
    return version[2] if len(version) > 2 else None


def fits(have: Version, want: Version) -> bool:
    """Do bytes of version ``have`` answer a request for ``want``? None on either side: yes
    (unknown). Size and mtime must match; an ETag only where the request names one, and then
    the bytes must carry the same (bytes of unknown ETag cannot prove they are that version)."""
    if have is None or want is None:
        return True
    if have[0] != want[0] or have[1] != want[1]:
        return False
    etag = _etag(want)
    return etag is None or _etag(have) == etag


class OpenedStamps:
    """The stamp each key had at its last open, forgotten at every change of ours.

    An open whose stamp equals the remembered one, with no change of ours in between, reads
    the bytes the kernel may hold pages of: it may keep them. Anything else (first open, a
    change by this mount, another version on disk, a key forgotten for room) drops them.
    """

    def __init__(self, limit: int = OPENED_KEYS) -> None:
        self._stamps: dict[str, Stamp] = {}
        self._limit = limit
        self._lock = ranked_lock("opened stamps", LEAF)

    def opened(self, key: str, stamp: Stamp) -> bool:
        """Remember ``stamp`` as ``key``'s; True when it was the remembered one already."""
        with self._lock:
            same = self._stamps.pop(key, None) == stamp  # re-inserted: most recent last
            self._stamps[key] = stamp
            if len(self._stamps) > self._limit:
                del self._stamps[next(iter(self._stamps))]
            return same

    def forget(self, key: str) -> None:
        with self._lock:
            self._stamps.pop(key, None)

    def forget_prefix(self, prefix: str) -> None:
        with self._lock:
            for key in [k for k in self._stamps if k.startswith(prefix)]:
                del self._stamps[key]

    def clear(self) -> None:
        with self._lock:
            self._stamps.clear()


@dataclass(eq=False)
class Ticket:
    """Permission to store what one read of ``key`` returns, unless overtaken by a change."""

    key: str
    stale: bool = False
    #: bytes of the budget held for what the read brings, until fill or release
    reserved: int = 0


class ByteLRU:
    """Object bytes by key, least recently used evicted past ``max_bytes``.

    A value larger than ``max_bytes // 4`` is not kept: one huge object must not flush
    everything else.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.opened = OpenedStamps()
        self._data: OrderedDict[str, tuple[Version, bytes]] = OrderedDict()
        self._tickets: dict[str, list[Ticket]] = {}
        self._size = 0
        self._reserved = 0
        self._lock = ranked_lock("byte cache", LEAF)
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        """Bytes cached."""
        return self._size

    @property
    def reserved(self) -> int:
        """Bytes reserved for fetches in flight."""
        return self._reserved

    @property
    def used(self) -> int:
        """Bytes of the budget taken: cached plus reserved (at most ``max_bytes`` while no
        reservation alone exceeds it)."""
        with self._lock:
            return self._size + self._reserved

    def admits(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes // 4

    def get(self, key: str, version: Version = None) -> bytes | None:
        """The cached bytes of ``key`` if they are of ``version`` (None: of any version)."""
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and not fits(entry[0], version):
                self._drop(key)
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return entry[1]

    def holds(self, key: str, version: Version = None) -> bool:
        """Are bytes of ``key`` that fit ``version`` cached? (A peek: no LRU move, no count.)"""
        with self._lock:
            entry = self._data.get(key)
            return entry is not None and fits(entry[0], version)

    def ticket(self, key: str, reserve: int = 0) -> Ticket:
        """Take before reading ``key`` from the store; store the result with :meth:`fill`.
        ``reserve``: the bytes the read will bring; they count against the budget (evicting
        the oldest entries) until :meth:`fill` or :meth:`release` of the ticket, one of which
        the taker must call."""
        ticket = Ticket(key, reserved=max(0, reserve))
        with self._lock:
            self._tickets.setdefault(key, []).append(ticket)
            self._reserved += ticket.reserved
            self._evict()
        return ticket

    def fill(self, ticket: Ticket, version: Version, value: bytes) -> bool:
        """Store what the ticket's read returned, unless a change overtook it; its
        reservation is given back."""
        with self._lock:
            self._end(ticket)
            if ticket.stale:
                return False
            self._store(ticket.key, version, value)
            return True

    def release(self, ticket: Ticket) -> None:
        """The ticket's read brought nothing to store (absent, failed): give its
        reservation back."""
        with self._lock:
            self._end(ticket)

    def _end(self, ticket: Ticket) -> None:
        waiting = self._tickets.get(ticket.key, [])
        if ticket in waiting:
            waiting.remove(ticket)
            if not waiting:
                del self._tickets[ticket.key]
        self._reserved -= ticket.reserved
        ticket.reserved = 0

    def put(self, key: str, version: Version, value: bytes) -> None:
        """The mount's own commit: these are the key's bytes now."""
        with self._lock:
            self._ground(key)
            self._store(key, version, value)
        self.opened.forget(key)

    def _store(self, key: str, version: Version, value: bytes) -> None:
        self._drop(key)
        if not self.admits(len(value)):
            return
        self._data[key] = (version, value)
        self._size += len(value)
        self._evict()

    def _evict(self) -> None:
        while self._data and self._size + self._reserved > self.max_bytes:
            _, (_, evicted) = self._data.popitem(last=False)
            self._size -= len(evicted)

    def _drop(self, key: str) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._size -= len(old[1])

    def _ground(self, key: str) -> None:
        for ticket in self._tickets.pop(key, ()):
            ticket.stale = True

    def invalidate(self, key: str) -> None:
        with self._lock:
            self._ground(key)
            self._drop(key)
        self.opened.forget(key)

    def invalidate_prefix(self, prefix: str) -> int:
        with self._lock:
            for key in [k for k in self._tickets if k.startswith(prefix)]:
                self._ground(key)
            stale = [k for k in self._data if k.startswith(prefix)]
            for key in stale:
                self._drop(key)
        self.opened.forget_prefix(prefix)
        return len(stale)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._tickets):
                self._ground(key)
            self._data.clear()
            self._size = 0
        self.opened.clear()


class Counters:
    """Named integer counters incremented from any thread (``/.n5fs/stats.json``)."""

    def __init__(self, *names: str) -> None:
        self._values = dict.fromkeys(names, 0)
        self._lock = ranked_lock("counters", LEAF)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)
