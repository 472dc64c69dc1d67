"""Test doubles for stores: wrappers that misbehave on demand, for tests of error paths.

Not product code: nothing under ``n5fs`` outside ``n5fs.testing`` imports this module. A double
wraps a real store (:class:`~n5fs.kvstore.wrappers.ForwardingStore`) and changes only what a
test asks for, and passes on the abilities of the store it wraps as any wrapper does
(:mod:`n5fs.kvstore.abilities`), except those a fault would be gone around by.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from n5fs.errors import N5fsError, StoreUnavailable
from n5fs.kvstore.abilities import LocalFiles
from n5fs.kvstore.wrappers import ForwardingStore

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Iterable, Iterator

    from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, Versioned

__all__ = ["FaultyStore"]


class FaultyStore(ForwardingStore):
    """Injects backend faults on chosen operations, for tests of error paths.

    ``fail("set")`` makes the next ``set`` raise ``StoreUnavailable`` (or the given error);
    ``times=None`` keeps failing until :meth:`heal`. ``when`` narrows it to some keys.
    """

    _OPS = (
        "get",
        "set",
        "delete",
        "list",
        "stat",
        "delete_prefix",
        "copy",
        "put_file",
        "get_many",
        "rename",
        "set_mtime",
        "get_versioned",
        "set_if",
    )
    #: not :class:`~n5fs.kvstore.abilities.LocalFiles`: a reader of the local files would go
    #: around the faults ``get`` injects
    passes_on = ForwardingStore.passes_on - {LocalFiles}

    def __init__(self, inner: KvStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._faults: dict[
            str, tuple[Callable[[str], N5fsError], int | None, Callable[[str], bool]]
        ] = {}
        self.calls: dict[str, int] = dict.fromkeys(self._OPS, 0)

    def fail(
        self,
        op: str,
        error: Callable[[str], N5fsError] = StoreUnavailable,
        *,
        times: int | None = 1,
        when: Callable[[str], bool] = lambda key: True,
    ) -> None:
        if op not in self._OPS:
            raise ValueError(f"unknown operation {op!r}; one of {self._OPS}")
        with self._lock:
            self._faults[op] = (error, times, when)

    def heal(self) -> None:
        with self._lock:
            self._faults.clear()

    def _maybe_fail(self, op: str, key: str) -> None:
        with self._lock:
            self.calls[op] += 1
            fault = self._faults.get(op)
            if fault is None or not fault[2](key):
                return
            error, times, when = fault
            if times is not None:
                if times <= 1:
                    del self._faults[op]
                else:
                    self._faults[op] = (error, times - 1, when)
        raise error(f"injected fault: {op} {key!r}")

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        self._maybe_fail("get", key)
        return super().get(key, byte_range)

    def set(self, key: str, value: bytes) -> None:
        self._maybe_fail("set", key)
        super().set(key, value)

    def delete(self, key: str) -> None:
        self._maybe_fail("delete", key)
        super().delete(key)

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        self._maybe_fail("list", prefix)
        return super().list(prefix, delimiter)

    def stat(self, key: str) -> KeyInfo | None:
        self._maybe_fail("stat", key)
        return super().stat(key)

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        self._maybe_fail("list", prefix)  # a walk is a listing: it fails as one
        return super().walk(prefix)

    def delete_prefix(self, prefix: str) -> int:
        self._maybe_fail("delete_prefix", prefix)
        return super().delete_prefix(prefix)

    def copy(self, src: str, dst: str) -> None:
        self._maybe_fail("copy", dst)
        super().copy(src, dst)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self._maybe_fail("put_file", key)
        super().put_file(key, path)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = list(keys)
        for key in keys:
            self._maybe_fail("get_many", key)
        return super().get_many(keys)

    def rename(self, src: str, dst: str) -> None:
        self._maybe_fail("rename", dst)
        super().rename(src, dst)

    def set_mtime(self, key: str, mtime: float) -> None:
        self._maybe_fail("set_mtime", key)
        super().set_mtime(key, mtime)

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        """Fails as a ``set`` would (its value is what is at stake)."""
        self._maybe_fail("set", key)
        return super().set_with_mtime(key, value, mtime)

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        self._maybe_fail("put_file", key)
        return super().put_file_with_mtime(key, path, mtime)

    def get_versioned(self, key: str) -> Versioned | None:
        self._maybe_fail("get_versioned", key)
        return super().get_versioned(key)

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        self._maybe_fail("set_if", key)
        return super().set_if(key, value, version=version)
