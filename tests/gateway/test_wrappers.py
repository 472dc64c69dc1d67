"""Wrapper stores keep reporting what the store under them is: a read-only local mount's
``statfs`` is its disk's (never a made-up size: ``df`` must tell the truth), a wrapper over a read-only store
is read-only, and a wrapper has an ability only where the store under it has it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from n5fs.errors import ReadOnly, StoreUnavailable, VersionConflict
from n5fs.gateway import Gateway
from n5fs.kvstore.abilities import (
    ConditionalWrites,
    Durability,
    LocalFiles,
    SettableDurability,
    conditional_writes,
    has_ability,
    local_files,
    part_writes,
    settable_durability,
)
from n5fs.kvstore.base import Versioned
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.wrappers import ForwardingStore, ReadOnlyStore
from n5fs.testing.doubles import FaultyStore

STABLE = ("f_bsize", "f_frsize", "f_blocks", "f_files")  # free counts move with other writers


@pytest.mark.parametrize(
    "wrap", [ReadOnlyStore, FaultyStore, lambda s: FaultyStore(ReadOnlyStore(s))]
)
def test_statfs_through_a_wrapper_is_the_local_filesystems(tmp_path: Path, wrap) -> None:
    with Gateway(wrap(FileStore(tmp_path))) as gw:
        reported = gw.statfs()
    disk = os.statvfs(tmp_path)
    assert {k: reported[k] for k in STABLE} == {k: getattr(disk, k) for k in STABLE}


def test_statfs_of_a_store_without_a_directory_stays_the_fixed_one(tmp_path: Path) -> None:
    with Gateway(ReadOnlyStore(MemoryStore())) as wrapped, Gateway(MemoryStore()) as bare:
        assert wrapped.statfs() == bare.statfs()


def test_root_is_forwarded_only_where_there_is_one(tmp_path: Path) -> None:
    assert ReadOnlyStore(FileStore(tmp_path)).root == tmp_path
    assert FaultyStore(ReadOnlyStore(FileStore(tmp_path))).root == tmp_path
    assert ReadOnlyStore(MemoryStore()).root is None


def test_a_wrapper_over_a_read_only_store_is_read_only(tmp_path: Path) -> None:
    store = FaultyStore(ReadOnlyStore(FileStore(tmp_path)))
    assert not store.traits.writable
    assert FaultyStore(FileStore(tmp_path)).traits.writable
    assert store.traits == dataclasses.replace(FileStore.traits, writable=False)
    with Gateway(store) as gw:
        assert gw.read_only
    with pytest.raises(ReadOnly):
        store.set("a", b"x")


def test_wrappers_forward_conditional_writes() -> None:
    inner = MemoryStore()
    store = FaultyStore(ForwardingStore(inner))
    assert store.probe_conditional_writes() is None
    version = store.set_if("k", b"one", version=None)
    assert inner.get_versioned("k") == Versioned(b"one", version)
    assert store.get_versioned("k") == Versioned(b"one", version)
    assert store.stat("k").etag == version  # type: ignore[union-attr]
    with pytest.raises(VersionConflict):
        store.set_if("k", b"two", version=None)
    store.fail("set_if")
    with pytest.raises(StoreUnavailable):
        store.set_if("k", b"two", version=version)
    assert store.set_if("k", b"two", version=version) != version
    assert inner.get("k") == b"two"
    assert store.calls["set_if"] == 4


def test_read_only_wrapper_refuses_conditional_writes_and_asks_nothing() -> None:
    inner = FaultyStore(MemoryStore())
    store = ReadOnlyStore(inner)
    with pytest.raises(ReadOnly):
        store.set_if("k", b"x", version=None)
    assert store.probe_conditional_writes() == "read-only store: no conditional writes"
    assert inner.calls["set_if"] == 0
    assert store.get_versioned("k") is None


@pytest.mark.parametrize("kind", [LocalFiles, ConditionalWrites, SettableDurability])
def test_a_wrapper_passes_on_an_ability_only_where_its_inner_store_has_it(
    tmp_path: Path, kind: type
) -> None:
    for inner in (FileStore(tmp_path), MemoryStore()):
        wrapped = ForwardingStore(inner)
        assert isinstance(wrapped, kind)  # the methods are there, whatever it wraps...
        assert has_ability(wrapped, kind) is isinstance(inner, kind)  # ...the ability is not
        assert has_ability(ForwardingStore(wrapped), kind) is isinstance(inner, kind)


def test_the_fault_double_keeps_readers_away_from_local_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert local_files(ReadOnlyStore(store)) is not None
    assert local_files(FaultyStore(store)) is None
    assert local_files(ReadOnlyStore(FaultyStore(store))) is None
    assert settable_durability(FaultyStore(store)) is not None
    assert part_writes(ForwardingStore(store)) is None  # a wrapper writes values whole
    assert conditional_writes(FaultyStore(MemoryStore())) is not None


def test_a_gateway_sets_the_durability_through_a_wrapper(tmp_path: Path) -> None:
    """``-o durable=`` reaches a wrapped file store, as it reaches a bare one."""
    store = FileStore(tmp_path)
    assert store.durability is Durability.COMMIT
    with Gateway(FaultyStore(store)):
        assert store.durability is Durability.FSYNC  # the mount's default
    with Gateway(MemoryStore()):  # nothing to set: no error
        pass


def test_no_module_asks_a_store_for_an_ability_by_isinstance() -> None:
    """A wrapper carries the methods of every ability it may pass on, so ``isinstance`` on a
    store of unknown kind would claim what its inner store lacks: only the functions of
    ``n5fs.kvstore.abilities`` (which ask ``has_ability``) may."""
    names = ("LocalFiles", "ConditionalWrites", "SettableDurability", "PartWrites")
    root = Path(__file__).parent.parent / "n5fs"
    offenders = [
        f"{path.relative_to(root)}: {line.strip()}"
        for path in root.rglob("*.py")
        if path.name != "abilities.py"
        for line in path.read_text().splitlines()
        if "isinstance(" in line and any(name in line for name in names)
    ]
    assert offenders == []
