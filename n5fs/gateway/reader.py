"""Object bytes for reads: small objects whole, through a byte-bounded LRU (chunks are read
whole by every reader anyway); large objects by range, with a per-handle read-ahead window
that doubles on sequential access (the kernel asks in 128 KiB pieces; S3 wants MiBs).

Concurrency: a handle's read-ahead state is one immutable :class:`ReadWindow`; ``read`` takes
the current window and returns the next one, which the caller stores with one assignment, so
two reads on one handle each see a consistent window (never old bytes at a new offset). Cached
bytes are tied to the object's version, and a read that began before a commit cannot store
its bytes after it (:class:`~n5fs.gateway.cache.ByteLRU` tickets). Counters are locked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound
from n5fs.gateway.cache import ByteLRU, Counters, Version
from n5fs.kvstore.base import ByteRange

if TYPE_CHECKING:
    from n5fs.kvstore.base import KvStore

_FIRST_READAHEAD = 1 << 20


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
        self, store: KvStore, *, cache_bytes: int, small_object: int, readahead: int
    ) -> None:
        self.store = store
        self.cache = ByteLRU(cache_bytes)
        self.small_object = small_object
        self.max_readahead = readahead
        self.counters = Counters("store_reads", "bytes_out")

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

    def whole(self, key: str, version: Version = None) -> bytes | None:
        """The whole object (cached when it fits), None when absent."""
        data = self.cache.get(key, version)
        if data is None:
            ticket = self.cache.ticket(key)
            data = self._fetch(key)
            if data is not None:
                self.cache.fill(ticket, version, data)
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
        if total is None or total <= self.small_object:
            data = self.whole(key, version)
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
        data = self._fetch(key, ByteRange(offset, max(size, readahead)))
        if data is None:
            raise KeyNotFound(f"/{key} vanished from the store")
        chunk = data[:size]
        return chunk, ReadWindow(offset, data, offset + len(chunk), readahead, version)


def _moved(window: ReadWindow, last_end: int) -> ReadWindow:
    return ReadWindow(window.start, window.data, last_end, window.readahead, window.version)
