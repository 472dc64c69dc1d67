"""Object bytes for reads: small objects whole, through a byte-bounded LRU (chunks are read
whole by every reader anyway); large objects by range, with a per-handle read-ahead window
that doubles on sequential access (the kernel asks in 128 KiB pieces; S3 wants MiBs) and is
fetched as several ranges at once on a bounded pool (one GET stream is latency-bound on S3).

A whole object is fetched once however many ask for it, and a reader walking a folder's
objects in order (listing or grid order, and on into the next folders) gets the next ones
fetched ahead into the same LRU, on the same pool, as many at once as the store's latency over
the reader's pace asks, within bounds (:mod:`n5fs.gateway.read.prefetch`; the gateway tells
:meth:`ObjectReader.follow` where folder listings come from). Prefetched bytes count against
``cache_bytes`` like any other.

Where the store keeps a key in a local file (:meth:`~n5fs.kvstore.abilities.LocalFiles.local_path`:
the file store), a read-only handle opens that file once and every read is one ``pread`` on
its descriptor (:class:`LocalFile`): no Python byte cache on top of the page cache that holds
the file already, no listing lookup per 128 KiB piece. The descriptor keeps the inode it
opened, so a commit that renames a new file over the key (or an unlink) leaves an open reader
with the old bytes to its end, as on a local filesystem; the next open reads the new ones.

What the kernel keeps of a file's pages at open (:class:`PageCache`) is decided here too, from
the file's stamp at open and the one remembered from its previous open
(:class:`~n5fs.gateway.read.byte_cache.OpenedStamps`).

Memory: the byte cache's budget (``cache_bytes``) counts the whole objects being fetched as well
as those cached (:class:`~n5fs.gateway.read.byte_cache.ByteLRU` reservations). For that budget to be the
process's memory, a freed object buffer must go back to the system: glibc's malloc serves a
request of at least its *mmap threshold* with a mapping of its own (unmapped at free), but
raises that threshold to the size of every such buffer freed (up to 32 MiB), after which 4 MiB
chunk buffers come from the heaps of the threads' arenas, where a freed one stays resident
unless it sits at a heap's top. Cached buffers live long and transient ones come and go between
them, in as many arenas as threads, so the heaps fragment: on S3 with a cache budget, the
daemon's peak RSS rose well past its start plus the budget and stayed there after the reads
(``MALLOC_ARENA_MAX=1`` narrowed the gap without closing it). With the threshold fixed at
2 MiB (:func:`~n5fs.malloc.map_large_buffers`, done once per process when a reader is built)
RSS after the reads is start + budget (1 MiB gave the same). The price: a buffer of 2 MiB or
more is a fresh mapping, its pages faulted in and zeroed by the kernel instead of reused from a
heap (CPU time per 4 MiB buffer, which the full check of a large block at commit pays too).
Buffers below it stay on the heap: the kernel's 128 KiB reads, and the 1 MiB pieces a writer
hands over, which staging keeps by reference (at 1 MiB each of those was a mapping of its own,
and a ``cp -r`` of raw 4 MiB chunks cost the daemon more CPU). The figures are in
``docs/performance.md``. A user's own ``MALLOC_MMAP_THRESHOLD_`` or
``glibc.malloc.mmap_threshold`` tunable wins.

Concurrency: a handle's read-ahead state is one immutable :class:`ReadWindow`; ``read`` takes
the current window and returns the next one, which the caller stores with one assignment, so
two reads on one handle each see a consistent window (never old bytes at a new offset). Cached
bytes are tied to the object's version, and a read that began before a commit cannot store
its bytes after it (:class:`~n5fs.gateway.read.byte_cache.ByteLRU` tickets). Counters are locked.
"""

from __future__ import annotations

import enum
import os
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound
from n5fs.gateway.read.byte_cache import ByteLRU, Counters, Stamp, Version
from n5fs.gateway.read.prefetch import Flights, Pace, Prefetcher
from n5fs.kvstore.abilities import local_files
from n5fs.kvstore.base import ByteRange
from n5fs.kvstore.keys import basename, folder_of
from n5fs.malloc import map_large_buffers
from n5fs.workers import Workers

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from concurrent.futures import Future

    from n5fs.kvstore.abilities import LocalFiles
    from n5fs.kvstore.base import KeyInfo, KvStore

_FIRST_READAHEAD = 1 << 20
#: a read-ahead window is fetched as ranges of at least this many bytes, at most _PARTS of them
_MIN_PART = 1 << 20
_PARTS = 4
#: objects fetched ahead of a reader with no history, and the least ahead of one that follows
#: an order (more as the store's latency over the reader's pace asks: :class:`Pace`)
AHEAD_OBJECTS = 4
#: objects fetched ahead at once for the whole mount: deep enough for a reader that takes a
#: millisecond an object on a store that takes some 50 ms a request
AHEAD_MAX = 64
#: the read pool (:class:`~n5fs.workers.Workers`): its threads' name, and how many fetches
#: run on it at once (whole objects ahead, ranges of large objects beside them); its threads
#: start one per fetch that finds none idle, and wait on the network, not on the CPU
READ_POOL = "n5fs-read"
READ_WORKERS = AHEAD_MAX + 2 * _PARTS
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


