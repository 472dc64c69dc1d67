"""The KvStore contract against the local drivers (S3 and zip run it in their own files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from n5fs.errors import NotSupported
from n5fs.kvstore.base import KvStore, Versioned
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
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
    """The base defaults: a reason, NotSupported, and reads without a version."""
    store = FileStore(tmp_path)
    store.set("k", b"v")
    assert store.probe_conditional_writes() == "FileStore has no conditional writes"
    with pytest.raises(NotSupported):
        store.set_if("k", b"w", version=None)
    assert store.get_versioned("k") == Versioned(b"v", None)
    assert store.get("k") == b"v"
