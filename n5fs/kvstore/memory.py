"""A dict store: the reference behaviour, the demo store, and the gateway tests' backend.

Each key holds its value and modification time (``set`` stamps the time; ``set_mtime``
changes it; ``copy`` and ``rename`` keep it). One lock guards changes; readers take the
immutable ``(value, mtime)`` tuple a key holds, without the lock.

Versions (for :meth:`MemoryStore.set_if`, the reference of S3's ``If-Match``): every entry
tuple a key is given gets a fresh number from a per-store counter the first time its version
is asked for, so the version changes on every ``set`` and ``copy`` of a key, and also when a
test seeds ``_data`` directly (the seeded tuple is another object). ``set_mtime`` keeps the
version (S3 keeps the ETag of an object copied onto itself). ``_versions`` maps a key to the
entry (by identity) its version was given to; it is read and changed under the lock only, so
``stat`` and ``get_versioned`` take the lock.
"""

from __future__ import annotations

import itertools
import threading
import time

from n5fs.errors import KeyNotFound, VersionConflict
from n5fs.kvstore.abilities import StoreTraits
from n5fs.kvstore.base import (
    ByteRange,
    KeyInfo,
    KvStore,
    Listing,
    Versioned,
    group_listing,
    slice_bytes,
)
from n5fs.kvstore.keys import check_prefix
from n5fs.kvstore.spec import MemorySpec

_Entry = tuple[bytes, float]


class MemoryStore(KvStore):
    """Values live in a dict under ``path``; ``set`` copies, so callers may reuse buffers.
    Has :class:`~n5fs.kvstore.abilities.ConditionalWrites`."""

    spec_type = MemorySpec
    #: every ``list`` scans every key: one walk of an array beats one scan per folder; it
    #: stands for S3 in tests, versions and all (:class:`ConditionalWrites`)
    traits = StoreTraits(flat_listing_preferred=True, shared_versions=True)

    def __init__(self, path: str = "") -> None:
        self._spec = MemorySpec(path=path)
        self._data: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        #: key -> (the entry its version belongs to, the version); under ``_lock``
        self._versions: dict[str, tuple[_Entry, str]] = {}
        self._counter = itertools.count(1)

    @classmethod
    def from_spec(cls, spec: MemorySpec) -> MemoryStore:
        return cls(spec.path)

    @property
    def spec(self) -> MemorySpec:
        return self._spec

    def _version_locked(self, key: str, entry: _Entry) -> str:
        """The version of ``entry`` (what ``key`` holds now); a new one for a new entry."""
        known = self._versions.get(key)
        if known is not None and known[0] is entry:
            return known[1]
        version = str(next(self._counter))
        self._versions[key] = (entry, version)
        return version

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        entry = self._data.get(self._key(key))
        return None if entry is None else slice_bytes(entry[0], byte_range)

    def get_versioned(self, key: str) -> Versioned | None:
        self._key(key)
        with self._lock:
            entry = self._data.get(key)
            return None if entry is None else Versioned(entry[0], self._version_locked(key, entry))

    def set(self, key: str, value: bytes) -> None:
        self._check_writable(self._key(key))
        entry = (bytes(value), time.time())
        with self._lock:
            self._data[key] = entry

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        """Check and store under the lock: no other change of the store comes between."""
        self._check_writable(self._key(key))
        entry = (bytes(value), time.time())
        with self._lock:
            current = self._data.get(key)
            now = None if current is None else self._version_locked(key, current)
            if now != version:
                found = "absent" if now is None else f"at version {now}"
                wanted = "absent" if version is None else f"at version {version}"
                raise VersionConflict(
                    f"conditional write of {key!r} refused: expected it {wanted}, it is {found}"
                )
            self._data[key] = entry
            return self._version_locked(key, entry)

    def probe_conditional_writes(self) -> str | None:
        """None: :meth:`set_if` checks and stores under one lock."""
        return None

    def delete(self, key: str) -> None:
        self._check_writable(self._key(key))
        with self._lock:
            self._data.pop(key, None)
            self._versions.pop(key, None)

    def stat(self, key: str) -> KeyInfo | None:
        self._key(key)
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            return KeyInfo(key, len(entry[0]), entry[1], self._version_locked(key, entry))

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        check_prefix(prefix)
        with self._lock:
            infos = [
                KeyInfo(k, len(entry[0]), entry[1], self._version_locked(k, entry))
                for k, entry in self._data.items()
                if k.startswith(prefix)
            ]
        return group_listing(infos, prefix, delimiter)

    def set_mtime(self, key: str, mtime: float) -> None:
        """A new time, the same version (S3 keeps an object's ETag when it sets its time)."""
        self._check_writable(self._key(key))
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                raise KeyNotFound(f"cannot set the time of {key!r}: absent")
            version = self._version_locked(key, entry)
            changed = (entry[0], float(mtime))
            self._data[key] = changed
            self._versions[key] = (changed, version)

    def copy(self, src: str, dst: str) -> None:
        """The value and its time (the bytes are immutable: shared, not copied); ``dst``
        gets a new version."""
        self._key(src)
        self._check_writable(self._key(dst))
        with self._lock:
            entry = self._data.get(src)
            if entry is None:
                raise KeyNotFound(src)
            if dst != src:
                self._data[dst] = (entry[0], entry[1])
