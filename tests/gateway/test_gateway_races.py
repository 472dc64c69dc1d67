"""Races of the gateway made deterministic: a store hook pauses one thread at the exact point
between a load and its use (or between a validation and its store write) while another
thread does the conflicting thing. Each reproduces a race the gateway once had (a listing or
detection result stored after a commit made it stale, a chunk validated under metadata that
changed before it landed, a rename storing other bytes than it validated) before its
concurrency model (docs/semantics.md, "Consistency and concurrency"); none relies
on luck.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from n5fs.errors import KeyNotFound, Rejected, errno_of
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.commit.ordering import ArrayOrder
from n5fs.gateway.namespace.paths import DirEntries, FileMap
from n5fs.kvstore.base import KeyInfo, KvStore
from n5fs.kvstore.keys import folders_above
from n5fs.kvstore.memory import MemoryStore
from n5fs.singleflight import LoadingCache
from n5fs.testing.doubles import WAIT, CountingStore
from n5fs.validate import Validator

# every lock checked against the gateway's lock order (tests/conftest.py)
pytestmark = pytest.mark.debug_locks

ZARRAY = {
    "zarr_format": 2,
    "shape": [16],
    "chunks": [4],
    "dtype": "|u1",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}


#: a read with its version is a read, a conditional write a write: gates stop either
READS = ("get", "get_versioned")
WRITES = ("set", "set_if")
#: every call that reads a value, batches too
ANY_READ = (*READS, "get_many")


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def result(future: Future[object]) -> object:
    return future.result(timeout=WAIT)


def gateway(store: KvStore, **kw: object) -> Gateway:
    return Gateway(store, GatewayConfig(**kw))  # type: ignore[arg-type]


def test_listing_loaded_before_a_commit_is_not_stored(pool: ThreadPoolExecutor) -> None:
    """The spurious ENOENT after rename: a LIST that began before a commit finished after it
    and was stored; the committed name then answered ENOENT until the TTL."""
    store = CountingStore(MemoryStore())
    store.inner.set("d/old", b"x")
    now = [0.0]
    gw = Gateway(store, GatewayConfig(ttl=5.0), clock=lambda: now[0])
    fh = gw.create("/d/tmp.partial", os.O_WRONLY)
    gw.write(fh, b"data", 0)
    gw.readdir("/d")  # the listing is cached and fresh
    committing = store.gate(WRITES, "d/final", when="before")
    rename = pool.submit(gw.rename, "/d/tmp.partial", "/d/final")
    committing.wait_reached()  # validated, about to store
    now[0] = 10.0  # the listing expires: the next question LISTs again
    listing = store.gate("list", "d/")
    lister = pool.submit(gw.readdir, "/d")
    listing.wait_reached()  # the LIST has returned, without the new name
    committing.release()
    result(rename)  # stored, and the cache told, while the LIST's answer is on its way
    listing.release()
    names = [name for name, _ in result(lister)]  # type: ignore[attr-defined]
    assert "final" not in names  # the lister's question began before the rename
    assert gw.stat("/d/final").size == 4  # ... but its stale answer was not kept
    assert [n for n, _ in gw.readdir("/d")] == ["final", "old"]
    gw.release(fh)


def test_listing_is_never_changed_under_a_reader() -> None:
    """readdir iterated a listing that commits patched in place ("dictionary changed size
    during iteration", answered EIO). Listings are immutable values now."""
    gw = gateway(MemoryStore())
    gw.write_file("/d/a", b"1")
    entries = gw.view.entries("d/")
    names = iter(entries.files)
    first = next(names)
    gw.write_file("/d/b", b"2")
    assert [first, *names] == ["a"]  # the iteration went on undisturbed
    assert set(gw.view.entries("d/").files) == {"a", "b"}


def test_one_list_per_folder_however_many_threads_miss(pool: ThreadPoolExecutor) -> None:
    store = CountingStore(MemoryStore())
    store.inner.set("d/a", b"1")
    gw = gateway(store)
    gate = store.gate("list", "d/")
    first = pool.submit(gw.stat, "/d/a")
    gate.wait_reached()
    others = [pool.submit(gw.stat, "/d/a") for _ in range(3)]
    gate.release()
    assert all(result(f).size == 1 for f in [first, *others])  # type: ignore[attr-defined]
    assert store.count("list", "d/") == 1


def test_detection_begun_before_the_array_existed_is_not_kept(pool: ThreadPoolExecutor) -> None:
    """A folder detected as plain while its .zarray was being committed was cached as plain:
    chunks then went in as "other", unvalidated, in strict mode."""
    store = CountingStore(MemoryStore())
    now = [0.0]
    gw = Gateway(store, GatewayConfig(ttl=5.0), clock=lambda: now[0])
    committing = store.gate(WRITES, "arr/.zarray", when="before")
    create = pool.submit(gw.write_file, "/arr/.zarray", json.dumps(ZARRAY).encode())
    committing.wait_reached()  # validated (the folder was plain), about to store
    now[0] = 10.0  # cached detections expire
    probing = store.gate("get_many", "arr/*")
    probe = pool.submit(gw.detector.folder, "arr/")
    probing.wait_reached()  # probed: no metadata there yet
    committing.release()
    result(create)
    probing.release()
    assert result(probe).kind.value == "plain"  # type: ignore[attr-defined]
    with pytest.raises(Rejected):
        gw.write_file("/arr/0", b"too long for a 4-byte chunk")
    assert store.inner.get("arr/0") is None


def test_chunk_commit_and_dtype_change_are_ordered(pool: ThreadPoolExecutor) -> None:
    """A chunk validated against the old metadata could land after a dtype change passed its
    "no chunks exist" check. Now the metadata commit waits for the chunk commit."""
    store = CountingStore(MemoryStore())
    gw = gateway(store)
    gw.write_file("/arr/.zarray", json.dumps(ZARRAY).encode())
    gate = store.gate(WRITES, "arr/0", when="before")
    chunk = pool.submit(gw.write_file, "/arr/0", b"abcd")
    gate.wait_reached()  # validated under |u1, about to be stored
    change = pool.submit(
        gw.write_file, "/arr/.zarray", json.dumps({**ZARRAY, "dtype": "<u2"}).encode()
    )
    assert not change.done()
    gate.release()
    result(chunk)
    with pytest.raises(Rejected):  # the chunk is there now: the change would reinterpret it
        result(change)
    assert json.loads(store.inner.get("arr/.zarray") or b"")["dtype"] == "|u1"
    assert Validator(store.inner).run().ok


def test_concurrent_metadata_commits_keep_every_consolidated_entry(
    pool: ThreadPoolExecutor,
) -> None:
    """Two upkeeps of .zmetadata read the same document and the second write lost the first
    one's entry."""
    store = CountingStore(MemoryStore())
    gw = gateway(store)
    gw.write_file("/.zgroup", b'{"zarr_format": 2}')
    gw.write_file(
        "/.zmetadata",
        json.dumps(
            {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}
        ).encode(),
    )
    gate = store.gate(READS, ".zmetadata")  # upkeep has read the document
    first = pool.submit(gw.write_file, "/a/.zarray", json.dumps(ZARRAY).encode())
    gate.wait_reached()
    second = pool.submit(gw.write_file, "/b/.zarray", json.dumps(ZARRAY).encode())
    gate.release()
    result(first)
    result(second)
    doc = json.loads(store.inner.get(".zmetadata") or b"")
    assert {"a/.zarray", "b/.zarray"} <= doc["metadata"].keys()


def test_rename_stores_the_bytes_it_validated(pool: ThreadPoolExecutor) -> None:
    """A rename validated one snapshot of the staged bytes and stored another: a write on
    another handle in between put unvalidated bytes under a chunk name."""
    store = CountingStore(MemoryStore())
    gw = gateway(store)
    gw.write_file("/arr/.zarray", json.dumps(ZARRAY).encode())
    fh = gw.create("/arr/0.partial", os.O_WRONLY)
    gw.write(fh, b"good", 0)
    gate = store.gate(WRITES, "arr/0", when="before")
    rename = pool.submit(gw.rename, "/arr/0.partial", "/arr/0")
    gate.wait_reached()  # validated "good", about to store
    spoil = pool.submit(gw.write, fh, b"bad bytes, far too long", 0)
    gate.release()
    result(rename)
    result(spoil)
    gw.release(fh)
    assert store.inner.get("arr/0") == b"good"
    assert Validator(store.inner).run().ok


def test_refused_new_file_can_be_created_again_at_once() -> None:
    """After a refused close() the kernel keeps the name; the retried open(O_CREAT) arrives
    as a plain open and answered ENOENT until the TTL."""
    gw = gateway(MemoryStore())
    gw.write_file("/arr/.zarray", json.dumps(ZARRAY).encode())
    with pytest.raises(Rejected):
        gw.write_file("/arr/1", b"bad")
    with pytest.raises(KeyNotFound):
        gw.stat("/arr/1")
    fh = gw.open("/arr/1", os.O_WRONLY)  # what the kernel sends for the retry
    gw.write(fh, b"good", 0)
    gw.flush(fh)
    gw.release(fh)
    assert gw.read_file("/arr/1") == b"good"
    with pytest.raises(KeyNotFound):
        gw.open("/arr/2", os.O_WRONLY)  # never refused: an ordinary ENOENT


def test_subscribers_hear_of_refusals_and_derived_writes() -> None:
    gw = gateway(MemoryStore())
    heard: list[str] = []
    gw.subscribe(heard.extend)
    kernel: list[str] = []  # the FUSE front's way: not told of the bytes it wrote itself
    gw.subscribe(kernel.extend, own_writes=False)
    gw.write_file("/.zgroup", b'{"zarr_format": 2}')
    gw.write_file(
        "/.zmetadata",
        json.dumps(
            {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}
        ).encode(),
    )
    heard.clear()
    kernel.clear()
    gw.write_file("/a/.zarray", json.dumps(ZARRAY).encode())
    assert {"/a/.zarray", "/.zmetadata"} <= set(heard)
    assert kernel == ["/.zmetadata"]  # rewritten by the gateway: news to the kernel
    heard.clear()
    kernel.clear()
    with pytest.raises(Rejected):
        gw.write_file("/a/0", b"bad")
    assert heard == kernel == ["/a/0"]
    gw.write_file("/a/0", b"good")
    assert heard == ["/a/0", "/a/0"]
    assert kernel == ["/a/0"]  # the refusal only


def test_o_trunc_never_reads_the_stored_object() -> None:
    store = CountingStore(MemoryStore())
    store.inner.set("big", bytes(8 << 20))
    gw = gateway(store)
    fh = gw.open("/big", os.O_WRONLY | os.O_TRUNC)
    gw.write(fh, b"tiny", 0)
    gw.flush(fh)
    gw.release(fh)
    assert store.count(ANY_READ, "big") == 0
    assert store.inner.get("big") == b"tiny"


def test_small_rewrite_of_a_big_file_fetches_by_range() -> None:
    store = CountingStore(MemoryStore())
    original = os.urandom(40 << 20)
    store.inner.set("big", original)
    gw = gateway(store, spill_bytes=4 << 20, staging_bytes=8 << 20)
    fh = gw.open("/big", os.O_RDWR)
    gw.write(fh, b"XY", 1000)
    assert store.count(ANY_READ) == 0  # nothing fetched to write two bytes
    gw.flush(fh)
    gw.release(fh)
    reads = store.calls_of(ANY_READ, "big")
    assert all(c.byte_range is not None and (c.byte_range.length or 0) <= 16 << 20 for c in reads)
    assert store.inner.get("big") == original[:1000] + b"XY" + original[1002:]


def test_staging_memory_is_one_budget() -> None:
    gw = gateway(MemoryStore(), staging_bytes=4 << 20, spill_bytes=64 << 20)
    handles = [gw.create(f"/f{i}", os.O_WRONLY) for i in range(4)]
    for fh in handles:
        gw.write(fh, bytes(3 << 20), 0)
        assert gw.budget.used <= 4 << 20
    for fh in handles:
        gw.flush(fh)
        gw.release(fh)
    assert gw.budget.used == 0
    assert all(len(gw.read_file(f"/f{i}")) == 3 << 20 for i in range(4))


def test_loading_cache_grounds_flights_on_every_kind_of_change() -> None:
    cache: LoadingCache[int] = LoadingCache(None)
    started, finish = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        finish.wait(WAIT)
        return 1

    for change in (
        lambda: cache.invalidate("k"),
        lambda: cache.invalidate_prefix(""),
        cache.clear,
        lambda: cache.replace("k", lambda v: v + 1),
    ):
        started.clear()
        finish.clear()
        with ThreadPoolExecutor(1) as one:
            loading = one.submit(cache.load, "k", slow)
            assert started.wait(WAIT)
            change()
            finish.set()
            assert loading.result(WAIT) == 1
        assert cache.get("k") is None  # the overtaken load was not stored
        assert cache.load("k", lambda: 2) == 2
        cache.clear()


def test_negative_detection_is_cached_until_the_metadata_changes() -> None:
    store = CountingStore(MemoryStore())
    store.inner.set("x/.zarray", b'{"zarr_format": 2}')  # lacks every other key
    gw = gateway(store)
    for _ in range(3):
        with pytest.raises(Rejected):
            gw.detector.folder("x/")
    assert store.count(ANY_READ, "x/.zarray") == 1
    gw.write_file("/x/.zarray", json.dumps(ZARRAY).encode())
    assert gw.detector.folder("x/").kind.value == "array"


def test_folder_locks_exclude_and_share(pool: ThreadPoolExecutor) -> None:
    order = ArrayOrder()
    inside, leave, meta_in = threading.Event(), threading.Event(), threading.Event()

    def chunk() -> None:
        with order.for_keys(["a/0"]):
            inside.set()
            leave.wait(WAIT)

    def metadata() -> None:
        with order.for_keys([], metadata=["a/.zarray"]):
            meta_in.set()

    first = pool.submit(chunk)
    assert inside.wait(WAIT)
    with order.for_keys(["a/1"]):  # chunk commits share the array folder
        pass
    with order.for_keys(["b/0"], metadata=["b/.zarray"]):  # another array: no wait
        pass
    meta = pool.submit(metadata)
    assert not meta_in.wait(0.2)  # excluded while the chunk commit holds the folder
    leave.set()
    result(first)
    result(meta)
    assert meta_in.is_set()
    assert order.held_count() == 0


def test_dir_entries_changes_make_new_values() -> None:
    entries = DirEntries()
    grown = entries.with_dir("x")
    assert entries.dirs == frozenset()
    assert grown.dirs == {"x"}


@settings(max_examples=200, deadline=None)
@given(
    base=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 9), max_size=8),
    changes=st.lists(st.tuples(st.booleans(), st.sampled_from("abcdefghij"), st.integers(0, 9))),
)
def test_file_map_behaves_as_a_dict_and_never_changes(base, changes) -> None:
    """Listings change by overlay (cheap for 50,000-chunk folders); old values stay as they
    were for any thread still reading them."""
    info = lambda name, size: KeyInfo(name, size)
    model = {k: info(k, v) for k, v in base.items()}
    current = FileMap(dict(model))
    for add, name, size in changes:
        before, frozen = current, dict(current)
        if add:
            current = current.with_item(name, info(name, size))
            model[name] = info(name, size)
        else:
            current = current.without(name)
            model.pop(name, None)
        assert dict(before) == frozen
        assert dict(current) == model
        assert len(current) == len(model)
        assert all((n in current) == (n in model) for n in "abcdefghij")


