"""Read-ahead across whole objects, single flight, parallel ranges, and ETag-stamped versions.

Deterministic: a gate of the counting store holds a GET where the test needs it (no sleeps);
the pool is drained with ``ObjectReader.close()`` (it waits for fetches in flight) before
counting requests.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest

from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.read.byte_cache import fits, version_of
from n5fs.gateway.read.reader import ObjectReader, PageCache, ReadWindow
from n5fs.kvstore.base import KeyInfo, KvStore
from n5fs.kvstore.keys import basename
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import WAIT, Call, Clock, CountingStore

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

MiB = 1 << 20


def folder_of(store: KvStore, count: int, size: int = 1024) -> list[str]:
    keys = [f"a/{i:02d}" for i in range(count)]
    for key in keys:
        store.set(key, os.urandom(size))
    return keys


def listing_of(store: KvStore) -> Callable[[str], Mapping[str, KeyInfo] | None]:
    def files(folder: str) -> Mapping[str, KeyInfo] | None:
        return {basename(i.key): i for i in store.list(folder).keys}

    return files


def reader(store: KvStore, *, cache: int = 64 * MiB, ahead: int = 4) -> ObjectReader:
    r = ObjectReader(
        store, cache_bytes=cache, small_object=4 * MiB, readahead=8 * MiB, ahead_objects=ahead
    )
    r.follow(listing_of(store))
    return r


def read_all(r: ObjectReader, store: CountingStore, key: str) -> bytes:
    info = store.inner.stat(key)
    assert info is not None
    data, _ = r.read(ReadWindow(), key, info.size, 0, info.size, version_of(info))
    return data


@pytest.fixture
def store() -> CountingStore:
    return CountingStore(MemoryStore())


def test_a_reader_walking_a_folder_gets_the_next_objects_ahead(store: CountingStore) -> None:
    keys = folder_of(store.inner, 10)
    r = reader(store, ahead=4)
    assert read_all(r, store, keys[0]) == store.inner.get(keys[0])
    r.close()  # waits for the read-ahead
    assert set(store.per_key("get")) == set(keys[:5])
    assert all(r.cache.holds(k) for k in keys[1:5])
    assert not r.cache.holds(keys[5])


def test_every_object_is_fetched_once_when_read_in_order(store: CountingStore) -> None:
    keys = folder_of(store.inner, 20)
    r = reader(store, ahead=4)
    for key in keys:
        assert read_all(r, store, key) == store.inner.get(key)
    r.close()
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))
    assert r.prefetcher.started == len(keys) - 1  # all but the first came ahead


def test_a_read_of_an_object_being_fetched_ahead_waits_for_that_fetch(store: CountingStore) -> None:
    keys = folder_of(store.inner, 3)
    r = reader(store, ahead=2)
    gate = store.gate("get", keys[1])
    read_all(r, store, keys[0])  # starts the read-ahead of keys[1] and keys[2]
    gate.wait_reached()  # keys[1]'s GET returned its bytes, not yet in the cache
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(read_all, r, store, keys[1])
        assert r.flights.wait_joined(1, WAIT)  # the reader waits on the flight
        assert not second.done()
        gate.release()
        assert second.result(WAIT) == store.inner.get(keys[1])
    r.close()
    assert store.per_key("get")[keys[1]] == 1


def test_read_ahead_stops_when_the_reader_leaves_the_order(store: CountingStore) -> None:
    keys = folder_of(store.inner, 30)
    r = reader(store, ahead=4)
    read_all(r, store, keys[0])
    _drain(r)
    assert set(store.per_key("get")) == set(keys[:5])
    read_all(r, store, keys[20])  # a jump: not following, nothing fetched ahead
    _drain(r)
    assert set(store.per_key("get")) == {*keys[:5], keys[20]}
    read_all(r, store, keys[21])  # following again from there
    _drain(r)
    assert set(store.per_key("get")) == {*keys[:5], *keys[20:26]}
    read_all(r, store, keys[3])  # backwards: cached, and no read-ahead
    _drain(r)
    assert set(store.per_key("get")) == {*keys[:5], *keys[20:26]}
    r.close()


def test_a_strided_reader_gets_the_objects_at_its_stride_ahead(store: CountingStore) -> None:
    """Every 5th object (a subsampled read): two equal steps confirm the stride, then the
    objects at that stride are fetched ahead, never the ones between."""
    keys = folder_of(store.inner, 40)
    r = reader(store, ahead=3)
    for at in (1, 6):  # not the folder's first object: no guess yet, then a candidate step
        read_all(r, store, keys[at])
        _drain(r)
    assert set(store.per_key("get")) == {keys[1], keys[6]}
    read_all(r, store, keys[11])  # the same step again: every 5th from here
    _drain(r)
    assert set(store.per_key("get")) == {keys[i] for i in (1, 6, 11, 16, 21, 26)}
    before = r.prefetcher.started
    for at in (16, 21, 26, 31):
        read_all(r, store, keys[at])
        _drain(r)
    assert r.prefetcher.started - before == 2  # 31, then 36 came ahead (41 is past the end)
    assert set(store.per_key("get")) == {keys[i] for i in range(1, 40, 5)}
    assert max(store.per_key("get").values()) == 1
    r.close()


def test_the_stride_is_the_guess_in_the_next_folder_until_a_read_breaks_it(
    store: CountingStore,
) -> None:
    for folder in "abc":
        for i in range(20):
            store.inner.set(f"{folder}/{i:02d}", os.urandom(64))
    r = reader(store, ahead=2)
    for at in (0, 3, 6):  # a stride of 3 in folder a (0 guesses the listing order: 1, 2)
        read_all(r, store, f"a/{at:02d}")
        _drain(r)
    store.clear()
    read_all(r, store, "b/04")  # the first read in b: 7 and 10 come ahead at once
    _drain(r)
    assert set(store.per_key("get")) == {"b/04", "b/07", "b/10"}
    read_all(r, store, "b/01")  # back: out of every pattern, no read-ahead, no guess for c
    _drain(r)
    store.clear()
    read_all(r, store, "c/04")
    _drain(r)
    assert set(store.per_key("get")) == {"c/04"}
    r.close()


def _drain(r: ObjectReader) -> None:
    """Wait until no read-ahead is in flight (nothing holds them here)."""
    assert r.prefetcher.idle(WAIT)


def test_in_flight_and_memory_stay_within_their_bounds(store: CountingStore) -> None:
    keys = folder_of(store.inner, 40, size=MiB)
    # 16 MiB of cache: read-ahead may hold a quarter of it in flight, 4 objects of 1 MiB
    r = reader(store, cache=16 * MiB, ahead=8)
    gate = store.gate("get", lambda key: key != keys[0], times=None)
    read_all(r, store, keys[0])
    gate.wait_reached(4)
    assert r.prefetcher.in_flight() == (4, 4 * MiB)
    gate.release()
    for key in keys[1:]:
        read_all(r, store, key)
        assert r.cache.size <= 16 * MiB
        objects, nbytes = r.prefetcher.in_flight()
        assert objects <= 8
        assert nbytes <= 4 * MiB
    r.close()
    assert max(store.per_key("get").values()) == 1  # nothing fetched twice, however it interleaved


def test_a_commit_overtaking_a_fetch_ahead_keeps_its_bytes_out(store: CountingStore) -> None:
    keys = folder_of(store.inner, 2)
    r = reader(store, ahead=1)
    gate = store.gate("get", keys[1])
    read_all(r, store, keys[0])
    gate.wait_reached()  # the old bytes of keys[1] are loaded, not yet stored
    store.inner.set(keys[1], b"new")  # a commit lands: the mount drops what it cached
    r.cache.invalidate(keys[1])
    assert read_all(r, store, keys[1]) == b"new"  # never joins the overtaken fetch
    assert store.per_key("get")[keys[1]] == 2
    gate.release()
    r.close()
    assert r.cache.get(keys[1]) == b"new"  # the overtaken fetch stored nothing


def test_large_object_window_is_fetched_as_ranges_at_once() -> None:
    inner = MemoryStore()
    inner.set("big", os.urandom(40 * MiB))
    barrier = threading.Barrier(4, timeout=WAIT)

    def all_at_once(call: Call) -> None:
        """The ranges of the 8 MiB window each wait until all four are being read."""
        if call.byte_range is not None and call.byte_range.length == 2 * MiB:
            barrier.wait()  # breaks (fails the read) unless the four run together

    store = CountingStore(inner)
    store.hook("get", all_at_once)
    r = ObjectReader(store, cache_bytes=MiB, small_object=MiB, readahead=8 * MiB)
    data, window = r.read(ReadWindow(readahead=8 * MiB), "big", 4096, 0, 40 * MiB)
    assert data == (inner.get("big") or b"")[:4096]
    assert len(window.data) == 8 * MiB
    r.close()


def test_versions_name_the_etag_where_the_listing_has_one() -> None:
    same = KeyInfo("k", 3, 10.0, '"e1"')
    other = KeyInfo("k", 3, 10.0, '"e2"')
    assert fits(version_of(same), version_of(same))
    assert not fits(version_of(same), version_of(other))
    assert fits(version_of(same), (3, 10.0))  # a caller that knows no ETag
    assert not fits((3, 10.0), version_of(same))  # bytes of unknown ETag prove nothing
    assert fits((3, 10.0), version_of(KeyInfo("k", 3, 10.0)))  # no ETag anywhere


def _read(gw: Gateway, path: str) -> tuple[bytes, PageCache]:
    fh = gw.open(path, os.O_RDONLY)
    try:
        return gw.read(fh, 1 << 20, 0), gw.page_cache(fh)
    finally:
        gw.release(fh)


def test_same_size_same_second_replacement_by_another_mount_is_seen() -> None:
    """S3's LastModified has 1 s resolution: only the ETag tells the two versions apart."""
    shared = MemoryStore()
    shared.set("k", b"old bytes")
    clock = Clock(1000.0)
    mine = Gateway(shared, GatewayConfig(ttl=5.0), clock=clock)
    theirs = Gateway(shared, GatewayConfig(ttl=5.0), clock=clock)
    assert _read(mine, "/k") == (b"old bytes", PageCache.DROP)  # first open: no pages yet
    assert _read(mine, "/k") == (b"old bytes", PageCache.KEEP)  # unchanged: keep them
    stamp = shared.stat("k")
    assert stamp is not None
    theirs.write_file("/k", b"new bytes")  # same size...
    shared.set_mtime("k", stamp.mtime)  # ... and the same second
    clock.now += 10  # my listing's TTL has passed: the new listing has the new ETag
    assert _read(mine, "/k") == (b"new bytes", PageCache.DROP)
    mine.close()
    theirs.close()
