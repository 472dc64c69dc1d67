"""Cross-cutting behaviour as stores that wrap a store (not as flags inside drivers).

A wrapper is what it wraps, less what it changes: its ``traits`` are its inner store's (a
read-only wrapper's are not writable), and it has an ability of :mod:`n5fs.kvstore.abilities`
only where its inner store has it and it passes that ability on
(:attr:`ForwardingStore.passes_on`). It carries the methods of every ability it may pass on,
so ask for one through that module's functions, never by ``isinstance``. Wrappers hold no
state of their own: no locks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from n5fs.errors import NotSupported, ReadOnly
from n5fs.kvstore.abilities import (
    ConditionalWrites,
    ListedTimes,
    LocalFiles,
    NameListings,
    SettableDurability,
    conditional_writes,
    listed_times,
    local_files,
    name_listings,
    settable_durability,
)
from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing
from n5fs.kvstore.keys import check_key, check_prefix

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Iterator, Sequence

    from n5fs.kvstore.abilities import Durability, StoreTraits
    from n5fs.kvstore.base import Versioned
    from n5fs.kvstore.spec import StoreSpec
    from n5fs.kvstore.tempnames import Leftover


class ForwardingStore(KvStore):
    """Passes every call to ``inner``; subclasses override what they change."""

    def __init__(self, inner: KvStore) -> None:
        self.inner = inner

    @property
    def spec(self) -> StoreSpec:
        return self.inner.spec

    #: the abilities of the inner store this wrapper passes on (:mod:`n5fs.kvstore.abilities`):
    #: it has the methods of each, which forward, and has the ability only where the inner
    #: store has it. Not :class:`PartWrites`: a subclass that changes ``set`` (a double that
    #: counts or fails writes) would be gone around; a wrapper writes a value whole. A
    #: subclass that changes what ``list`` shows (or fails it) leaves :class:`NameListings` out.
    passes_on: ClassVar[frozenset[type]] = frozenset(
        {LocalFiles, ConditionalWrites, SettableDurability, ListedTimes, NameListings}
    )

    def has_ability(self, kind: type) -> bool:
        return kind in self.passes_on and isinstance(self, kind) and self.inner.has_ability(kind)

    @property
    def traits(self) -> StoreTraits:
        return self.inner.traits

    @property
    def root(self) -> Path | None:
        """The local directory under the inner store (a :class:`FileStore`'s), else None: the
        gateway's ``statfs`` reports that filesystem's numbers, wrapped or not."""
        root = getattr(self.inner, "root", None)
        return root if isinstance(root, Path) else None

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.inner.get(key, byte_range)

    def set(self, key: str, value: bytes) -> None:
        self.inner.set(key, value)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        return self.inner.list(prefix, delimiter)

    def stat(self, key: str) -> KeyInfo | None:
        return self.inner.stat(key)

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        return self.inner.walk(prefix)

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(prefix)

    def copy(self, src: str, dst: str) -> None:
        self.inner.copy(src, dst)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self.inner.put_file(key, path)

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self.inner.move_file(key, path)

    def copy_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        self.inner.copy_many(pairs)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def rename_prefix(self, src: str, dst: str) -> int:
        return self.inner.rename_prefix(src, dst)

    def make_prefix(self, prefix: str) -> bool:
        return self.inner.make_prefix(prefix)

    def remove_prefix(self, prefix: str) -> None:
        self.inner.remove_prefix(prefix)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return self.inner.get_many(keys)

    # -- abilities passed on (see :attr:`passes_on`) ------------------------------------------

    def local_path(self, key: str) -> str | None:
        files = local_files(self.inner)
        return None if files is None else files.local_path(key)

    def local_folder(self, prefix: str) -> str | None:
        files = local_files(self.inner)
        return None if files is None else files.local_folder(prefix)

    def list_names(self, prefix: str) -> tuple[Sequence[bytes], Sequence[bytes]]:
        names = name_listings(self.inner)
        if names is None:
            raise NotSupported(f"{type(self.inner).__name__} lists no names alone")
        return names.list_names(prefix)

    def get_versioned(self, key: str) -> Versioned | None:
        return self._conditional().get_versioned(key)

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        return self._conditional().set_if(key, value, version=version)

    def probe_conditional_writes(self) -> str | None:
        writes = conditional_writes(self.inner)
        if writes is None:
            return f"{type(self.inner).__name__} has no conditional writes"
        return writes.probe_conditional_writes()

    def _conditional(self) -> ConditionalWrites:
        writes = conditional_writes(self.inner)
        if writes is None:
            raise NotSupported(f"{type(self.inner).__name__} has no conditional writes")
        return writes

    def show_kept_times(self, on: bool) -> None:
        inner = listed_times(self.inner)
        if inner is None:
            raise NotSupported(f"{type(self.inner).__name__} lists no kept times")
        inner.show_kept_times(on)

    def set_durability(self, durability: Durability) -> None:
        inner = settable_durability(self.inner)
        if inner is None:
            raise NotSupported(f"{type(self.inner).__name__} has no durability to set")
        inner.set_durability(durability)

    # -- the rest of the contract --------------------------------------------------------------

    def nothing_at(self, key: str) -> bool:
        return self.inner.nothing_at(key)

    def set_mtime(self, key: str, mtime: float) -> None:
        self.inner.set_mtime(key, mtime)

    def check_writable(self, key: str) -> None:
        self.inner.check_writable(key)

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        return self.inner.set_with_mtime(key, value, mtime)

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        return self.inner.put_file_with_mtime(key, path, mtime)

    def fault_counters(self) -> dict[str, int]:
        return self.inner.fault_counters()

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        return self.inner.leftovers(prefix)

    def remove_leftover(self, leftover: Leftover) -> None:
        self.inner.remove_leftover(leftover)

    def flush(self) -> None:
        self.inner.flush()

    def refresh(self) -> None:
        self.inner.refresh()

    def close(self) -> None:
        self.inner.close()


class ReadOnlyStore(ForwardingStore):
    """Every mutation raises :class:`ReadOnly` (EROFS); reads pass through."""

    def __init__(self, inner: KvStore) -> None:
        super().__init__(inner)
        self._traits = dataclasses.replace(inner.traits, writable=False)

    @property
    def traits(self) -> StoreTraits:
        """The inner store's, not writable (made once: lookups ask on every call)."""
        return self._traits

    def set(self, key: str, value: bytes) -> None:
        raise ReadOnly(f"read-only store: cannot write {check_key(key)!r}")

    def delete(self, key: str) -> None:
        raise ReadOnly(f"read-only store: cannot delete {check_key(key)!r}")

    def delete_prefix(self, prefix: str) -> int:
        raise ReadOnly(f"read-only store: cannot delete {check_prefix(prefix)!r}")

    def copy(self, src: str, dst: str) -> None:
        raise ReadOnly(f"read-only store: cannot write {check_key(dst)!r}")

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        raise ReadOnly(f"read-only store: cannot write {check_key(key)!r}")

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        raise ReadOnly(f"read-only store: cannot write {check_key(key)!r}")

    def copy_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        if pairs:
            raise ReadOnly(f"read-only store: cannot write {check_key(pairs[0][1])!r}")

    def delete_many(self, keys: Sequence[str]) -> None:
        if keys:
            raise ReadOnly(f"read-only store: cannot delete {check_key(keys[0])!r}")

    def rename(self, src: str, dst: str) -> None:
        raise ReadOnly(f"read-only store: cannot move {check_key(src)!r}")

    def rename_prefix(self, src: str, dst: str) -> int:
        raise ReadOnly(f"read-only store: cannot move {src!r}")

    def make_prefix(self, prefix: str) -> bool:
        raise ReadOnly(f"read-only store: cannot make {prefix!r}")

    def remove_prefix(self, prefix: str) -> None:
        raise ReadOnly(f"read-only store: cannot remove {prefix!r}")

    def set_mtime(self, key: str, mtime: float) -> None:
        raise ReadOnly(f"read-only store: cannot change the time of {check_key(key)!r}")

    def check_writable(self, key: str) -> None:
        raise ReadOnly(f"read-only store: cannot change {check_key(key)!r}")

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        raise ReadOnly(f"read-only store: cannot write {check_key(key)!r}")

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        raise ReadOnly(f"read-only store: cannot write {check_key(key)!r}")

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        raise ReadOnly(f"read-only store: cannot write {check_key(key)!r}")

    def probe_conditional_writes(self) -> str | None:
        """A reason, without asking the store: nothing is written through a read-only one."""
        return "read-only store: no conditional writes"

    def remove_leftover(self, leftover: Leftover) -> None:
        raise ReadOnly(f"read-only store: cannot remove {leftover.describe()}")

    def sweep(self, prefix: str = "") -> tuple[Leftover, ...]:
        raise ReadOnly(f"read-only store: cannot remove leftovers under {prefix!r}")

    def flush(self) -> None:
        """Nothing to make durable: nothing can have changed."""

    def close(self) -> None:
        self.inner.close()