def test_file_map_folds_its_overlay_and_stays_right() -> None:
    model = {f"c{i}": KeyInfo(f"c{i}", i) for i in range(1000)}
    current = FileMap(dict(model))
    for i in range(500):  # past sqrt(1000): folded at least once
        current = current.with_item(f"n{i}", KeyInfo(f"n{i}", i)).without(f"c{i}")
        model[f"n{i}"] = KeyInfo(f"n{i}", i)
        del model[f"c{i}"]
    assert dict(current) == model
    assert len(current._added) + len(current._removed) <= 64


def test_create_waiting_on_a_renamed_over_name_joins_the_new_file(
    pool: ThreadPoolExecutor,
) -> None:
    """A create that waited for the lock of a name while a rename replaced that name must end
    up on the file now there, or two handles of one name would stage apart."""
    store = CountingStore(MemoryStore())
    store.inner.set("d/a", b"from a")
    store.inner.set("d/b", b"old b")
    gw = gateway(store)
    moving = store.gate(WRITES, "d/b", when="before")
    pending = gw.create("/d/a", os.O_WRONLY)  # staged: the rename stores by set
    gw.write(pending, b"from a", 0)
    rename = pool.submit(gw.rename, "/d/a", "/d/b")
    moving.wait_reached()  # holds the nodes of d/a and d/b
    create = pool.submit(gw.create, "/d/b", os.O_WRONLY)
    moving.release()
    result(rename)
    fh = result(create)
    assert gw.files.handle(fh).node is gw.files.node("d/b")  # type: ignore[arg-type]
    gw.write(fh, b"new", 0)  # type: ignore[arg-type]
    reader = gw.open("/d/b", os.O_RDONLY)
    assert gw.read(reader, 100, 0) == b"newm a"  # one shared staging buffer
    for handle in (reader, fh, pending):
        gw.flush(handle)  # type: ignore[arg-type]
        gw.release(handle)  # type: ignore[arg-type]
    assert store.inner.get("d/b") == b"newm a"


