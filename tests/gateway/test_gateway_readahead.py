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
    from collections.abc import Callable, Collection, Mapping

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
    """A reader whose clock stands still: fetches take no time, so the read-ahead stays at
    ``ahead`` objects (the depth tests below move a clock of their own)."""
    r = ObjectReader(
        store,
        cache_bytes=cache,
        small_object=4 * MiB,
        readahead=8 * MiB,
        ahead_objects=ahead,
        clock=Clock(0.0),
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


# == depth: the fetch time over the reader's pace ==================================================


class ThreadClock:
    """Each thread's own time: a fetch moves only the clock of the thread that makes it, so
    fetches running at once on the pool each measure exactly the time the test gives them,
    and the reader's thread measures only what the test moves it by."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return float(getattr(self._local, "now", 0.0))

    def advance(self, seconds: float) -> None:
        self._local.now = self() + seconds


FETCH = 0.05  # seconds a GET takes (50 ms: a round trip to a distant region)
PACE = 0.002  # seconds a reader takes from one object to asking for the next


def distant(store: CountingStore, *, cache: int = 64 * MiB, max_ahead: int = 64) -> ObjectReader:
    """A reader of ``store`` whose GETs each take :data:`FETCH` by its clock."""
    clock = ThreadClock()
    store.hook("get", lambda _call: clock.advance(FETCH))
    r = ObjectReader(
        store,
        cache_bytes=cache,
        small_object=4 * MiB,
        readahead=8 * MiB,
        ahead_objects=4,
        ahead_max=max_ahead,
        clock=clock,
    )
    r.follow(listing_of(store), folders_of(store))
    r.test_clock = clock  # type: ignore[attr-defined]
    return r


def folders_of(store: KvStore) -> Callable[[str], Collection[str] | None]:
    def folders(prefix: str) -> Collection[str] | None:
        return frozenset(p[len(prefix) :].rstrip("/") for p in store.list(prefix).prefixes)

    return folders


def read_paced(r: ObjectReader, store: CountingStore, key: str) -> bytes:
    """Read ``key`` whole as a reader taking :data:`PACE` before it, once the read-ahead
    that earlier reads started has landed (so what is in flight is this read's doing)."""
    _drain(r)
    r.test_clock.advance(PACE)  # type: ignore[attr-defined]
    return read_all(r, store, key)


def grid_keys(folder: str, count: int) -> list[str]:
    """Names 0, 1, 2, ... (the grid order; the listing has 0, 1, 10, 11, ...)."""
    return [f"{folder}/{i}" for i in range(count)]


@pytest.mark.parametrize("order", ["listing", "grid"])
def test_the_depth_covers_the_fetch_time_over_the_readers_pace(
    store: CountingStore, order: str
) -> None:
    """50 ms a GET, 2 ms a reader takes per object: 25 objects in flight keep it from
    waiting; after a few reads in order, one read puts that many in the air at once."""
    keys = grid_keys("a", 100)
    for key in keys:
        store.inner.set(key, os.urandom(1024))
    walk = keys if order == "grid" else sorted(keys)
    r = distant(store)
    for key in walk[:2]:  # the first read gets 4 ahead; the second shows the reader's pace
        assert read_paced(r, store, key) == store.inner.get(key)
    assert r.pace.depth() == round(FETCH / PACE) == 25
    _drain(r)
    fetched = set(store.per_key("get"))  # a grid reader's first read guessed the listing,
    fetched.add(walk[2])  # so it fetches its third object itself (past the gate)
    gate = store.gate("get", lambda key: key not in fetched, times=None)
    r.test_clock.advance(PACE)  # type: ignore[attr-defined]
    read_all(r, store, walk[2])  # the next 25 in the reader's order go in the air at once
    wanted = set(walk[3 : 3 + 25]) - fetched
    held = {call.key for call in gate.wait_reached(len(wanted))}
    assert held == wanted
    assert r.prefetcher.in_flight() == (len(wanted), len(wanted) * 1024)
    assert len(wanted) > 20
    gate.release()
    for key in walk[3:]:
        assert read_paced(r, store, key) == store.inner.get(key)
    r.close()
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


def test_the_depth_stays_within_the_byte_budget(store: CountingStore) -> None:
    """However deep the pace asks, the bytes ahead of the reader stay within a quarter of
    the cache: in flight, and landed but not yet read (a deeper window would evict what it
    fetched before the reader got there, and fetch it again)."""
    keys = folder_of(store.inner, 40, size=MiB)
    # 16 MiB of cache: 4 MiB ahead, 4 objects of 1 MiB, though the pace asks for 25
    r = distant(store, cache=16 * MiB)
    for key in keys[:2]:
        read_paced(r, store, key)
    assert r.pace.depth() == 25
    _drain(r)
    gate = store.gate("get", lambda key: key > keys[5], times=None)
    r.test_clock.advance(PACE)  # type: ignore[attr-defined]
    read_all(r, store, keys[2])
    held = {call.key for call in gate.wait_reached(1)}
    assert held == {keys[6]}  # 3, 4, 5 came before: four ahead of keys[2]
    assert r.prefetcher.in_flight() == (1, MiB)
    gate.release()
    for key in keys[3:]:
        read_paced(r, store, key)
        objects, nbytes = r.prefetcher.in_flight()
        assert objects <= 4
        assert nbytes <= 4 * MiB
        assert r.cache.size <= 16 * MiB
    r.close()
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


def test_the_pool_bounds_the_depth(store: CountingStore) -> None:
    keys = folder_of(store.inner, 60)
    r = distant(store, max_ahead=10)
    for key in keys[:2]:
        read_paced(r, store, key)
    assert r.pace.depth() == 10  # 25 wanted, 10 the mount's bound
    _drain(r)
    gate = store.gate("get", lambda key: key > keys[5], times=None)
    r.test_clock.advance(PACE)  # type: ignore[attr-defined]
    read_all(r, store, keys[2])
    held = {call.key for call in gate.wait_reached(7)}
    assert held == set(keys[6:13])  # ten ahead of keys[2]: the first four came before
    assert r.prefetcher.in_flight()[0] == 7
    gate.release()
    r.close()


RANDOM = [17, 3, 29, 8, 35, 12, 24, 1, 31, 6, 20, 38, 14, 27, 10, 33, 22, 5, 36, 15]


def test_a_random_reader_gets_no_read_ahead_however_slow_the_store(store: CountingStore) -> None:
    keys = folder_of(store.inner, 40)
    r = distant(store)
    for at in RANDOM:  # no step of one, none within a window, never the first object
        assert read_paced(r, store, keys[at]) == store.inner.get(keys[at])
    r.close()
    assert r.prefetcher.started == 0
    assert store.per_key("get") == Counter(keys[at] for at in RANDOM)


def test_a_random_reader_from_the_first_object_gets_what_it_always_got(
    store: CountingStore,
) -> None:
    """A first read of a folder's first object gets the four next ahead (a first read
    confirms no order), then random reads get nothing more, however deep a follower's depth
    would be."""
    keys = folder_of(store.inner, 40)
    r = distant(store)
    for at in [0, *RANDOM]:
        read_paced(r, store, keys[at])
    r.close()
    assert r.prefetcher.started == 4
    assert set(store.per_key("get")) == {keys[at] for at in [0, 1, 2, 3, 4, *RANDOM]}


# == orders: grid order, and on into the next folders =============================================


def own_fetches(store: CountingStore) -> list[str]:
    """The keys whose GET ran on the test's thread: the reader waited for a whole fetch."""
    main = threading.main_thread().name
    seen: list[str] = []
    store.hook("get", lambda call: seen.append(call.key) if _on(main) else None)
    return seen


def _on(name: str) -> bool:
    return threading.current_thread().name == name


def test_a_reader_in_grid_order_gets_the_grid_order_fetched_ahead(store: CountingStore) -> None:
    keys = grid_keys("a", 30)  # 0, 1, 2, ... 29; the listing: 0, 1, 10, 11, ... 19, 2, 20, ...
    for key in keys:
        store.inner.set(key, os.urandom(64))
    own = own_fetches(store)
    r = reader(store, ahead=4)
    for key in keys:
        assert read_all(r, store, key) == store.inner.get(key)
        _drain(r)
    r.close()
    # 0: nothing ahead yet; 1: ahead in either order; 2: the listing order was the guess (10,
    # 11, ... came ahead); from 2 on the reader follows the grid order and never waits
    assert own == ["a/0", "a/2"]
    assert max(store.per_key("get").values()) == 1


def tree(store: KvStore, rows: int, per_row: int, *, top: str = "z") -> list[str]:
    """A Zarr-like chunk tree ``top/row/col`` (``/`` separated chunk keys); its keys in
    grid order."""
    keys = [f"{top}/{i}/{j}" for i in range(rows) for j in range(per_row)]
    for key in keys:
        store.set(key, os.urandom(64))
    store.set(f"{top}/.zarray", b"{}")
    return keys


def find_order(keys: list[str]) -> list[str]:
    """Listing order per folder, folders in listing order: what ``find | xargs cat`` reads."""
    return sorted(keys, key=lambda key: key.split("/"))


@pytest.mark.parametrize("order", ["find", "grid"])
def test_the_read_ahead_goes_on_into_the_next_folders(store: CountingStore, order: str) -> None:
    keys = tree(store.inner, 12, 12)  # folders 0 ... 11 of chunks 0 ... 11: the orders differ
    walk = find_order(keys) if order == "find" else keys
    own = own_fetches(store)
    r = reader(store, ahead=4)
    r.follow(listing_of(store), folders_of(store))
    for key in walk:
        assert read_all(r, store, key) == store.inner.get(key)
        _drain(r)
    r.close()
    # only the first object is the reader's own: the grid reader shows its order in the first
    # folder (0, 1, 2, where the listing has 0, 1, 10), and from there every folder's first
    # objects come while it reads the one before (z/1, z/2: not z/10 as in the listing)
    assert own == ["z/0/0"]
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


def test_a_deeper_tree_is_followed_across_its_rows(store: CountingStore) -> None:
    keys = [f"v/{i}/{j}/{k}" for i in range(3) for j in range(3) for k in range(5)]
    for key in keys:
        store.inner.set(key, os.urandom(64))
    own = own_fetches(store)
    r = reader(store, ahead=4)
    r.follow(listing_of(store), folders_of(store))
    for key in keys:  # v/0/2/4 is followed by v/1/0/0: up two levels and down again
        read_all(r, store, key)
        _drain(r)
    r.close()
    assert own == ["v/0/0/0"]
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


def test_without_the_folders_the_read_ahead_stops_at_the_folders_end(
    store: CountingStore,
) -> None:
    keys = tree(store.inner, 3, 6)
    own = own_fetches(store)
    r = reader(store, ahead=4)  # files only: no subfolders known
    for key in keys:
        read_all(r, store, key)
        _drain(r)
    r.close()
    assert own == ["z/0/0", "z/1/0", "z/2/0"]


def test_a_gateway_reads_ahead_into_the_next_folders_from_listings_past_their_ttl(
    store: CountingStore,
) -> None:
    """Through the gateway: ``find`` lists the tree, then ``xargs cat`` reads it in that
    order; its folder listings have expired by then (lookups list each folder again), and
    the read-ahead still takes each next folder's first objects from the last listing."""
    keys = tree(store.inner, 4, 6)
    clock = Clock(1000.0)
    gw = Gateway(store, GatewayConfig(ttl=5.0, read_only=True), clock=clock)
    for folder in ("/z", *(f"/z/{i}" for i in range(4))):
        gw.readdir(folder)
    clock.advance(10.0)  # every listing has expired
    own = own_fetches(store)
    for key in find_order(keys):
        fh = gw.open(f"/{key}", os.O_RDONLY)
        try:
            assert gw.read(fh, 1 << 17, 0) == store.inner.get(key)
        finally:
            gw.release(fh)
        assert gw.reader.prefetcher.idle(WAIT)
    gw.close()
    assert own == ["z/0/0"]
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


# == sweeps: readers on many threads, and readers going down =====================================


def test_readers_on_many_threads_keep_the_read_ahead_going(store: CountingStore) -> None:
    """Threads reading one folder's objects in order reach the store out of it (3 before 2):
    a read behind the furthest one, within what the sweep read or fetched ahead, is one of
    them, not a reader leaving the order; nothing is fetched twice or by a reader."""
    keys = folder_of(store.inner, 24)
    order = [0, 1, 3, 2, 5, 4, 6, 8, 7, 10, 9, 11, 13, 12, 15, 14, 16, 17, 19, 18, 21, 20, 23, 22]
    own = own_fetches(store)
    r = reader(store, ahead=4)
    for at in order:
        assert read_all(r, store, keys[at]) == store.inner.get(keys[at])
        _drain(r)
    r.close()
    assert own == [keys[0]]
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


def test_a_reader_going_down_a_folder_gets_the_objects_below_ahead(store: CountingStore) -> None:
    """Two reads down the order (19, then 18) confirm a reader going down: the objects below
    it come ahead, as many as above an ascending one, and none above where it started."""
    keys = folder_of(store.inner, 30)
    own = own_fetches(store)
    r = reader(store, ahead=4)
    read_all(r, store, keys[19])
    _drain(r)
    read_all(r, store, keys[18])
    _drain(r)
    assert set(store.per_key("get")) == {keys[i] for i in range(14, 20)}
    for at in range(17, -1, -1):
        assert read_all(r, store, keys[at]) == store.inner.get(keys[at])
        _drain(r)
    r.close()
    assert own == [keys[19], keys[18]]
    assert store.per_key("get") == Counter(dict.fromkeys(keys[:20], 1))


def test_threads_sweeping_folders_in_any_order_within_each_get_them_ahead(
    store: CountingStore,
) -> None:
    """TensorStore's file driver reads a region's chunks on a few threads, a folder at a
    time, each folder's in an order of its own (up, down, from the last): once one folder
    showed the sweep, every next folder's objects come ahead of its readers."""
    keys = tree(store.inner, 6, 8)
    within = [
        [0, 1, 3, 2, 4, 5, 7, 6],
        [7, 6, 5, 4, 3, 2, 1, 0],
        [0, 7, 6, 5, 4, 3, 2, 1],
        [2, 1, 0, 3, 4, 7, 6, 5],
    ]
    walk = [f"z/{row}/{col}" for row in range(6) for col in within[row % len(within)]]
    own = own_fetches(store)
    r = reader(store, ahead=8)
    r.follow(listing_of(store), folders_of(store))
    for key in walk:
        assert read_all(r, store, key) == store.inner.get(key)
        _drain(r)
    r.close()
    assert own == ["z/0/0"]
    assert store.per_key("get") == Counter(dict.fromkeys(keys, 1))


def test_readers_at_once_in_no_order_are_a_sweep_and_one_reader_so_is_not(
    store: CountingStore,
) -> None:
    """Three threads start a folder at once, each on a chunk of its own (5, 3, 1: TensorStore's
    file driver), while the first fetch is still on its way (gated): reads closer together
    than a fetch takes are readers at once, a sweep, and the rest of the folder and the next
    folder come ahead. One reader asking for 5, 3, 1 waits for each: random access, nothing
    ahead."""
    keys = tree(store.inner, 3, 8)
    store.inner.set("m/x", b"timed")
    r = distant(store, max_ahead=16)
    assert read_all(r, store, "m/x") == b"timed"  # one fetch timed: 50 ms
    gate = store.gate("get", lambda key: key.startswith("z/0/"), when="before", times=None)
    try:
        with ThreadPoolExecutor(3) as pool:
            reads = [pool.submit(read_all, r, store, f"z/0/{i}") for i in (5, 3, 1)]
            gate.wait_reached(3)  # each thread's own GET: none had an answer yet
            gate.release()
            assert [f.result(WAIT) for f in reads] == [
                store.inner.get(f"z/0/{i}") for i in (5, 3, 1)
            ]
    finally:
        gate.release()
    _drain(r)
    fetched = set(store.per_key("get"))
    assert {key for key in keys if key.startswith("z/0/")} <= fetched  # the folder, ahead
    assert "z/1/0" in fetched  # and on into the next folder
    assert max(store.per_key("get").values()) == 1
    r.close()

    alone = CountingStore(MemoryStore())
    tree(alone.inner, 3, 8)
    alone.inner.set("m/x", b"timed")
    one = distant(alone, max_ahead=16)
    read_all(one, alone, "m/x")
    for i in (5, 3, 1):
        read_paced(one, alone, f"z/0/{i}")
    _drain(one)
    one.close()
    assert set(alone.per_key("get")) == {"m/x", "z/0/5", "z/0/3", "z/0/1"}
