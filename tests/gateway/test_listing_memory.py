"""Listings in little memory: a folder's files packed (names in one blob, sizes and mtimes in
arrays), listed by name alone on a local disk (each size one ``stat`` when first asked), read
by ``readdir`` without an object per entry, weighed by their bytes in a cache bounded by the
mount's budget; a listing dropped for room is listed again when asked, and no commit or LIST
in flight brings back what it held."""

from __future__ import annotations

import gc
import os
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from n5fs.gateway import EntryKind, Gateway, GatewayConfig
from n5fs.gateway.namespace.paths import (
    ENCODING,
    ERRORS,
    Attr,
    DirEntries,
    DirListing,
    FileMap,
    PackedFiles,
)
from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.file import FileStore
from n5fs.singleflight import LoadingCache
from n5fs.testing.doubles import CountingStore

NAMES = ["b", "a", "0.1", "10.0", "2.0", "é", "zz", "日本", ".zarray", "a b"]


def infos(prefix: str = "f/") -> list[KeyInfo]:
    return [
        KeyInfo(prefix + name, size, 1000.0 + size, None if size % 3 else f"etag{size}")
        for size, name in enumerate(NAMES)
    ]


def test_packed_files_answer_as_a_dict_of_their_listing() -> None:
    model = {info.key[2:]: info for info in infos()}
    packed = PackedFiles.of_infos("f/", infos())
    assert packed is not None
    assert dict(packed) == model
    assert list(packed) == sorted(model, key=lambda n: n.encode())  # byte order
    assert len(packed) == len(model)
    assert all(name in packed and packed[name] == info for name, info in model.items())
    assert "absent" not in packed
    assert packed.get("absent") is None
    assert "a" not in PackedFiles.of_infos("f/", [])  # type: ignore[operator]


def test_a_listing_of_names_stats_each_file_once_when_asked() -> None:
    asked: list[str] = []

    def stat_key(key: str) -> KeyInfo | None:
        asked.append(key)
        return None if key.endswith("gone") else KeyInfo(key, len(key), 7.0)

    packed = PackedFiles.of_names("d/", [b"b", b"gone", b"a"], stat_key)
    assert list(packed) == ["a", "b", "gone"]
    assert "gone" in packed  # listed; no stat to say so
    assert asked == []
    assert packed.known(0) is None
    assert packed["b"] == KeyInfo("d/b", 3, 7.0)
    assert packed["b"] == KeyInfo("d/b", 3, 7.0)
    assert packed.get("gone") is None  # removed since it was listed: no info
    assert packed.get("gone") is None
    assert asked == ["d/b", "d/gone"]  # each once
    assert packed.known(1) == (3, 7.0)


def test_a_file_map_over_a_packed_base_changes_like_a_dict() -> None:
    base = [KeyInfo(f"f/c{i:04}", i, float(i)) for i in range(1000)]
    packed = PackedFiles.of_infos("f/", base)
    assert packed is not None
    files, model = FileMap(packed), {info.key[2:]: info for info in base}
    for i in range(300):  # past sqrt(1000): folded into a new packed base on the way
        files = files.with_item(f"n{i}", KeyInfo(f"f/n{i}", i, 1.0)).without(f"c{i:04}")
        model[f"n{i}"] = KeyInfo(f"f/n{i}", i, 1.0)
        del model[f"c{i:04}"]
        if i % 97 == 0:
            assert len(files) == len(model)
    assert isinstance(files._base, PackedFiles)
    assert len(files._added) + len(files._removed) <= 64
    assert dict(files) == model
    assert len(files) == len(model)
    assert dict(packed) == {info.key[2:]: info for info in base}  # the old base is intact
    folded = files.packed()
    assert folded is not None
    assert dict(folded) == model


@pytest.mark.parametrize(
    "extras",
    [
        {},
        {"a": Attr(EntryKind.DIR)},  # replaces the stored file "a"
        {"0": Attr(EntryKind.DIR), "zzz": Attr(EntryKind.SYMLINK, 4), "c": Attr(EntryKind.FILE, 9)},
        {"b": Attr(EntryKind.FILE, 5), "aa": Attr(EntryKind.DIR), "~": Attr(EntryKind.DIR)},
    ],
)
def test_a_dir_listing_is_the_sorted_merge_of_files_and_the_rest(extras: dict[str, Attr]) -> None:
    packed = PackedFiles.of_infos("f/", infos())
    assert packed is not None
    expected = {
        name: Attr(EntryKind.FILE, info.size, info.mtime) for name, info in dict(packed).items()
    }
    expected.update(extras)
    want = sorted(expected.items(), key=lambda item: item[0].encode())
    listing = DirListing(packed, extras, writable=True)
    assert len(listing) == len(want)
    assert listing == want
    assert [listing[i] for i in range(len(listing))] == want
    assert listing[-1] == want[-1]
    for start in range(len(want) + 1):  # a kernel resumes at any offset
        rest = [
            (raw.decode(ENCODING, ERRORS), attr or listing.stored_attr(i))
            for i, raw, attr in listing.raw_from(start)
        ]
        assert rest == want[start:]


def test_a_dir_listing_of_names_stats_nothing_until_attributes_are_asked() -> None:
    asked: list[str] = []

    def stat_key(key: str) -> KeyInfo | None:
        asked.append(key)
        return KeyInfo(key, 1, 2.0)

    entries = DirEntries.from_names("d/", [b"x", b"y"], [b"sub"], stat_key)
    packed = entries.files.packed()
    assert packed is not None
    listing = DirListing(packed, {"sub": Attr(EntryKind.DIR)}, writable=False)
    assert [raw for _, raw, _ in listing.raw_from(0)] == [b"sub", b"x", b"y"]
    assert listing.stored_attr(1, ask=False) is None
    assert asked == []
    assert listing[2] == ("y", Attr(EntryKind.FILE, 1, 2.0, writable=False))
    assert asked == ["d/y"]