class PageCache(enum.Enum):
    """What the kernel does with the pages it caches of a file when a handle opens it."""

    #: drop them (libfuse's default): the file may have changed since they were read
    DROP = "drop"
    #: keep them (``keep_cache``): they hold the very version this open reads
    KEEP = "keep"
    #: read around them (``direct_io``): another open handle reads another version (an older
    #: inode, replaced on disk) and may fill them with its bytes while this one reads
    BYPASS = "bypass"


@dataclass(frozen=True, slots=True)
class LocalFile:
    """A read-only handle's own descriptor of the stored file, and the stamp it had at open
    (inode, size, mtime_ns: a file renamed over the key is another inode)."""

    fd: int
    stamp: Stamp
    size: int

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class ReadWindow:
    """One handle's read-ahead state: the bytes last fetched and where the reader is."""

    start: int = 0
    data: bytes = b""
    last_end: int = -1
    readahead: int = 0
    version: Version = None

    def covers(self, offset: int, size: int, version: Version) -> bool:
        return (
            self.version == version
            and self.start <= offset
            and offset + size <= self.start + len(self.data)
        )


class ObjectReader:
    def __init__(
        self,
        store: KvStore,
        *,
        cache_bytes: int,
        small_object: int,
        readahead: int,
        ahead_objects: int = AHEAD_OBJECTS,
        ahead_max: int = AHEAD_MAX,
        workers: Workers | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``workers``: whose threads read ahead (a gateway's); None: a :class:`Workers` of
        the reader's own, shut down by :meth:`close`. ``clock`` times fetches and readers for
        the read-ahead's depth (:class:`~n5fs.gateway.read.prefetch.Pace`)."""
        map_large_buffers()
        self._own_workers = workers is None
        self.workers = Workers() if workers is None else workers
        self.store = store
        #: the store's local files (:class:`~n5fs.kvstore.abilities.LocalFiles`), if it has them
        self.local = local_files(store)
        self.cache = ByteLRU(cache_bytes)
        self.small_object = small_object
        self.max_readahead = readahead
        self.counters = Counters("store_reads", "bytes_out")
        ahead_max = max(ahead_max, ahead_objects)
        self.pace = Pace(clock, ahead_objects, ahead_max)
        self.flights = Flights(self.cache, self._fetch, self.pace)
        self.prefetcher = Prefetcher(
            self.flights,
            objects=ahead_objects,
            max_objects=ahead_max,
            max_bytes=min(cache_bytes // 4, ahead_max * min(small_object, 8 << 20)),
            small_object=small_object,
            pool=self.workers.pool(READ_POOL, max(READ_WORKERS, ahead_max), drain=True),
            pace=self.pace,
        )

    def follow(
        self,
        listing: Callable[[str], Mapping[str, KeyInfo] | None],
        folders: Callable[[str], Collection[str] | None] | None = None,
    ) -> None:
        """Read ahead across objects: ``listing(folder)`` (``"a/b/"``, ``""`` for the root) is
        the folder's files by name as the namespace knows them, ``folders(folder)`` its
        subfolders' names (both cached: they are asked on reads; without ``folders`` the
        read-ahead stops at the end of a folder)."""
        self.prefetcher.listing = listing
        self.prefetcher.folders = folders

    def close(self) -> None:
        """Stop reading ahead. The fetches in flight land before the read pool stops: at
        once here when the reader owns its workers, else at their owner's shutdown."""
        self.prefetcher.close()
        if self._own_workers:
            self.workers.shutdown()

    @property
    def store_reads(self) -> int:
        return self.counters["store_reads"]

    @property
    def bytes_out(self) -> int:
        return self.counters["bytes_out"]

    def _fetch(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        data = self.store.get(key, byte_range)
        self.counters.add("store_reads")
        if data is not None:
            self.counters.add("bytes_out", len(data))
        return data

    # -- local files ---------------------------------------------------------------------------

    def open_local(self, key: str) -> LocalFile | None:
        """A descriptor of ``key``'s local file, None where the store has none (or it is gone:
        the reader then asks the store, which says what is true now).

        The file is opened below its checked folder with ``O_NOFOLLOW`` (one ``lstat`` of the
        folder, no ``lstat`` of the file first: every read-only open passes here); a link at
        the name, or on the folder's path, goes to :meth:`LocalFiles.local_path`, which decides
        (the file store follows a link at the name to a file inside the root, never one on
        the folder's path). ``O_NONBLOCK``: a FIFO planted at a chunk's name is refused by
        the ``fstat`` below instead of blocking a FUSE thread in ``open``."""
        files = self.local
        if files is None:
            return None
        fd = self._open_below_folder(files, key)
        if fd is None:
            path = files.local_path(key)
            if path is None:
                return None
            try:
                fd = os.open(path, _OPEN_FLAGS)
            except OSError:
                return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        self.counters.add("store_reads")
        return LocalFile(fd, (st.st_ino, st.st_size, st.st_mtime_ns), st.st_size)

    def _open_below_folder(self, files: LocalFiles, key: str) -> int | None:
        """``key`` opened relative to its checked folder without following a link at its
        name; None where that cannot say (no local folder, a link, a miss: the caller asks
        :meth:`LocalFiles.local_path`, which answers a miss with None too)."""
        folder = files.local_folder(folder_of(key))
        if folder is None:
            return None
        try:
            return os.open(f"{folder}{os.sep}{basename(key)}", _OPEN_FLAGS | _NO_FOLLOW)
        except OSError:
            return None

    def read_local(self, local: LocalFile, size: int, offset: int) -> bytes:
        data = os.pread(local.fd, size, offset)
        self.counters.add("bytes_out", len(data))
        return data

    def count_local(self, local: LocalFile, size: int, offset: int) -> None:
        """A read of ``local`` that someone else performs (libfuse): count what it returns,
        the bytes of the file at open from ``offset`` on, at most ``size``."""
        self.counters.add("bytes_out", max(0, min(size, local.size - offset)))

    def page_cache(self, key: str, stamp: Stamp, *, mixed: bool = False) -> PageCache:
        """What the kernel does with its pages of ``key`` at an open that reads ``stamp``;
        ``mixed``: another open handle reads another version of the key."""
        if mixed:
            self.cache.opened.forget(key)  # the pages may hold its bytes: drop them later
            return PageCache.BYPASS
        return PageCache.KEEP if self.cache.opened.opened(key, stamp) else PageCache.DROP

    def forget_pages(self, key: str) -> None:
        """A handle that may write ``key`` is opening: its next reader drops the pages."""
        self.cache.opened.forget(key)

    # -- store reads ---------------------------------------------------------------------------

    def whole(self, key: str, version: Version = None) -> bytes | None:
        """The whole object (cached when it fits), None when absent; one GET however many
        ask at once (a read of an object being fetched ahead waits for that fetch)."""
        data = self.cache.get(key, version)
        if data is None:
            data = self.flights.load(key, version)
        return data

    def read(
        self,
        window: ReadWindow,
        key: str,
        size: int,
        offset: int,
        total: int | None,
        version: Version = None,
    ) -> tuple[bytes, ReadWindow]:
        """``size`` bytes at ``offset`` of an object of ``total`` bytes (None: unknown), and
        the handle's next window."""
        if total is None or (total <= self.small_object and self.cache.admits(total)):
            # (one the cache would not keep is read by range: fetched whole, it was fetched
            # whole again for every 128 KiB the kernel asked: many times a ranged read's time)
            if offset == 0:  # a reader starts this object: it may be walking the folder
                self.prefetcher.read_whole(key)
            data = self.whole(key, version)
            if offset == 0:
                self.pace.served()
            if data is None:
                raise KeyNotFound(f"/{key} vanished from the store")
            return data[offset : offset + size], window
        if window.covers(offset, size, version):
            start = offset - window.start
            chunk = window.data[start : start + size]
            return chunk, _moved(window, offset + len(chunk))
        sequential = offset == window.last_end or offset == 0  # from the start: a cat/cp
        readahead = (
            min(max(window.readahead * 2, _FIRST_READAHEAD), self.max_readahead)
            if sequential
            else 0
        )
        data = self._ranges(key, offset, max(size, readahead), total)
        if data is None:
            raise KeyNotFound(f"/{key} vanished from the store")
        chunk = data[:size]
        return chunk, ReadWindow(offset, data, offset + len(chunk), readahead, version)

    def _ranges(self, key: str, offset: int, length: int, total: int) -> bytes | None:
        """``length`` bytes at ``offset`` of an object of ``total``: one GET, or (a window of
        several MiB) several ranges at once on the read pool, the first on this thread."""
        inside = min(length, total - offset)
        parts = max(1, min(_PARTS, inside // _MIN_PART))
        pool = self.prefetcher.pool() if parts > 1 else None
        if pool is None:
            return self._fetch(key, ByteRange(offset, inside if inside > 0 else length))
        step = -(-inside // parts)
        ranges = [
            ByteRange(at, min(step, offset + inside - at))
            for at in range(offset, offset + inside, step)
        ]
        rest: list[Future[bytes | None]] = [pool.submit(self._fetch, key, r) for r in ranges[1:]]
        try:
            first = self._fetch(key, ranges[0])
        finally:
            pieces = [future.result() for future in rest]
        out = bytearray()
        for asked, piece in zip(ranges, [first, *pieces], strict=True):
            if piece is None:
                return None
            out += piece
            if len(piece) < (asked.length or 0):  # the object shrank meanwhile
                break
        return bytes(out)


def _moved(window: ReadWindow, last_end: int) -> ReadWindow:
    return ReadWindow(window.start, window.data, last_end, window.readahead, window.version)
