"""Many mounts of one store, gateway level: two or three :class:`Gateway` objects over one
:class:`MemoryStore` are mounts on different nodes of one bucket (the memory store honours
conditional writes as S3 does: a version per key, ``set_if`` checked atomically). Each
gateway has its own caches and clock, so "node B still caches what it saw" is exact, and
races between nodes are made deterministic with gates of
:class:`~n5fs.testing.doubles.CountingStore`, as in ``test_gateway_races``.
The same behaviour through real daemons on the moto server is ``test_mount_many_mounts.py``.
"""

from __future__ import annotations

import errno
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from n5fs.errors import KeyNotFound, Rejected, StaleVersion, VersionConflict, errno_of
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.commit.conditional import STALE_RULE
from n5fs.gateway.commit.consolidated import ATTEMPTS, MAX_PAUSE
from n5fs.kvstore.base import KvStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import Clock, CountingStore, FaultyStore
from n5fs.validate import Validator
from tests.gateway.test_gateway_races import READS, WRITES, ZARRAY, result


def node(store: KvStore, **config: object) -> Gateway:
    """A node: its own gateway, and a clock of its own that moves only when a test moves it."""
    return Gateway(store, GatewayConfig(**config), clock=Clock())  # type: ignore[arg-type]


def doc(store: MemoryStore, key: str) -> dict[str, object]:
    raw = store.get(key)
    assert raw is not None, key
    loaded: dict[str, object] = json.loads(raw)
    return loaded


def zarray(**changes: object) -> bytes:
    return json.dumps({**ZARRAY, **changes}).encode()


def consolidated_root(gw: Gateway) -> None:
    """A Zarr v2 root group with a consolidated ``.zmetadata`` that upkeep then keeps."""
    gw.write_file("/.zgroup", b'{"zarr_format": 2}')
    root = {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}
    gw.write_file("/.zmetadata", json.dumps(root).encode())


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def test_conditional_writes_are_in_force_on_a_store_that_keeps_versions() -> None:
    gw = node(MemoryStore())
    assert gw.conditional.in_force
    assert gw.control.settings() == {"consistency": "ttl", "conditional_writes": "in force"}
    off = node(MemoryStore(), conditional="off")
    assert not off.conditional.in_force
    assert "off" in off.control.settings()["conditional_writes"]


def test_two_nodes_creating_one_array_give_one_winner_and_one_clear_error() -> None:
    store = MemoryStore()
    a, b = node(store), node(store)
    assert b.lookup("/arr/.zarray") is None  # B has seen the folder without the array
    a.write_file("/arr/.zarray", zarray())
    with pytest.raises(StaleVersion) as refused:
        b.write_file("/arr/.zarray", zarray(dtype="<u2"))
    assert errno_of(refused.value) == errno.EAGAIN
    assert refused.value.rule == STALE_RULE
    assert doc(store, "arr/.zarray")["dtype"] == "|u1"  # the winner's document stands
    assert [r.rule for r in b.rejections] == [STALE_RULE]
    # B dropped what it cached: it now reads the winner's document, and a retry that
    # builds on it succeeds
    assert json.loads(b.read_file("/arr/.zarray"))["dtype"] == "|u1"
    b.write_file("/arr/.zarray", zarray(shape=[32]))
    assert doc(store, "arr/.zarray")["shape"] == [32]


def test_the_same_document_created_by_two_nodes_is_no_conflict() -> None:
    store = MemoryStore()
    a, b = node(store), node(store)
    assert b.lookup("/arr/.zarray") is None
    a.write_file("/arr/.zarray", zarray())
    version = store.get_versioned("arr/.zarray")
    b.write_file("/arr/.zarray", zarray())  # TensorStore's open-or-create on every worker
    assert store.get_versioned("arr/.zarray") == version  # nothing was written again
    assert b.rejections == []


def test_no_lost_attribute_update_between_two_nodes() -> None:
    store = MemoryStore()
    a, b = node(store), node(store)
    a.write_file("/arr/.zarray", zarray())
    a.write_file("/arr/.zattrs", b"{}")
    fa = a.open("/arr/.zattrs", os.O_RDWR)
    fb = b.open("/arr/.zattrs", os.O_RDWR)  # both read version 1
    a.write(fa, b'{"a": 1}', 0)
    a.flush(fa)
    b.write(fb, b'{"b": 2}', 0)
    with pytest.raises(StaleVersion):
        b.flush(fb)
    b.release(fb)
    a.release(fa)
    assert doc(store, "arr/.zattrs") == {"a": 1}
    # the retry reads the current document and adds its change to it
    merged = {**json.loads(b.read_file("/arr/.zattrs")), "b": 2}
    b.write_file("/arr/.zattrs", json.dumps(merged).encode())
    assert doc(store, "arr/.zattrs") == {"a": 1, "b": 2}