def test_a_packed_listing_costs_under_100_bytes_per_chunk_file() -> None:
    """Measured: what a folder's listing of 20,000 chunk names holds once made."""
    names = [f"{i}.{j}".encode() for i in range(200) for j in range(100)]
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        entries = DirEntries.from_names("arr/", names, [], lambda key: KeyInfo(key, 1, 1.0))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_entry = (after - before) / len(names)
    assert per_entry < 100, per_entry
    assert entries.nbytes / len(names) < 100
    assert entries.nbytes >= 0.9 * (after - before)  # the weight hardly understates it


def test_a_cache_bounded_by_bytes_drops_the_least_recently_used() -> None:
    cache: LoadingCache[str] = LoadingCache(None, weigh=len, max_bytes=10)
    for key in "abc":
        cache.put(key, key * 4)
    assert cache.get("a") is None  # 12 bytes: the oldest went
    assert cache.nbytes == 8
    assert cache.get("b") == "bbbb"  # used: now the most recent
    cache.put("d", "dddd")
    assert (cache.get("c"), cache.get("b")) == (None, "bbbb")
    assert cache.replace("b", lambda v: v * 2)  # grows: the others make room
    assert cache.get("d") is None
    assert cache.nbytes == 8
    cache.put("e", "e" * 50)  # larger than the whole budget: stays, alone
    assert cache.get("e") == "e" * 50
    assert len(cache) == 1
    assert cache.nbytes == 50
    cache.invalidate("e")
    assert cache.nbytes == 0
    assert cache.load("f", lambda: "ff") == "ff"
    cache.clear()
    assert (cache.nbytes, len(cache)) == (0, 0)
    assert cache.evicted == 4


def folders(root: Path, names: str, files: int = 40) -> None:
    for folder in names:
        (root / folder).mkdir(parents=True)
        for i in range(files):
            (root / folder / f"c{i}").write_bytes(b"x" * (i % 7))


def small_gateway(store: CountingStore) -> Gateway:
    """Room for about two listings of 40 files (a listing weighs some 1,100 bytes)."""
    return Gateway(store, GatewayConfig(cache_bytes=4 * 2600))


def test_listings_past_the_budget_are_dropped_and_listed_again(tmp_path: Path) -> None:
    folders(tmp_path, "abc")
    store = CountingStore(FileStore(tmp_path))
    gw = small_gateway(store)
    listings = gw.view.listings
    first = {f: list(gw.readdir(f"/{f}")) for f in "abc"}
    assert listings.get("a/") is None  # the least recently used went
    assert listings.get("c/") is not None
    assert listings.nbytes <= listings.max_bytes  # type: ignore[operator]
    assert gw.stats()["listings_evicted"] >= 1
    assert store.per_key("list")["a/"] == 1
    assert list(gw.readdir("/a")) == first["a"]  # listed again, the same
    assert store.per_key("list")["a/"] == 2
    assert gw.stat("/b/c3").size == 3


def test_a_commit_to_a_dropped_folder_brings_back_nothing_old(tmp_path: Path) -> None:
    folders(tmp_path, "abc")
    store = CountingStore(FileStore(tmp_path))
    gw = small_gateway(store)
    assert gw.stat("/a/c1").size == 1
    assert gw.readdir("/a")  # cached: c1 of one byte
    for f in "bc":
        gw.readdir(f"/{f}")
    assert gw.view.listings.get("a/") is None
    fh = gw.create("/a/c1", os.O_WRONLY | os.O_TRUNC)  # through the mount, while dropped
    gw.write(fh, b"new bytes", 0)
    gw.release(fh)
    gw.unlink("/a/c2")
    assert gw.stat("/a/c1").size == 9
    names = dict(gw.readdir("/a"))
    assert names["c1"].size == 9
    assert "c2" not in names
    assert len(names) == 39


def test_a_listing_in_flight_across_a_commit_is_not_kept(tmp_path: Path) -> None:
    """A LIST of a dropped folder that began before a commit there answers its caller but
    is not cached: the next question lists again and sees the commit (a gate between the
    LIST and its store)."""
    folders(tmp_path, "a")
    store = CountingStore(FileStore(tmp_path))
    gw = small_gateway(store)
    gate = store.gate("list", "a/")
    with ThreadPoolExecutor(1) as pool:
        old = pool.submit(lambda: list(gw.readdir("/a")))
        gate.wait_reached()
        fh = gw.create("/a/new", os.O_WRONLY)
        gw.write(fh, b"0123", 0)
        gw.release(fh)
        gate.release()
        assert "new" not in dict(old.result())  # its question began before the commit
    assert dict(gw.readdir("/a"))["new"].size == 4
    assert store.per_key("list")["a/"] == 2


def test_a_packing_without_etags_takes_files_with_them() -> None:
    """A listing that kept no ETags (a journaled file, a local store) patched with files that
    have one (an S3 commit): each keeps its own, none is invented."""
    base = PackedFiles.of_infos("d/", [KeyInfo("d/a", 1, 0.0), KeyInfo("d/c", 3, 0.0)])
    assert base is not None
    changed = base.changed({"b": KeyInfo("d/b", 2, 0.0, '"etag-b"')}, ())
    assert changed is not None
    infos = dict(changed.items())
    assert [(n, i.size, i.etag) for n, i in sorted(infos.items())] == [
        ("a", 1, None),
        ("b", 2, '"etag-b"'),
        ("c", 3, None),
    ]
