"""The KvStore contract every driver implements.

Queries answer ``None`` for an absent key (it is the hot path: every lookup, every probe);
commands raise from the error tree. ``set`` is atomic: readers see the old or the new value.
What only some stores can do (local files, conditional writes, ...) is no method here: those
are the protocols of :mod:`n5fs.kvstore.abilities`, and a store's facts its ``traits``.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound, ReadOnly
from n5fs.kvstore.abilities import StoreTraits
from n5fs.kvstore.keys import check_key, check_prefix

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from types import TracebackType

    from typing_extensions import Self

    from n5fs.kvstore.spec import StoreSpec
    from n5fs.kvstore.tempnames import Leftover


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``[start, start+length)``; a negative ``start`` counts from the end.

    ``ByteRange(-22)`` is the last 22 bytes, ``ByteRange(10)`` everything from offset 10.
    A range past the end is clamped (a short or empty read), as a file read would be.
    """

    start: int
    length: int | None = None

    def __post_init__(self) -> None:
        if self.length is not None and self.length < 0:
            raise ValueError(f"negative length in {self!r}")
        if self.start < 0 and self.length is not None:
            raise ValueError(f"a suffix range takes no length: {self!r}")

    def resolve(self, size: int) -> tuple[int, int]:
        """Clamp to an object of ``size`` bytes: return ``(start, stop)``."""
        start = max(size + self.start, 0) if self.start < 0 else min(self.start, size)
        stop = size if self.length is None else min(start + self.length, size)
        return start, stop

    def http_header(self) -> str:
        if self.start < 0:
            return f"bytes={self.start}"
        if self.length is None:
            return f"bytes={self.start}-"
        return f"bytes={self.start}-{self.start + self.length - 1}"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key: str
    size: int
    mtime: float = 0.0
    #: the stored version (an S3 ETag, a counter in memory); None where the store keeps none
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class Versioned:
    """A value and the version it was read at (what
    :meth:`~n5fs.kvstore.abilities.ConditionalWrites.set_if` compares with)."""

    data: bytes
    #: None where the store keeps no versions
    version: str | None


@dataclass(frozen=True, slots=True)
class Listing:
    """One level (or, without a delimiter, all) of what lies under a prefix.

    ``keys`` are full keys; ``prefixes`` are full sub-prefixes ending in the delimiter.
    """

    keys: tuple[KeyInfo, ...] = ()
    prefixes: tuple[str, ...] = ()

    def names(self) -> list[str]:
        return sorted(k.key for k in self.keys)


def slice_bytes(data: bytes, byte_range: ByteRange | None) -> bytes:
    if byte_range is None:
        return data
    start, stop = byte_range.resolve(len(data))
    return data[start:stop]


def group_listing(infos: Iterable[KeyInfo], prefix: str, delimiter: str | None) -> Listing:
    """S3-style grouping of a flat key list: keys below ``prefix`` split at ``delimiter``."""
    keys: list[KeyInfo] = []
    prefixes: set[str] = set()
    for info in infos:
        if not info.key.startswith(prefix):
            continue
        rest = info.key[len(prefix) :]
        cut = rest.find(delimiter) if delimiter else -1
        if cut >= 0:
            prefixes.add(prefix + rest[: cut + len(delimiter or "")])
        else:
            keys.append(info)
    keys.sort(key=lambda k: k.key)
    return Listing(tuple(keys), tuple(sorted(prefixes)))


#: the traits of a store that says nothing else
_PLAIN = StoreTraits()


