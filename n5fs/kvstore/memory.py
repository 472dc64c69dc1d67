"""A dict store: the reference behaviour, the demo store, and the gateway tests' backend.

Each key holds its value and modification time (``set`` stamps the time; ``set_mtime``
changes it; ``copy`` and ``rename`` keep it). One lock guards changes; readers take the
immutable ``(value, mtime)`` tuple a key holds, without the lock.
"""

from __future__ import annotations

import threading
import time

from n5fs.errors import KeyNotFound
from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, group_listing, slice_bytes
from n5fs.kvstore.keys import check_prefix
from n5fs.kvstore.spec import MemorySpec


class MemoryStore(KvStore):
    """Values live in a dict under ``path``; ``set`` copies, so callers may reuse buffers."""

    spec_type = MemorySpec
    #: every ``list`` scans every key: one walk of an array beats one scan per folder
    flat_listing_preferred = True

    def __init__(self, path: str = "") -> None:
        self._spec = MemorySpec(path=path)
        self._data: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: MemorySpec) -> MemoryStore:
        return cls(spec.path)

    @property
    def spec(self) -> MemorySpec:
        return self._spec

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        entry = self._data.get(self._key(key))
        return None if entry is None else slice_bytes(entry[0], byte_range)

    def set(self, key: str, value: bytes) -> None:
        self._check_writable(self._key(key))
        entry = (bytes(value), time.time())
        with self._lock:
            self._data[key] = entry

    def delete(self, key: str) -> None:
        self._check_writable(self._key(key))
        with self._lock:
            self._data.pop(key, None)

    def stat(self, key: str) -> KeyInfo | None:
        entry = self._data.get(self._key(key))
        return None if entry is None else KeyInfo(key, len(entry[0]), entry[1])

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        check_prefix(prefix)
        with self._lock:
            items = list(self._data.items())
        infos = (KeyInfo(k, len(v), t) for k, (v, t) in items if k.startswith(prefix))
        return group_listing(infos, prefix, delimiter)

    def set_mtime(self, key: str, mtime: float) -> None:
        self._check_writable(self._key(key))
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                raise KeyNotFound(f"cannot set the time of {key!r}: absent")
            self._data[key] = (entry[0], float(mtime))

    def copy(self, src: str, dst: str) -> None:
        """The value and its time (the bytes are immutable: shared, not copied)."""
        self._key(src)
        self._check_writable(self._key(dst))
        with self._lock:
            entry = self._data.get(src)
            if entry is None:
                raise KeyNotFound(src)
            self._data[dst] = entry
