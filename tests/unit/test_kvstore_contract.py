"""The KvStore contract against the local drivers (S3 and zip run it in their own files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from n5fs.errors import NotSupported
from n5fs.kvstore.abilities import (
    StoreTraits,
    conditional_writes,
    local_files,
    part_writes,
    settable_durability,
)
from n5fs.kvstore.base import KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.wrappers import ForwardingStore
from n5fs.kvstore.writeback import Journal, WriteBackStore, journal_root
from n5fs.testing.kvstore_contract import KvStoreContract


class TestMemoryStore(KvStoreContract):
    persistent = False

    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()

    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        assert isinstance(store, MemoryStore)
        store._data[key] = (value, 0.0)

    def peek(self, store: KvStore, key: str) -> bytes | None:
        assert isinstance(store, MemoryStore)
        entry = store._data.get(key)
        return None if entry is None else entry[0]


class TestFileStore(KvStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FileStore:
        return FileStore(tmp_path / "root")

    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        assert isinstance(store, FileStore)
        path = store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)

    def peek(self, store: KvStore, key: str) -> bytes | None:
        assert isinstance(store, FileStore)
        path = store.root / key
        return path.read_bytes() if path.is_file() else None


def test_file_store_has_no_conditional_writes(tmp_path: Path) -> None:
    """No such ability, also through a wrapper, whose methods for it say NotSupported."""
    store = FileStore(tmp_path)
    store.set("k", b"v")
    assert conditional_writes(store) is None
    assert not hasattr(store, "set_if")
    wrapped = ForwardingStore(store)
    assert conditional_writes(wrapped) is None
    assert wrapped.probe_conditional_writes() == "FileStore has no conditional writes"
    with pytest.raises(NotSupported):
        wrapped.set_if("k", b"w", version=None)
    with pytest.raises(NotSupported):
        wrapped.get_versioned("k")
    assert store.get("k") == b"v"


def test_each_driver_has_its_abilities_and_traits(tmp_path: Path) -> None:
    file, memory = FileStore(tmp_path), MemoryStore()
    assert local_files(file) is file
    assert settable_durability(file) is file
    assert part_writes(file) is file
    assert conditional_writes(file) is None
    assert conditional_writes(memory) is memory
    for find in (local_files, settable_durability, part_writes):
        assert find(memory) is None, find
    assert file.traits == StoreTraits(
        atomic_prefix_rename=True, empty_prefixes=True, cheap_stat=True
    )
    assert memory.traits == StoreTraits(flat_listing_preferred=True, shared_versions=True)


class TestWriteBackStore(KvStoreContract):
    """Write-back over memory: every contract holds through the journal; ``peek`` asks the
    backend once what was accepted has landed (``flush``)."""

    persistent = False

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[WriteBackStore]:
        inner = MemoryStore()
        journal = Journal.open(journal_root(tmp_path), inner.spec.to_url())
        store = WriteBackStore(inner, journal, delay=0.0)
        yield store
        store.close()

    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        assert isinstance(store, WriteBackStore)
        assert isinstance(store.inner, MemoryStore)
        store.inner._data[key] = (value, 0.0)

    def peek(self, store: KvStore, key: str) -> bytes | None:
        assert isinstance(store, WriteBackStore)
        assert isinstance(store.inner, MemoryStore)
        store.flush()
        entry = store.inner._data.get(key)
        return None if entry is None else entry[0]