class KvStore(abc.ABC):
    """Bytes by key. Subclasses implement the abstract methods; the rest have defaults.

    Keys are checked by :func:`check_key` before any backend call: implementations call
    ``self._key(key)`` first thing.
    """

    @property
    def traits(self) -> StoreTraits:
        """What this store is like (:class:`~n5fs.kvstore.abilities.StoreTraits`): a driver
        sets it per class, a wrapper answers its inner store's."""
        return _PLAIN

    def has_ability(self, kind: type) -> bool:
        """Does this store have the optional ability ``kind``, a protocol of
        :mod:`n5fs.kvstore.abilities`? Ask through that module's functions. A driver has it
        when it has the methods; a wrapper overrides this to answer for its inner store."""
        return isinstance(self, kind)

    @property
    @abc.abstractmethod
    def spec(self) -> StoreSpec:
        """The spec that reopens this store (round-trips to JSON and URL)."""

    @abc.abstractmethod
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        """The value (or the requested bytes of it), ``None`` when absent."""

    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` atomically under ``key``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; absent is a no-op (like ``rm -f``)."""

    @abc.abstractmethod
    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        """Keys and sub-prefixes under ``prefix``; without a delimiter, every key below."""

    @abc.abstractmethod
    def stat(self, key: str) -> KeyInfo | None:
        """Size and mtime of ``key``, ``None`` when absent."""

    # -- defaults a driver may override with something faster -------------------------------

    def delete_prefix(self, prefix: str) -> int:
        """Remove every key under ``prefix``; return how many were removed."""
        check_prefix(prefix)
        keys = [k.key for k in self.list(prefix, delimiter=None).keys]
        for key in keys:
            self.delete(key)
        return len(keys)

    def copy(self, src: str, dst: str) -> None:
        """Copy ``src`` to ``dst`` (server-side where the store can)."""
        value = self.get(self._key(src))
        if value is None:
            raise KeyNotFound(src)
        self.set(self._key(dst), value)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (replacing it); copy + delete unless the store can do better.

        Not atomic in general (S3): a crash in between leaves both keys, never neither.
        """
        self.copy(src, dst)
        self.delete(src)

    def rename_prefix(self, src: str, dst: str) -> int:
        """Move every key under ``src`` (a ``"a/"`` prefix) to ``dst``; return how many."""
        check_prefix(src)
        check_prefix(dst)
        keys = [info.key for info in self.list(src, delimiter=None).keys]
        for key in keys:
            self.rename(key, dst + key[len(src) :])
        return len(keys)

    def copy_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        """``copy(src, dst)`` for every pair; network drivers run them in parallel."""
        for src, dst in pairs:
            self.copy(src, dst)

    def delete_many(self, keys: Sequence[str]) -> None:
        """``delete`` every key; network drivers batch them."""
        for key in keys:
            self.delete(key)

    def set_mtime(self, key: str, mtime: float) -> None:
        """Give the stored ``key`` the modification time ``mtime`` (seconds since the epoch),
        which ``stat`` then reports and ``copy``/``rename`` keep; KeyNotFound if absent.
        Stores that keep no times raise NotSupported (the default)."""
        from n5fs.errors import NotSupported

        raise NotSupported(f"{type(self).__name__} keeps no modification times ({key!r})")

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        """``set`` and ``set_mtime`` in one: a store that can carry the time with the value
        overrides this (S3: the time rides the PUT as metadata, where setting it after costs
        a HEAD and a copy of the object: ``cp -a`` sets it before ``close()``). False when
        the store keeps no times (the value is stored either way)."""
        self.set(key, value)
        return self._mtime_kept(key, mtime)

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        """:meth:`put_file` and ``set_mtime`` in one (see :meth:`set_with_mtime`)."""
        self.put_file(key, path)
        return self._mtime_kept(key, mtime)

    def _mtime_kept(self, key: str, mtime: float) -> bool:
        from n5fs.errors import NotSupported

        try:
            self.set_mtime(key, mtime)
        except NotSupported:
            return False
        return True

    def make_prefix(self, prefix: str) -> bool:
        """Persist an empty prefix (a directory) if the store can; False if it cannot."""
        return False

    def remove_prefix(self, prefix: str) -> None:
        """Remove a persisted empty prefix; a no-op where prefixes are not persisted."""

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Store the contents of a local file; drivers stream it where they can."""
        with open(path, "rb") as f:
            self.set(key, f.read())

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Like :meth:`put_file`, but the local file is consumed: a store on the same
        filesystem renames it into place instead of copying it."""
        self.put_file(key, path)
        os.unlink(path)

    def nothing_at(self, key: str) -> bool:
        """True when the store can tell at the cost of a :meth:`stat` that ``key`` is neither
        a key nor a prefix (a lookup's miss then needs no listing of its folder); False when
        it cannot, or when something is there. The default: False (ask the listing)."""
        return False

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Several gets; network drivers run them in parallel."""
        return {key: self.get(key) for key in keys}

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        """Every key below ``prefix``, in key order; drivers that page (S3) fetch a page only
        when the caller gets there, so a caller that stops early stops the listing."""
        yield from self.list(prefix, delimiter=None).keys

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        """What interrupted writers left under ``prefix`` (hidden temp files, incomplete
        uploads): never part of a listing, reported by ``validate``, removed by :meth:`sweep`."""
        return ()

    def remove_leftover(self, leftover: Leftover) -> None:
        """Remove one leftover this store reported."""

    def fault_counters(self) -> dict[str, int]:
        """How often the store met faults it handled (retries, throttling, writes resolved,
        reads resumed): ``/.n5fs/stats.json`` shows them. Stores with no network have none."""
        return {}

    def sweep(self, prefix: str = "") -> tuple[Leftover, ...]:
        """Remove the leftovers of writers that are gone; return what was removed."""
        removed = []
        for leftover in self.leftovers(prefix):
            if leftover.dead:
                self.remove_leftover(leftover)
                removed.append(leftover)
        return tuple(removed)

    def flush(self) -> None:
        """Make buffered changes durable (the zip adapter rewrites its archive here)."""

    def refresh(self) -> None:
        """Forget anything cached about the backend (it was changed from outside)."""

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.to_url()!r})"

    # -- helpers for drivers -----------------------------------------------------------------

    @staticmethod
    def _key(key: str) -> str:
        return check_key(key)

    def check_writable(self, key: str) -> None:
        """Raise what a write of ``key`` would be refused with before any I/O (a read-only
        store, a name the store keeps for itself): a caller that accepts a write now and
        stores it later asks first."""
        self._check_writable(self._key(key))

    def _check_writable(self, key: str) -> None:
        if not self.traits.writable:
            raise ReadOnly(f"read-only store: cannot change {key!r}")
