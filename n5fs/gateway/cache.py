"""Bounded caches with an injected clock: no test sleeps, no cache grows without bound.

``TTLCache`` holds answers (listings, stats) for ``ttl`` seconds, negative ones included;
``ByteLRU`` holds object bytes up to a byte budget. Both are invalidated by prefix on every
commit the mount makes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

Clock = Callable[[], float]


class TTLCache(Generic[V]):
    """str-keyed answers that expire ``ttl`` seconds after they were put; LRU past ``max_entries``."""

    def __init__(
        self, ttl: float, max_entries: int = 100_000, clock: Clock = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> V | None:
        now = self._clock()
        with self._lock:
            entry = self._data.get(key)
            if entry is None or now - entry[0] >= self.ttl:
                if entry is not None:
                    del self._data[key]
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._data[key] = (self._clock(), value)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def update(self, key: str, change: Callable[[V], None]) -> bool:
        """Apply ``change`` to a live entry in place (keeps its age); False if absent."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None or self._clock() - entry[0] >= self.ttl:
                return False
            change(entry[1])
            return True

    def invalidate(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def invalidate_prefix(self, prefix: str) -> int:
        with self._lock:
            stale = [k for k in self._data if k.startswith(prefix)]
            for k in stale:
                del self._data[k]
            return len(stale)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class ByteLRU:
    """Object bytes by key, least recently used evicted past ``max_bytes``.

    A value larger than ``max_bytes // 4`` is not kept: one huge object must not flush
    everything else.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        return self._size

    def admits(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes // 4

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= len(old)
            if not self.admits(len(value)):
                return
            self._data[key] = value
            self._size += len(value)
            while self._size > self.max_bytes:
                _, evicted = self._data.popitem(last=False)
                self._size -= len(evicted)

    def invalidate(self, key: str) -> None:
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= len(old)

    def invalidate_prefix(self, prefix: str) -> int:
        with self._lock:
            stale = [k for k in self._data if k.startswith(prefix)]
            for k in stale:
                self._size -= len(self._data.pop(k))
            return len(stale)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._size = 0
