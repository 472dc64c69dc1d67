"""The read path: whole small objects through the LRU, large ones by growing read-ahead."""

from __future__ import annotations

import itertools
import os

import pytest

from n5fs.errors import KeyNotFound
from n5fs.gateway.read.reader import ObjectReader, ReadWindow
from n5fs.kvstore.base import KvStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import Call, CountingStore

MiB = 1 << 20


@pytest.fixture
def store() -> CountingStore:
    inner = MemoryStore()
    inner.set("big", os.urandom(40 * MiB))
    inner.set("small", b"0123456789")
    return CountingStore(inner)


def reader(store: KvStore, cache: int = 64 * MiB) -> ObjectReader:
    return ObjectReader(store, cache_bytes=cache, small_object=4 * MiB, readahead=8 * MiB)


def test_sequential_reads_grow_the_window_to_the_cap(store: CountingStore) -> None:
    r, window = reader(store), ReadWindow()
    data = store.inner.get("big") or b""
    step = 128 << 10  # the kernel's read size
    pieces = []
    for off in range(0, len(data), step):
        piece, window = r.read(window, "big", step, off, len(data))
        pieces.append(piece)
    assert b"".join(pieces) == data
    ranges = [br for br in store.ranges() if br is not None]
    lengths = [br.length or 0 for br in ranges]
    # windows of 1, 2, 4, 8, 8... MiB, each fetched as at most 4 ranges of >= 1 MiB at once
    assert lengths[:7] == [MiB] * 7
    assert max(lengths) == 2 * MiB
    covered = sorted((br.start, br.start + (br.length or 0)) for br in ranges)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # no byte twice
    assert (covered[0][0], covered[-1][1]) == (0, len(data))
    assert len(store.ranges()) <= 24  # 320 kernel reads, a handful of store requests


def test_random_reads_fetch_exactly_what_is_asked(store: CountingStore) -> None:
    r, window = reader(store), ReadWindow()
    for off in (30 * MiB, 5 * MiB, 17 * MiB):  # never from 0: that counts as sequential
        _, window = r.read(window, "big", 4096, off, 40 * MiB)
    assert [br.length for br in store.ranges() if br is not None] == [4096, 4096, 4096]


def test_small_objects_are_read_whole_once(store: CountingStore) -> None:
    r = reader(store)
    assert r.read(ReadWindow(), "small", 4, 2, 10)[0] == b"2345"
    assert r.read(ReadWindow(), "small", 100, 8, 10)[0] == b"89"
    assert store.ranges() == [None]
    assert r.cache.hits == 1


def test_an_object_the_cache_would_not_keep_is_read_by_range(store: CountingStore) -> None:
    """Small enough to read whole, too large for a quarter of the cache: fetched whole, it
    would be fetched again at every kernel read; by range, each byte is asked once."""
    data = os.urandom(3 * MiB)
    store.inner.set("mid", data)
    r, window, pieces = reader(store, cache=8 * MiB), ReadWindow(), []
    assert not r.cache.admits(len(data))
    for off in range(0, len(data), 128 << 10):
        piece, window = r.read(window, "mid", 128 << 10, off, len(data))
        pieces.append(piece)
    assert b"".join(pieces) == data
    assert None not in store.ranges()  # never whole
    assert sum(br.length or 0 for br in store.ranges() if br is not None) == len(data)


def test_cache_stays_within_its_budget(store: CountingStore) -> None:
    for i in range(50):
        store.inner.set(f"c{i}", bytes(MiB))
    r = reader(store, cache=8 * MiB)
    for i in range(50):
        r.whole(f"c{i}")
    assert r.cache.size <= 8 * MiB


def test_vanished_object_is_enoent(store: CountingStore) -> None:
    r = reader(store)
    with pytest.raises(KeyNotFound):
        r.read(ReadWindow(), "gone", 10, 0, None)
    with pytest.raises(KeyNotFound):
        r.read(ReadWindow(), "gone", 10, 0, 40 * MiB)


def test_window_of_another_version_is_not_used(store: CountingStore) -> None:
    r = reader(store)
    first, window = r.read(ReadWindow(), "big", 4096, 0, 40 * MiB, version=(40 * MiB, 1.0))
    store.inner.set("big", b"x" * (40 * MiB))  # a commit: new version
    again, _ = r.read(window, "big", 4096, 0, 40 * MiB, version=(40 * MiB, 2.0))
    assert again == b"x" * 4096 != first


def test_cached_bytes_of_another_version_are_dropped(store: CountingStore) -> None:
    r = reader(store)
    assert r.whole("small", (10, 1.0)) == b"0123456789"
    store.inner.set("small", b"abcdefghij")
    assert r.whole("small", (10, 1.0)) == b"0123456789"  # same version: the cache answers
    assert r.whole("small", (10, 2.0)) == b"abcdefghij"


def test_read_overtaken_by_a_commit_is_not_cached() -> None:
    """The hook sits between the store read and the cache fill: a commit lands there."""
    inner = MemoryStore()
    inner.set("k", b"old")

    def commit(call: Call) -> None:
        inner.set("k", b"new")  # the commit, after the read and before the fill
        r.cache.put("k", None, b"new")

    store = CountingStore(inner)
    store.hook("get", commit, when="after")
    r = reader(store)
    assert r.whole("k") == b"old"  # the reader's question began before the commit
    assert r.cache.get("k") == b"new"  # ... but its answer was never stored
