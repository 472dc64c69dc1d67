"""Array-aware listings: one walk of an array answers every folder of its chunk
tree on stores that prefer flat listings (memory, S3), folder by folder on a file store;
bounded by a key budget; never hides a commit (the batch rule of n5fs/singleflight.py, with a
deterministic race); plain trees are not probed."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import zarr

from n5fs.detect import FolderKind
from n5fs.errors import IsAPrefix, KeyNotFound, StoreUnavailable
from n5fs.gateway import EntryKind, Gateway, GatewayConfig
from n5fs.gateway.namespace import walks as walks_module
from n5fs.gateway.namespace.paths import FolderSplitter
from n5fs.kvstore.base import KeyInfo, KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.singleflight import LoadingCache
from n5fs.testing.doubles import WAIT, Clock, CountingStore, FaultyStore
from tests.writers import ramp, tensorstore_n5

ROWS, COLS = 12, 5  # a 24 x 10 array in 2 x 2 chunks: 12 chunk folders of 5 chunks


def lists(store: CountingStore) -> Counter[str]:
    """LISTs by prefix (walks apart)."""
    return store.per_key("list")


def walks(store: CountingStore) -> Counter[str]:
    return store.per_key("walk")


def below(store: CountingStore, prefix: str) -> int:
    """LISTs of folders inside ``prefix`` (the folder itself included)."""
    return sum(n for p, n in lists(store).items() if p.startswith(prefix))


def zarr_v2_nested(tmp: Path, rows: int = ROWS, cols: int = COLS) -> dict[str, bytes]:
    """A Zarr v2 array with dimension_separator "/" as zarr-python 3 writes it: key -> bytes.
    Its grid has two more rows of chunks than are written (chunk folders that do not exist)."""
    values = (np.arange(rows * 2 * cols * 2) % 251 + 1).astype("uint16").reshape(rows * 2, -1)
    array = zarr.create_array(
        store=str(tmp / "arr"), shape=(rows * 2 + 4, cols * 2), chunks=(2, 2), dtype="uint16",
        zarr_format=2, chunk_key_encoding={"name": "v2", "separator": "/"},
        compressors=None, fill_value=0,
    )  # fmt: skip
    array[: rows * 2] = values
    return {
        path.relative_to(tmp).as_posix(): path.read_bytes()
        for path in sorted(tmp.joinpath("arr").rglob("*"))
        if path.is_file()
    }


def new_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> KvStore:
    if kind == "memory":
        return MemoryStore()
    if kind == "file":
        return FileStore(tmp_path / "store")
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    from n5fs.kvstore import open_store

    return open_store({"driver": "s3", "bucket": bucket, "path": "gw/",
                       "endpoint": server.endpoint})  # fmt: skip


@pytest.fixture(autouse=True)
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters wait for the walk (a slow moto page must not make a waiter list its folder
    alone and change the counts); the test of patience lowers it."""
    monkeypatch.setattr(walks_module, "MIN_PATIENCE", WAIT)


@pytest.fixture(params=["memory", "file", pytest.param("s3", marks=pytest.mark.s3)])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def array(tmp_path: Path) -> dict[str, bytes]:
    return zarr_v2_nested(tmp_path / "written")


@pytest.fixture
def counted(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
            array: dict[str, bytes]) -> CountingStore:  # fmt: skip
    inner = new_store(kind, request, tmp_path)
    for key, value in array.items():
        inner.set(key, value)
    return CountingStore(inner)


def chunk_keys() -> list[str]:
    return [f"arr/{i}/{j}" for i in range(ROWS) for j in range(COLS)]


# -- one walk per array -------------------------------------------------------------------------


def test_every_chunk_lookup_of_a_nested_array_costs_one_walk(counted: CountingStore) -> None:
    gw = Gateway(counted)
    for key in chunk_keys():
        assert gw.stat("/" + key).kind is EntryKind.FILE
    if counted.traits.flat_listing_preferred:
        assert walks(counted) == {"arr/": 1}  # one walk answered all 12 folders
        assert below(counted, "arr/") == 0
    elif counted.traits.cheap_stat:  # a directory on disk: each file is one stat, no listing
        assert not walks(counted)
        assert below(counted, "arr/") == 0
    else:  # one listing per folder is cheaper than a walk
        assert not walks(counted)
        assert below(counted, "arr/") == ROWS
    assert gw.stat("/arr").kind is EntryKind.DIR  # lists the root (no array there)
    before = (sum(lists(counted).values()), sum(walks(counted).values()))
    with pytest.raises(KeyNotFound):
        gw.stat("/arr/3/99")  # absent chunk in a folder that exists
    with pytest.raises(KeyNotFound):
        gw.stat("/arr/77/0")  # absent folder: the array's listing does not name it
    assert gw.lookup("/arr/77") is None
    for i in range(ROWS):
        names = [name for name, _ in gw.readdir(f"/arr/{i}")]
        assert names == [str(j) for j in range(COLS)]
    names = [n for n, _ in gw.readdir("/arr")]
    assert names == sorted([".zarray", ".zattrs", *map(str, range(ROWS))])
    if (
        counted.traits.flat_listing_preferred
    ):  # the file store LISTs arr/ and arr/77/ (a scandir each)
        assert (sum(lists(counted).values()), sum(walks(counted).values())) == before


