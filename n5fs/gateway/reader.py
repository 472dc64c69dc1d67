"""Object bytes for reads: small objects whole, through a byte-bounded LRU (chunks are read
whole by every reader anyway); large objects by range, with a per-handle read-ahead window
that doubles on sequential access (the kernel asks in 128 KiB pieces; S3 wants MiBs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound
from n5fs.gateway.cache import ByteLRU
from n5fs.kvstore.base import ByteRange

if TYPE_CHECKING:
    from n5fs.kvstore.base import KvStore

_FIRST_READAHEAD = 1 << 20


@dataclass(eq=False)
class ReadWindow:
    """One handle's read-ahead state: the bytes last fetched and where the reader is."""

    start: int = 0
    data: bytes = b""
    last_end: int = -1
    readahead: int = 0

    def covers(self, offset: int, size: int) -> bool:
        return self.start <= offset and offset + size <= self.start + len(self.data)


class ObjectReader:
    def __init__(
        self, store: KvStore, *, cache_bytes: int, small_object: int, readahead: int
    ) -> None:
        self.store = store
        self.cache = ByteLRU(cache_bytes)
        self.small_object = small_object
        self.max_readahead = readahead
        self.store_reads = 0
        self.bytes_out = 0

    def whole(self, key: str) -> bytes | None:
        """The whole object (cached when it fits), None when absent."""
        data = self.cache.get(key)
        if data is None:
            data = self.store.get(key)
            self.store_reads += 1
            if data is not None:
                self.bytes_out += len(data)
                self.cache.put(key, data)
        return data

    def read(
        self, window: ReadWindow, key: str, size: int, offset: int, total: int | None
    ) -> bytes:
        """``size`` bytes at ``offset`` of an object of ``total`` bytes (None: unknown)."""
        if total is None or total <= self.small_object:
            data = self.whole(key)
            if data is None:
                raise KeyNotFound(f"/{key} vanished from the store")
            return data[offset : offset + size]
        if window.covers(offset, size):
            start = offset - window.start
            chunk = window.data[start : start + size]
        else:
            sequential = offset == window.last_end or offset == 0  # from the start: a cat/cp
            window.readahead = (
                min(max(window.readahead * 2, _FIRST_READAHEAD), self.max_readahead)
                if sequential
                else 0
            )
            data = self.store.get(key, ByteRange(offset, max(size, window.readahead)))
            self.store_reads += 1
            if data is None:
                raise KeyNotFound(f"/{key} vanished from the store")
            self.bytes_out += len(data)
            window.start, window.data = offset, data
            chunk = data[:size]
        window.last_end = offset + len(chunk)
        return chunk