def test_a_node_keeps_committing_through_one_handle() -> None:
    """The base of a handle moves with its own commits: write, fsync, write, close."""
    store = MemoryStore()
    gw = node(store)
    fh = gw.create("/arr/.zarray")
    gw.write(fh, zarray(), 0)
    gw.fsync(fh)
    gw.write(fh, zarray(shape=[32]), 0)
    gw.flush(fh)
    gw.release(fh)
    assert doc(store, "arr/.zarray")["shape"] == [32]


def test_a_write_between_read_and_put_is_caught(pool: ThreadPoolExecutor) -> None:
    """Node B validated against version 1 and is about to write; node A's resize lands in
    between. B's conditional write fails: it would have validated against stale metadata."""
    store = MemoryStore()
    hooked = CountingStore(store)
    a, b = node(store), node(hooked)
    a.write_file("/arr/.zarray", zarray())
    gate = hooked.gate(WRITES, "arr/.zarray", when="before")
    change = pool.submit(b.write_file, "/arr/.zarray", zarray(shape=[8]))
    gate.wait_reached()  # B read and validated version 1, about to write
    a.write_file("/arr/.zarray", zarray(shape=[64]))
    gate.release()
    with pytest.raises(StaleVersion, match="now written again"):
        result(change)
    assert doc(store, "arr/.zarray")["shape"] == [64]


def test_the_same_document_landing_between_read_and_put_is_no_conflict(
    pool: ThreadPoolExecutor,
) -> None:
    """zarr-python's ``create_array`` on every node writes the root group's ``.zattrs`` if it
    is absent: node B read "absent", node A creates the same bytes, then B's create-only
    write loses. What B wanted is what the store holds: no conflict (it was EAGAIN, and a
    three-node ``create_array`` run failed under load)."""
    store = MemoryStore()
    hooked = CountingStore(store)
    a, b = node(store), node(hooked)
    gate = hooked.gate(WRITES, ".zattrs", when="before")
    create = pool.submit(b.write_file, "/.zattrs", b"{}")
    gate.wait_reached()  # B read the key absent and validated, about to write
    a.write_file("/.zattrs", b"{}")
    version = store.get_versioned(".zattrs")
    gate.release()
    result(create)
    assert store.get_versioned(".zattrs") == version  # A's write stands, written once
    assert b.rejections == []
    assert b.read_file("/.zattrs") == b"{}"


def test_other_bytes_landing_between_read_and_put_stay_a_conflict(
    pool: ThreadPoolExecutor,
) -> None:
    store = MemoryStore()
    hooked = CountingStore(store)
    a, b = node(store), node(hooked)
    gate = hooked.gate(WRITES, ".zattrs", when="before")
    create = pool.submit(b.write_file, "/.zattrs", b'{"b": 1}')
    gate.wait_reached()
    a.write_file("/.zattrs", b'{"a": 1}')
    gate.release()
    with pytest.raises(StaleVersion, match="now written again"):
        result(create)
    assert doc(store, ".zattrs") == {"a": 1}


def test_rename_onto_metadata_compares_with_the_version_seen() -> None:
    """TensorStore and zarr-python write a temp file and rename it onto the document."""
    store = MemoryStore()
    a, b = node(store), node(store)
    a.write_file("/arr/.zarray", zarray())
    assert b.lookup("/arr/.zarray") is not None  # B has seen version 1
    a.write_file("/arr/.zarray", zarray(shape=[64]))
    b.write_file("/arr/.zarray.tmp", zarray(shape=[8]))
    with pytest.raises(StaleVersion):
        b.rename("/arr/.zarray.tmp", "/arr/.zarray")
    assert doc(store, "arr/.zarray")["shape"] == [64]
    b.rename("/arr/.zarray.tmp", "/arr/.zarray")  # retried: B now knows version 2
    assert doc(store, "arr/.zarray")["shape"] == [8]


def test_consolidated_document_keeps_every_node_entry(pool: ThreadPoolExecutor) -> None:
    """Node A's upkeep read .zmetadata, node B rewrote it with its own entry, then A wrote:
    A's compare-and-swap fails, A re-reads and merges, and both entries stay."""
    store = MemoryStore()
    hooked = CountingStore(store)
    a, b = node(hooked), node(store)
    consolidated_root(a)
    gate = hooked.gate(READS, ".zmetadata")  # A's upkeep has read it
    first = pool.submit(a.write_file, "/a/.zarray", zarray())
    gate.wait_reached()
    b.write_file("/b/.zarray", zarray())
    gate.release()
    result(first)
    entries = doc(store, ".zmetadata")["metadata"]
    assert isinstance(entries, dict)
    assert {"a/.zarray", "b/.zarray"} <= entries.keys()
    assert a.committer.keeper.retries == 1
    assert Validator(store).run().ok