def test_write_past_the_size_limit_is_efbig_and_changes_nothing() -> None:
    gw = gateway(MemoryStore(), max_file_size=1000)
    fh = gw.create("/f", os.O_WRONLY)
    gw.write(fh, b"abc", 0)
    with pytest.raises(OSError) as info:
        gw.write(fh, b"x", 1000)
    assert errno_of(info.value) == errno.EFBIG
    with pytest.raises(OSError):
        gw.truncate("/f", 1001, fh)
    gw.flush(fh)
    gw.release(fh)
    assert gw.read_file("/f") == b"abc"


def test_chunk_too_large_to_validate_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    gw = gateway(MemoryStore())
    gw.write_file("/arr/.zarray", json.dumps(ZARRAY).encode())
    monkeypatch.setattr("n5fs.gateway.commit.committer.MAX_VALIDATED_BYTES", 3)
    with pytest.raises(Rejected) as info:
        gw.write_file("/arr/0", b"abcd")
    assert info.value.rule == "too-large-to-validate"
    gw.write_file("/arr/notes.txt", b"other keys are never read: any size")


def test_directory_rename_announces_the_consolidated_metadata_it_rewrote() -> None:
    gw = gateway(MemoryStore())
    gw.write_file("/.zgroup", b'{"zarr_format": 2}')
    gw.write_file(
        "/.zmetadata",
        json.dumps(
            {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}
        ).encode(),
    )
    gw.write_file("/a/.zarray", json.dumps(ZARRAY).encode())
    heard: list[str] = []
    gw.subscribe(heard.extend)
    gw.rename("/a", "/b")
    assert {"/a", "/b", "/.zmetadata"} <= set(heard)
    assert "b/.zarray" in json.loads(gw.read_file("/.zmetadata"))["metadata"]


def test_folders_above_a_key_root_first() -> None:
    assert folders_above("a/b/c") == ["", "a/", "a/b/"]
    assert folders_above("c") == [""]