def test_reads_answer_the_written_values(counted: CountingStore, array: dict[str, bytes]) -> None:
    gw = Gateway(counted)
    for key in chunk_keys()[::7]:
        assert gw.read_file("/" + key) == array[key]


def test_commit_is_visible_at_once_and_outside_writes_after_the_ttl(
    counted: CountingStore, array: dict[str, bytes]
) -> None:
    now = [0.0]
    gw = Gateway(counted, GatewayConfig(ttl=5.0), clock=lambda: now[0])
    assert gw.stat("/arr/0/0").kind is EntryKind.FILE  # the walk ran
    chunk = array["arr/0/0"]
    gw.write_file("/arr/2/4", chunk[::-1])  # a chunk folder the walk filled
    assert gw.read_file("/arr/2/4") == chunk[::-1]
    gw.write_file("/arr/12/0", chunk)  # a folder the walk found absent
    assert gw.stat("/arr/12/0").size == len(chunk)
    assert "12" in [n for n, _ in gw.readdir("/arr")]
    assert [n for n, _ in gw.readdir("/arr/12")] == ["0"]
    counted.inner.set("arr/13/1", chunk)  # someone else writes the store
    with pytest.raises(KeyNotFound):
        gw.stat("/arr/13/1")  # the cached listing of arr/ does not name 13 yet
    now[0] = 5.0
    assert gw.stat("/arr/13/1").size == len(chunk)
    counted.inner.set("arr/13/2", chunk)
    # a listing of arr/13/ answers until the TTL; a local disk was asked for 13/1 alone
    # (no listing of arr/13/ cached) and shows 13/2 at once: fresher, never staler
    assert (gw.lookup("/arr/13/2") is None) is not counted.traits.cheap_stat
    gw.drop_caches()
    assert gw.lookup("/arr/13/2") is not None
    if counted.traits.flat_listing_preferred:
        assert walks(counted) == {"arr/": 3}  # at first, after the TTL, after drop_caches


def test_walk_budget_leaves_the_rest_to_folder_listings(counted: CountingStore) -> None:
    """A budget of 13 keys: .zarray, .zattrs, arr/0/* and arr/1/* (5 each) and arr/10/0
    (in key order); arr/0/ and arr/1/ are answered by the walk, every other folder (arr/
    included: its keys may go on) by its own LIST."""
    gw = Gateway(counted, GatewayConfig(flat_list_keys=13))
    for key in chunk_keys():
        assert gw.stat("/" + key).kind is EntryKind.FILE
    with pytest.raises(KeyNotFound):
        gw.stat("/arr/5/9")
    if counted.traits.flat_listing_preferred:
        assert walks(counted) == {"arr/": 1}
        assert lists(counted) == {f"arr/{i}/": 1 for i in range(2, ROWS)}


def test_flat_listings_off(counted: CountingStore) -> None:
    gw = Gateway(counted, GatewayConfig(flat_list_keys=0))
    for key in chunk_keys():
        gw.stat("/" + key)
    assert not walks(counted)
    # (a local disk stats each file instead: no folder listed at all)
    assert lists(counted) == (
        {} if counted.traits.cheap_stat else {f"arr/{i}/": 1 for i in range(ROWS)}
    )