def test_a_document_contended_past_every_retry_is_reported_not_hung(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    contended = FaultyStore(store)
    gw = node(contended)
    consolidated_root(gw)
    pauses: list[float] = []
    gw.committer.keeper._sleep = pauses.append
    # from now on another node rewrites .zmetadata between every read and write of this one
    contended.fail(
        "set_if",
        lambda key: VersionConflict(f"{key}: another writer won"),
        times=None,
        when=lambda key: key == ".zmetadata",
    )
    gw.write_file("/a/.zarray", zarray())  # the array's own commit stands
    assert store.get("a/.zarray") is not None
    assert "a/.zarray" not in doc(store, ".zmetadata")["metadata"]  # type: ignore[operator]
    keeper = gw.committer.keeper
    assert (keeper.retries, keeper.given_up) == (ATTEMPTS - 1, 1)
    assert max(pauses) <= MAX_PAUSE * 1.5
    assert "gave up keeping the entry of /a/.zarray" in caplog.text
    assert gw.stats()["consolidation_given_up"] == 1


def test_many_nodes_creating_arrays_under_one_consolidated_root(pool: ThreadPoolExecutor) -> None:
    store = MemoryStore()
    nodes = [node(store) for _ in range(3)]
    consolidated_root(nodes[0])

    def create(i: int) -> None:
        for j in range(10):
            nodes[i].write_file(f"/n{i}_{j}/.zarray", zarray())

    for future in [pool.submit(create, i) for i in range(3)]:
        result(future)
    entries = doc(store, ".zmetadata")["metadata"]
    assert isinstance(entries, dict)
    assert {f"n{i}_{j}/.zarray" for i in range(3) for j in range(10)} <= entries.keys()


def test_a_chunk_into_a_folder_believed_plain_is_checked_against_the_store() -> None:
    """Worker B cached the folder as plain (clock frozen: well inside its TTL); controller A
    creates the array there; B's invalid chunk is refused, its valid one accepted."""
    store = MemoryStore()
    a, b = node(store), node(store)
    b.write_file("/arr/notes.txt", b"a plain folder for now")
    assert b.detector.folder("arr/").kind.value == "plain"
    a.write_file("/arr/.zarray", zarray())
    with pytest.raises(Rejected):
        b.write_file("/arr/0", b"too long for a 4-byte chunk")
    assert store.get("arr/0") is None
    b.write_file("/arr/1", b"abcd")
    assert Validator(store).run().ok


def test_a_nested_chunk_key_finds_the_array_two_folders_up() -> None:
    store = MemoryStore()
    a, b = node(store), node(store)
    b.write_file("/arr/0/notes", b"plain")
    assert b.detector.folder("arr/0/").kind.value == "plain"
    a.write_file("/arr/.zarray", zarray(shape=[4, 4], chunks=[2, 2], dimension_separator="/"))
    with pytest.raises(Rejected):
        b.write_file("/arr/0/1", b"not four bytes long")
    b.write_file("/arr/0/0", b"abcd")


def test_numbered_files_in_a_truly_plain_folder_stay_files() -> None:
    store = MemoryStore()
    gw = node(store)
    gw.write_file("/logs/README", b"plain")
    for i in range(3):
        gw.write_file(f"/logs/{i}", f"line {i}".encode())
    assert gw.read_file("/logs/2") == b"line 2"
    assert gw.rejections == []


def test_strict_consistency_sees_another_node_at_once() -> None:
    store = MemoryStore()
    a, b = node(store), node(store, consistency="strict")
    assert b.lookup("/arr/.zarray") is None
    a.write_file("/arr/.zarray", zarray())
    assert b.lookup("/arr/.zarray") is not None  # no TTL to wait for
    a.write_file("/arr/.zarray", zarray(dtype="<u2", shape=[8]))
    with pytest.raises(Rejected):  # validated against the current document, not a cached one
        b.write_file("/arr/0", b"abcd")
    b.write_file("/arr/0", b"abcdefgh")


def test_without_conditional_writes_the_last_writer_wins() -> None:
    """``-o conditional=off`` (or a store without them): today's single-writer behaviour."""
    store = MemoryStore()
    a, b = node(store, conditional="off"), node(store, conditional="off")
    assert b.lookup("/arr/.zarray") is None
    a.write_file("/arr/.zarray", zarray())
    b.write_file("/arr/.zarray", zarray(dtype="<u2"))
    assert doc(store, "arr/.zarray")["dtype"] == "<u2"


def test_a_deleted_document_is_a_conflict_for_a_node_that_saw_it() -> None:
    store = MemoryStore()
    a, b = node(store), node(store)
    a.write_file("/arr/.zattrs", b'{"x": 1}')
    assert b.lookup("/arr/.zattrs") is not None
    a.unlink("/arr/.zattrs")
    with pytest.raises(StaleVersion):
        b.write_file("/arr/.zattrs", b'{"y": 2}')
    with pytest.raises(KeyNotFound):
        b.read_file("/arr/.zattrs")