def test_big_array_is_split_and_walked_in_parallel(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With pages of 4 keys, a 3-level array of 3 x 4 x 4 chunks is split: one LIST of the
    array names its first-level folders, each walked flat, several pages each."""
    monkeypatch.setattr(walks_module, "PAGE", 4)
    written = tmp_path / "written"
    values = np.arange(6 * 8 * 8, dtype="uint8").reshape(6, 8, 8)
    array = zarr.create_array(
        store=str(written / "arr"), shape=values.shape, chunks=(2, 2, 2), dtype="uint8",
        zarr_format=2, chunk_key_encoding={"name": "v2", "separator": "/"}, compressors=None,
    )  # fmt: skip
    array[...] = values
    inner = new_store(kind, request, tmp_path)
    for path in written.rglob("*"):
        if path.is_file():
            inner.set(path.relative_to(written).as_posix(), path.read_bytes())
    store = CountingStore(inner)
    gw = Gateway(store)
    for i in range(3):
        for j in range(4):
            assert [n for n, _ in gw.readdir(f"/arr/{i}/{j}")] == ["0", "1", "2", "3"]
            assert (
                gw.read_file(f"/arr/{i}/{j}/3")
                == values[2 * i : 2 * i + 2, 2 * j : 2 * j + 2, 6:8].tobytes()
            )
    if store.traits.flat_listing_preferred:
        assert walks(store) == {"arr/0/": 1, "arr/1/": 1, "arr/2/": 1}
        assert below(store, "arr/") == 1 == lists(store)["arr/"]  # the plan's LIST
    else:
        assert below(store, "arr/") == 3 + 12


def twelve_parts(tmp: Path) -> dict[str, bytes]:
    """A 3-level Zarr v2 array of 12 x 2 x 2 chunks written by zarr-python: key -> bytes."""
    array = zarr.create_array(
        store=str(tmp / "arr"), shape=(24, 4, 4), chunks=(2, 2, 2), dtype="uint8",
        zarr_format=2, chunk_key_encoding={"name": "v2", "separator": "/"}, compressors=None,
    )  # fmt: skip
    array[...] = np.arange(24 * 16, dtype="uint8").reshape(24, 4, 4)
    return {
        path.relative_to(tmp).as_posix(): path.read_bytes()
        for path in tmp.rglob("*")
        if path.is_file()
    }


def settle(gw: Gateway) -> None:
    """Wait until no walk of ``gw`` reads anything (parts read ahead run in the background)."""
    for walk in list(gw.view.walks._walks.values()):
        with walk.cond:
            assert walk.cond.wait_for(partial(lambda w: not w.running, walk), WAIT)


def test_parts_are_walked_when_needed_and_again_after_the_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split into 12 first-level folders (pages of 2 keys), a lookup in ``arr/1/`` walks that
    part and the next in name order (``arr/10/``) and in grid order (``arr/2/``), no other;
    past the TTL, a lookup there walks those again, and nothing else."""
    monkeypatch.setattr(walks_module, "PAGE", 2)
    store = CountingStore(MemoryStore())
    for key, value in twelve_parts(tmp_path).items():
        store.inner.set(key, value)
    now = [0.0]
    gw = Gateway(store, GatewayConfig(ttl=5.0), clock=lambda: now[0])
    assert gw.stat("/arr/1/0/1").kind is EntryKind.FILE
    settle(gw)
    assert walks(store) == {"arr/1/": 1, "arr/10/": 1, "arr/2/": 1}
    assert lists(store) == {"arr/": 1}  # the plan
    for i in (1, 2, 10):
        assert [n for n, _ in gw.readdir(f"/arr/{i}/1")] == ["0", "1"]
    assert sum(walks(store).values()) == 3
    assert lists(store) == {"arr/": 1}
    now[0] = 6.0
    assert gw.stat("/arr/2/1/0").kind is EntryKind.FILE
    settle(gw)
    assert walks(store) == {"arr/1/": 1, "arr/10/": 1, "arr/2/": 2, "arr/3/": 1}


def test_an_impatient_waiter_lists_its_folder_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once pages are timed, a waiter whose part does not answer within two pages' time
    (here: held) lists its folder itself; the walk fills the rest when it comes."""
    monkeypatch.setattr(walks_module, "PAGE", 2)
    monkeypatch.setattr(walks_module, "MIN_PATIENCE", 0.01)
    store = CountingStore(MemoryStore())
    for key, value in twelve_parts(tmp_path).items():
        store.inner.set(key, value)
    held = store.gate("walk", "arr/5/", when="before", times=None)
    gw = Gateway(store)
    try:
        assert gw.stat("/arr/0/0/0").kind is EntryKind.FILE  # times pages (arr/0/, 1/, 10/)
        settle(gw)
        assert gw.stat("/arr/5/1/1").kind is EntryKind.FILE  # arr/5/ is held
        assert lists(store)["arr/5/1/"] == 1
    finally:
        held.release()
    assert [n for n, _ in gw.readdir("/arr/6/0")] == ["0", "1"]  # read ahead with arr/5/


@pytest.mark.parametrize("page", [2, 6])  # 70 keys in 12 folders: split, or one walk
def test_a_big_array_answers_its_own_folder_before_its_chunk_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    """``ls`` of a big array's folder waits for the plan's one LIST, not for the walk of its
    chunk tree (split into first-level folders or not)."""
    monkeypatch.setattr(walks_module, "PAGE", page)
    store = CountingStore(MemoryStore())
    for key, value in zarr_v2_nested(tmp_path).items():
        store.inner.set(key, value)
    store.inner.set(".zgroup", b'{"zarr_format": 2}')  # in a group: its folder is walked too
    held = store.gate("walk", when="before", times=None)  # every walk held, LISTs pass
    gw = Gateway(store)
    try:
        with ThreadPoolExecutor(1) as pool:
            names = pool.submit(gw.readdir, "/arr")  # starts the walk; its chunk tree is held
            assert len(names.result(WAIT)) == 2 + ROWS
    finally:
        held.release()
    assert gw.stat("/arr/3/1").kind is EntryKind.FILE


def test_plain_trees_are_not_probed() -> None:
    """Outside arrays the first miss of a folder costs its LIST, not a detection (five GETs
    on S3): the cached listings above it hold no metadata name. Paths resolved one name at a
    time, as the kernel does."""
    inner = MemoryStore()
    for i in range(5):
        inner.set(f"docs/{i}/notes.txt", b"x")
    store = CountingStore(inner)
    gw = Gateway(store)
    assert gw.lookup("/docs") is not None  # lists the root
    probes = store.count("get_many")
    for i in range(5):
        assert gw.stat(f"/docs/{i}").kind is EntryKind.DIR
        assert gw.stat(f"/docs/{i}/notes.txt").size == 1
    assert store.count("get_many") == probes
    assert not walks(store)


def n5_dataset(tmp: Path) -> dict[str, bytes]:
    """An N5 dataset TensorStore wrote (``ts/vol``, 8 blocks, no root attributes): key ->
    bytes."""
    tensorstore_n5(tmp / "ts" / "vol", ramp((8, 8, 8)), [4, 4, 4])
    return {
        path.relative_to(tmp).as_posix(): path.read_bytes()
        for path in sorted(tmp.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("kind", ["memory", pytest.param("s3", marks=pytest.mark.s3)])
def test_detection_asks_only_for_what_the_listings_hold(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """TensorStore's way into a dataset (each name looked up as the kernel does, its
    ``attributes.json`` read, then a block): the folders' listings show which probe files
    exist, so detection sends no probe for the root and ``ts/``, and reads the dataset's
    ``attributes.json`` from the bytes the reader fetched (before: five probes a level).
    (A local disk's lookups stat a file alone, without a listing to go by.)"""
    inner = new_store(kind, request, tmp_path)
    data = n5_dataset(tmp_path / "written")
    for key, value in data.items():
        inner.set(key, value)
    store = CountingStore(inner)
    gw = Gateway(store, GatewayConfig(read_only=True))
    for path in ("/ts", "/ts/vol", "/ts/vol/attributes.json"):
        assert gw.lookup(path) is not None
    assert gw.read_file("/ts/vol/attributes.json") == data["ts/vol/attributes.json"]
    for path in ("/ts/vol/0", "/ts/vol/0/1", "/ts/vol/0/1/0"):
        assert gw.lookup(path) is not None
    assert gw.read_file("/ts/vol/0/1/0") == data["ts/vol/0/1/0"]
    assert gw.detector.folder("ts/vol/").kind is FolderKind.ARRAY
    assert store.count("get_many") == 0
    assert store.per_key("get")["ts/vol/attributes.json"] == 1  # the reader's own
    gw.close()


def test_metadata_committed_here_is_detected_at_once_and_others_by_the_listings_ttl() -> None:
    clock = Clock()
    store = CountingStore(MemoryStore())
    store.inner.set("g/README", b"x")
    store.inner.set("h/README", b"x")
    gw = Gateway(store, GatewayConfig(ttl=5.0), clock=clock)
    assert [name for name, _ in gw.readdir("/g")] == ["README"]
    assert [name for name, _ in gw.readdir("/h")] == ["README"]  # listed at 0
    assert gw.detector.folder("g/").kind is FolderKind.PLAIN
    assert store.count("get_many") == 0  # the listings hold no probe name
    gw.write_file("/g/.zgroup", b'{"zarr_format": 2}')  # this mount: patched, invalidated
    assert gw.detector.folder("g/").kind is FolderKind.GROUP
    clock.now = 3.0
    assert gw.detector.folder("h/").kind is FolderKind.PLAIN  # by the listing of 0
    store.inner.set("h/.zgroup", b'{"zarr_format": 2}')  # another writer
    clock.now = 4.9
    assert gw.detector.folder("h/").kind is FolderKind.PLAIN
    clock.now = 5.0  # the listing of h/ expired: so did the answer drawn from it
    assert gw.detector.folder("h/").kind is FolderKind.GROUP
    gw.close()


def test_failed_walk_falls_back_to_folder_listings(array: dict[str, bytes]) -> None:
    inner = MemoryStore()
    for key, value in array.items():
        inner.set(key, value)
    faulty = FaultyStore(inner)
    faulty.fail("list", StoreUnavailable, when=lambda prefix: prefix == "arr/")
    gw = Gateway(faulty)
    assert gw.stat("/arr/4/2").kind is EntryKind.FILE  # the walk failed; arr/4/ listed alone
    assert faulty.calls["list"] >= 2


# -- the batch rule: a walk never hides a commit ------------------------------------------------


@pytest.mark.parametrize("commit_at", [10.0, 11.0])  # same clock tick as the walk, or later
def test_walk_loaded_before_a_commit_does_not_hide_it(
    array: dict[str, bytes], commit_at: float
) -> None:
    inner = MemoryStore()
    for key, value in array.items():
        if key != "arr/1/4":  # the chunk the commit will add to an existing folder
            inner.set(key, value)
    store = CountingStore(inner)
    now = [0.0]
    gw = Gateway(store, GatewayConfig(ttl=5.0), clock=lambda: now[0])
    fh = gw.create("/arr/1/4", os.O_WRONLY)  # looked up now (a first walk ran)
    gw.write(fh, array["arr/1/4"], 0)
    now[0] = 10.0  # every listing and the first walk expire
    # the next walk of arr/ pauses between its LIST (done) and its answer (not yet handed over)
    walk = store.gate("walk", "arr/")
    try:
        with ThreadPoolExecutor(1) as pool:
            lister = pool.submit(gw.readdir, "/arr/1")  # starts the second walk
            walk.wait_reached()
            now[0] = commit_at
            gw.flush(fh)  # the commit lands while the walk's answer (without it) is on its way
            gw.release(fh)
            walk.release()
            lister.result(WAIT)  # its question began before the commit: either answer is right
    finally:
        walk.release()
    assert gw.stat("/arr/1/4").size == len(array["arr/1/4"])
    assert [name for name, _ in gw.readdir("/arr/1")] == ["0", "1", "2", "3", "4"]
    assert gw.view.listings.discarded >= 1  # the walk's arr/1/ was not stored


def test_peek_answers_past_the_ttl_and_never_loads_or_drops() -> None:
    now = [0.0]
    cache: LoadingCache[str] = LoadingCache(5.0, clock=lambda: now[0])
    assert cache.peek("d/") is None
    cache.put("d/", "listed")
    now[0] = 10.0  # expired: get answers None, peek what was listed
    assert cache.peek("d/") == "listed"
    assert cache.get("d/") is None
    assert cache.peek("d/") == "listed"  # a get drops nothing
    assert not cache.answers("d/")  # expired, and no slow load to serve stale: dropped
    assert cache.peek("d/") is None
    assert cache.load("d/", lambda: "again") == "again"
    cache.put("e/", "listed")
    cache.invalidate("e/")  # a commit: no guess from what it changed
    assert cache.peek("e/") is None


def test_batch_stores_holes_read_after_every_touch() -> None:
    now = [0.0]
    cache: LoadingCache[str] = LoadingCache(None, clock=lambda: now[0])
    cache.put("d/live", "patched")
    with cache.batch("d/") as batch:
        now[0] = 1.0
        cache.invalidate("d/early")  # before the reads below began
        cache.replace("d/late", lambda v: v)  # a change of a hole: it grounds the key
        cache.put("x/outside", "x")
        now[0] = 2.0
        stored = batch.fill([("d/early", "read at 1.5", 1.5), ("d/late", "read at 0.5", 0.5),
                             ("d/live", "walked", 0.5), ("d/new", "read at 0", 0.0),
                             ("e/other", "not under d/", 0.0)])  # fmt: skip
    assert stored == 2
    assert cache.get("d/early") == "read at 1.5"  # read after its invalidation: current
    assert cache.get("d/late") is None  # read before its change: never stored
    assert cache.get("d/live") == "patched"  # live entries are never overwritten
    assert cache.get("d/new") == "read at 0"
    assert cache.get("e/other") is None
    with cache.batch("d/") as batch:
        cache.clear()  # drop_caches: everything read before it is spoiled
        assert batch.fill([("d/a", "a", 2.0)]) == 0
        now[0] = 3.0
        assert batch.fill([("d/b", "b", 3.0)]) == 1  # read after the clear: stored
    with cache.batch("d/") as batch:
        cache.invalidate_prefix("d/sub/")
        assert batch.fill([("d/sub/a", "a", 3.0), ("d/other", "o", 3.0)]) == 1


def test_splitter_hands_out_each_folder_once_it_is_whole() -> None:
    splitter = FolderSplitter("a/", born=0.0)
    closed = []
    for when, key in enumerate(["a/.zarray", "a/0/0", "a/0/1", "a/1/0", "a/1/2/x", "a/z"]):
        closed += [(prefix, born) for prefix, _, born in splitter.add(KeyInfo(key, 1), when)]
    assert closed == [("a/0/", 1), ("a/1/2/", 4), ("a/1/", 3)]
    rest = {prefix: entries for prefix, entries, _ in splitter.finish()}
    assert sorted(rest["a/"].files) == [".zarray", "z"]
    assert rest["a/"].dirs == {"0", "1"}
    with pytest.raises(ValueError, match="key order"):
        splitter.add(KeyInfo("a/0/5", 1), 9.0)
    root = FolderSplitter("", born=0.0)  # the control name hides stored keys at the root
    for key in [".n5fs", ".n5fs/x", "f"]:
        root.add(KeyInfo(key, 1), 0.0)
    [(_, entries, _)] = root.finish()
    assert list(entries.files) == ["f"]
    assert not entries.dirs


def test_a_listing_slower_than_the_ttl_is_used_for_a_ttl_after_it_arrives() -> None:
    """A LIST of a huge folder that takes longer than the TTL (50,000 keys on a slow
    endpoint) is not stale on arrival: it answers for ``ttl`` seconds from then, instead of
    every lookup listing the folder again."""
    now = [0.0]
    cache: LoadingCache[int] = LoadingCache(5.0, clock=lambda: now[0])
    loads = 0

    def slow_list() -> int:
        nonlocal loads
        loads += 1
        now[0] += 30.0  # the listing takes 30 s, six TTLs
        return loads

    assert cache.load("zarr/", slow_list) == 1
    now[0] += 4.0
    assert cache.load("zarr/", slow_list) == 1  # 34 s after the LIST began, 4 s after it came
    now[0] += 1.0
    assert cache.load("zarr/", slow_list) == 2  # a TTL after it came: listed again
    assert loads == 2


def test_a_slow_listing_answers_past_its_ttl_while_one_refresh_runs_behind() -> None:
    """Stale-while-revalidate for slow loads only: once a slow listing expires, lookups get it
    at once while one load refreshes it on the pool (held here by an event, so the order is
    fixed); the refreshed value answers after that. An invalidation (a commit) is never
    answered stale: the refresh it overtook is not stored and the next caller waits."""
    now = [0.0]
    cache: LoadingCache[int] = LoadingCache(5.0, clock=lambda: now[0], revalidate_after=1.0)
    gate, started = threading.Event(), threading.Event()
    loads = []

    def slow_list() -> int:
        loads.append(len(loads) + 1)
        if len(loads) > 1:
            started.set()
            assert gate.wait(30)
        now[0] += 2.0  # two seconds: a slow listing
        return loads[-1]

    assert cache.load("zarr/", slow_list) == 1
    now[0] += 7.0  # past the TTL of 5 s, but a 2 s load lives four times as long: 8 s
    assert cache.load("zarr/", slow_list) == 1
    assert (cache.stale_hits, len(loads)) == (0, 1)
    now[0] += 3.0  # expired
    assert cache.load("zarr/", slow_list) == 1  # at once, stale; the refresh runs behind
    assert started.wait(30)
    assert cache.load("zarr/", slow_list) == 1  # still refreshing: one refresh, not two
    assert (cache.stale_hits, len(loads)) == (2, 2)
    gate.set()
    for _ in range(3000):  # the refresh lands on the pool thread
        if cache.get("zarr/") == 2:
            break
        time.sleep(0.01)
    assert cache.load("zarr/", slow_list) == 2

    now[0] += 10.0
    gate.clear()
    started.clear()
    assert cache.load("zarr/", slow_list) == 2  # stale, refresh 3 held
    assert started.wait(30)
    cache.invalidate("zarr/")  # a commit: the held refresh is overtaken
    gate.set()
    assert cache.load("zarr/", slow_list) == 4  # waits for a fresh load, never stale


def test_a_quick_listing_is_listed_again_at_expiry() -> None:
    now = [0.0]
    cache: LoadingCache[int] = LoadingCache(5.0, clock=lambda: now[0], revalidate_after=1.0)
    values = iter(range(1, 10))
    assert cache.load("small/", lambda: next(values)) == 1
    now[0] += 5.0
    assert cache.load("small/", lambda: next(values)) == 2  # the caller waits: it was quick
    assert cache.stale_hits == 0


def test_a_failed_refresh_ends_the_stale_answers() -> None:
    """A store fault during a background refresh: the expired value is dropped, so the next
    lookup loads again and answers the failure (EIO) instead of an ever older listing."""
    now = [0.0]
    cache: LoadingCache[int] = LoadingCache(5.0, clock=lambda: now[0], revalidate_after=1.0)
    failing = threading.Event()
    refreshed = threading.Event()

    def slow_list() -> int:
        now[0] += 2.0
        if failing.is_set():
            refreshed.set()
            raise StoreUnavailable("the endpoint is gone")
        return 1

    assert cache.load("zarr/", slow_list) == 1
    failing.set()
    now[0] += 10.0
    assert cache.load("zarr/", slow_list) == 1  # stale; the refresh fails behind
    assert refreshed.wait(30)
    for _ in range(3000):  # the failed flight lands on the pool thread
        if not cache.answers("zarr/"):
            break
        time.sleep(0.01)
    with pytest.raises(StoreUnavailable):
        cache.load("zarr/", slow_list)


def stats(store: CountingStore) -> list[str]:
    """The keys ``stat`` was asked for, in order."""
    return [call.key for call in store.calls_of("stat")]


def test_a_file_lookup_on_a_local_disk_stats_the_file_not_its_folder(tmp_path: Path) -> None:
    """Reading some chunks of a big tree cold: each file is one stat, not a scandir and a
    stat of every neighbour; a name with nothing on disk is a miss without a listing too (a
    stat storm of absent chunk keys); a folder, or a temp file, is the listing's to decide,
    and what follows in that folder too."""
    from n5fs.kvstore.tempnames import temp_name

    root = tmp_path / "store"
    (root / "a" / "sub").mkdir(parents=True)
    for i in range(50):
        (root / "a" / f"c{i}").write_bytes(b"x" * i)
    partial = temp_name("c1")
    (root / "a" / partial).write_bytes(b"a writer's temp file")
    store = CountingStore(FileStore(root))
    assert store.traits.cheap_stat
    gw = Gateway(store, GatewayConfig())
    attr = gw.stat("/a/c7")
    assert (attr.kind, attr.size) == (EntryKind.FILE, 7)
    assert stats(store) == ["a/c7"]
    assert lists(store)["a/"] == 0
    assert store.stat(f"a/{partial}") is None  # never a key, listed or asked
    store.clear()
    for missing in ("a/missing", "a/nowhere/c0", "b/c0"):
        with pytest.raises(KeyNotFound):
            gw.stat(f"/{missing}")
    assert lists(store) == {}  # nothing on disk: no listing needed to say so
    with pytest.raises(KeyNotFound):
        gw.stat(f"/a/{partial}")  # on disk, but no key: the listing decides
    assert lists(store)["a/"] == 1
    assert gw.stat("/a/sub").kind is EntryKind.DIR
    assert gw.stat("/a/c9").size == 9
    # then listed: by names (no stat of the 50 neighbours), a file's size by one stat at its
    # first question, remembered by the listing
    assert stats(store) == ["a/missing", "a/nowhere/c0", "b/c0", f"a/{partial}", "a/c9"]
    assert gw.stat("/a/c9").size == 9
    assert len(stats(store)) == 5  # (the same five: the size was remembered)
    assert lists(store)["a/"] == 1


def test_an_open_for_reading_on_a_local_disk_lists_nothing(tmp_path: Path) -> None:
    """Reading small files cold (lookup, open, read, release): the open fstats its own
    descriptor; it neither lists the folder nor looks the file up again. A writer's temp
    file is never opened, though it is on disk."""
    from n5fs.kvstore.tempnames import temp_name

    root = tmp_path / "store"
    (root / "a").mkdir(parents=True)
    for i in range(20):
        (root / "a" / f"c{i}").write_bytes(bytes([i]) * (i + 1))
    partial = temp_name("c5")  # (a new name at every call)
    (root / "a" / partial).write_bytes(b"half written")
    store = CountingStore(FileStore(root))
    gw = Gateway(store, GatewayConfig())
    for i in (3, 11):
        gw.stat(f"/a/c{i}")
        fh = gw.open(f"/a/c{i}", os.O_RDONLY)
        assert gw.read(fh, 100, 0) == bytes([i]) * (i + 1)
        gw.release(fh)
    assert lists(store)["a/"] == 0
    assert stats(store) == ["a/c3", "a/c11"]  # the lookups; each open fstats its descriptor
    for name, error in ((partial, KeyNotFound), ("", IsAPrefix), ("gone", KeyNotFound)):
        with pytest.raises(error):
            gw.open(f"/a/{name}".rstrip("/"), os.O_RDONLY)  # the namespace words it
    assert lists(store)["a/"] == 1  # the misses asked the folder's listing


def test_a_store_without_cheap_stat_answers_lookups_from_its_listing() -> None:
    inner = MemoryStore()
    for i in range(5):
        inner.set(f"a/c{i}", b"x" * i)
    store = CountingStore(inner)
    assert not store.traits.cheap_stat
    gw = Gateway(store, GatewayConfig())
    assert [gw.stat(f"/a/c{i}").size for i in range(5)] == list(range(5))
    assert stats(store) == []
    assert lists(store)["a/"] == 1


# -- a cold path is listed two names at a time ----------------------------------------------


def round_trip_store(keys: dict[str, bytes]) -> CountingStore:
    """A memory store that says its requests are round trips (as S3's do)."""
    inner = MemoryStore()
    inner.traits = dataclasses.replace(MemoryStore.traits, remote_reads=True)  # type: ignore[misc]
    for key, value in keys.items():
        inner.set(key, value)
    return CountingStore(inner)


def resolve(gw: Gateway, path: str) -> None:
    """Look up ``path`` one name at a time, as the kernel does."""
    names = path.strip("/").split("/")
    for end in range(1, len(names) + 1):
        assert gw.lookup("/" + "/".join(names[:end])) is not None


def test_a_cold_lookup_lists_the_folder_below_beside_its_own() -> None:
    """The LIST of ``a/`` starts while the root's is still on its way (gated there), not after
    it: a path of three names costs two round trips of LISTs, not three."""
    store = round_trip_store({"a/b/f.txt": b"xyz"})
    gw = Gateway(store, GatewayConfig(ttl=5.0))
    root = store.gate("list", "", when="before")
    ahead = store.gate("list", "a/", when="before")
    try:
        with ThreadPoolExecutor(1) as pool:
            looked = pool.submit(gw.lookup, "/a")
            root.wait_reached()
            ahead.wait_reached()  # the root's LIST has not answered yet
            root.release()
            ahead.release()
            assert looked.result(WAIT) is not None
    finally:
        root.release()
        ahead.release()
    resolve(gw, "/a/b/f.txt")
    assert gw.stat("/a/b/f.txt").size == 3
    assert gw.view.listings.loaded_behind == 2
    # (joins the LIST ahead, or finds its answer)
    assert not gw.view.listings.load("a/b/f.txt/", partial(pytest.fail, "not loaded ahead")).files
    # b was in a/'s listing: a/b/ is listed when asked; f.txt's guess lists a/b/f.txt/, empty
    assert lists(store) == {"": 1, "a/": 1, "a/b/": 1, "a/b/f.txt/": 1}


def test_no_list_ahead_for_metadata_names_arrays_strict_consistency_or_local_stores(
    tmp_path: Path,
) -> None:
    data = n5_dataset(tmp_path / "n5")  # ts/vol/attributes.json and its blocks
    store = round_trip_store(data)
    gw = Gateway(store, GatewayConfig(ttl=5.0))
    block = next(key for key in data if key.startswith("ts/vol/") and key.count("/") == 4)
    resolve(gw, "/ts/vol/attributes.json")
    resolve(gw, "/" + block)
    listed = set(lists(store))
    assert "ts/vol/attributes.json/" not in listed  # a format's metadata name is a file
    assert not {p for p in listed if p.startswith("ts/vol/") and p != "ts/vol/"}  # the walk's
    assert "ts/" in listed  # the root's lookup of ts listed ts/ ahead

    strict = round_trip_store(data)
    resolve(Gateway(strict, GatewayConfig(consistency="strict")), "/ts/vol/attributes.json")
    plain = CountingStore(MemoryStore())
    for key, value in data.items():
        plain.set(key, value)
    resolve(Gateway(plain, GatewayConfig(ttl=5.0)), "/ts/vol/attributes.json")
    for other in (strict, plain):
        assert set(lists(other)) == {"", "ts/", "ts/vol/"}  # one at a time, nothing guessed


def test_a_load_behind_overtaken_by_a_commit_is_not_stored() -> None:
    """A listing loaded ahead is a flight like any: one that read the store before a commit
    (held here between its read and its answer) is handed to nobody and not stored, and the
    next question loads again; a caller that asks while it flies joins it."""
    cache: LoadingCache[str] = LoadingCache(5.0, clock=lambda: 0.0)
    read, answer = threading.Event(), threading.Event()
    calls: list[str] = []

    def listing() -> str:
        calls.append("list")
        read.set()
        assert answer.wait(WAIT)
        return f"listing {len(calls)}"

    assert cache.load_behind("a/", listing)
    assert read.wait(WAIT)
    assert not cache.load_behind("a/", listing)  # one flight per key
    cache.replace("a/", lambda old: old + " + new")  # a commit patches a/: grounds the flight
    answer.set()
    for _ in range(3000):  # the grounded flight lands on the pool thread
        if cache.discarded:
            break
        time.sleep(0.01)
    assert cache.get("a/") is None
    assert cache.load("a/", listing) == "listing 2"  # loaded again, after the commit
    assert calls == ["list", "list"]
    assert cache.discarded == 1
    assert not cache.load_behind("a/", listing)  # a live value: nothing to load

    joined = LoadingCache[str](5.0, clock=lambda: 0.0)
    read.clear()
    answer.clear()
    assert joined.load_behind("b/", listing)
    assert read.wait(WAIT)
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(joined.load, "b/", listing)
        answer.set()
        assert waiter.result(WAIT) == "listing 3"
    assert len(calls) == 3  # the caller joined the flight: no LIST of its own
