"""The gateway without FUSE: namespace, staged writes, commit rules, caches, consolidation."""

from __future__ import annotations

import errno
import gzip
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from n5fs.errors import (
    AccessDenied,
    InvalidKey,
    IsAPrefix,
    KeyExists,
    KeyNotFound,
    NothingWritten,
    PrefixNotEmpty,
    ReadOnly,
    Rejected,
    StoreUnavailable,
    errno_of,
)
from n5fs.gateway import EntryKind, Gateway, GatewayConfig
from n5fs.kvstore.base import KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import CountingStore, FaultyStore
from tests.writers import ramp, tensorstore_n5, zarr_python_hierarchy

N5_ATTRS = {
    "dimensions": [10, 8],
    "blockSize": [4, 4],
    "dataType": "uint16",
    "compression": {"type": "gzip", "level": -1},
}


def n5_block(dims: list[int], values: np.ndarray | None = None) -> bytes:
    """An N5 block as N5 Java writes it: mode 0, ndim, big-endian dims, gzip payload."""
    n = int(np.prod(dims))
    payload = (values if values is not None else np.arange(n)).astype(">u2").tobytes()
    header = (
        (0).to_bytes(2, "big")
        + len(dims).to_bytes(2, "big")
        + b"".join(d.to_bytes(4, "big") for d in dims)
    )
    return header + gzip.compress(payload, mtime=0)


@pytest.fixture(params=["memory", "file", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> KvStore:
    if request.param == "memory":
        return MemoryStore()
    if request.param == "file":
        return FileStore(tmp_path / "store")
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    from n5fs.kvstore import open_store

    return open_store(
        {"driver": "s3", "bucket": bucket, "path": "gw/", "endpoint": server.endpoint}
    )


@pytest.fixture
def gw(store: KvStore) -> Gateway:
    return Gateway(store)


def n5_array(gw: Gateway) -> None:
    gw.write_file("/vol/attributes.json", json.dumps(N5_ATTRS).encode())


# -- namespace ---------------------------------------------------------------------------------


def test_files_and_directories(gw: Gateway) -> None:
    gw.write_file("/a/b/readme.txt", b"hello")
    assert gw.stat("/a").kind is EntryKind.DIR
    assert gw.stat("/a/b/readme.txt").size == 5
    assert gw.read_file("/a/b/readme.txt") == b"hello"
    assert [n for n, _ in gw.readdir("/")] == ["a"]  # /.n5fs: reachable, never listed
    assert gw.stat("/.n5fs").kind is EntryKind.DIR
    with pytest.raises(KeyNotFound):
        gw.stat("/a/nothing")
    with pytest.raises(KeyNotFound):
        gw.stat("/a/b/readme.txt/below")


def test_mkdir_lives_until_written_then_rmdir(gw: Gateway) -> None:
    gw.mkdir("/empty")
    assert gw.stat("/empty").kind is EntryKind.DIR
    assert "empty" in dict(gw.readdir("/"))
    with pytest.raises(KeyExists):
        gw.mkdir("/empty")
    gw.write_file("/empty/x", b"1")
    with pytest.raises(PrefixNotEmpty):
        gw.rmdir("/empty")
    gw.unlink("/empty/x")
    assert gw.stat("/empty").kind is EntryKind.DIR  # rm then rmdir, as `rm -r` does
    gw.rmdir("/empty")
    with pytest.raises(KeyNotFound):
        gw.stat("/empty")


def test_rename_file_and_directory(gw: Gateway) -> None:
    gw.write_file("/d/x", b"1")
    gw.write_file("/d/sub/y", b"2")
    gw.rename("/d/x", "/d/z")
    assert gw.read_file("/d/z") == b"1"
    with pytest.raises(KeyNotFound):
        gw.stat("/d/x")
    gw.write_file("/over", b"old")
    gw.rename("/d/z", "/over")
    assert gw.read_file("/over") == b"1"
    gw.rename("/d", "/e")
    assert gw.read_file("/e/sub/y") == b"2"
    assert gw.walk_keys() == ["e/sub/y", "over"]


def test_staged_writes_random_offsets_truncate_and_rdwr(gw: Gateway) -> None:
    fh = gw.create("/f", os.O_RDWR)
    gw.write(fh, b"world", 6)
    gw.write(fh, b"hello ", 0)
    assert gw.read(fh, 100, 0) == b"hello world"
    assert gw.store.get("f") is None  # nothing reaches the store before the commit
    gw.flush(fh)
    gw.release(fh)
    assert gw.store.get("f") == b"hello world"
    fh = gw.open("/f", os.O_RDWR)
    gw.write(fh, b"W", 6)
    gw.truncate("/f", 7, fh)
    gw.flush(fh)
    gw.release(fh)
    assert gw.store.get("f") == b"hello W"
    gw.truncate("/f", 2)
    assert gw.store.get("f") == b"he"


def test_large_file_spills_and_reads_by_range(store: KvStore, tmp_path: Path) -> None:
    gw = Gateway(store, GatewayConfig(spill_bytes=1 << 20, small_object=1 << 20))
    data = os.urandom(3 << 20)
    fh = gw.create("/big.bin", os.O_WRONLY)
    for off in range(0, len(data), 1 << 18):
        gw.write(fh, data[off : off + (1 << 18)], off)
    gw.flush(fh)
    gw.release(fh)
    assert store.get("big.bin") == data
    fh = gw.open("/big.bin", os.O_RDONLY)
    got = b"".join(gw.read(fh, 128 << 10, off) for off in range(0, len(data), 128 << 10))
    assert got == data
    assert gw.read(fh, 10, len(data) - 5) == data[-5:]
    gw.release(fh)


def test_control_entries(gw: Gateway) -> None:
    assert [n for n, _ in gw.readdir("/.n5fs")] == ["rejections", "stats.json"]
    stats = json.loads(gw.read_file("/.n5fs/stats.json"))
    assert stats["commits"] == 0
    with pytest.raises(AccessDenied):
        gw.write_file("/.n5fs/rejections", b"x")
    with pytest.raises(AccessDenied):
        gw.open("/.n5fs/stats.json", os.O_WRONLY)


def test_read_only(store: KvStore) -> None:
    store.set("k", b"v")
    gw = Gateway(store, GatewayConfig(read_only=True))
    assert gw.read_file("/k") == b"v"
    for call in (
        lambda: gw.write_file("/k", b"x"),
        lambda: gw.unlink("/k"),
        lambda: gw.mkdir("/d"),
        lambda: gw.rename("/k", "/j"),
        lambda: gw.open("/k", os.O_WRONLY),
    ):
        with pytest.raises(ReadOnly) as info:
            call()
        assert errno_of(info.value) == errno.EROFS
    assert gw.stat("/k").writable is False


# -- commit rules -------------------------------------------------------------------------------


def test_valid_n5_chunks_are_stored(gw: Gateway) -> None:
    n5_array(gw)
    gw.write_file("/vol/0/0", n5_block([4, 4]))
    gw.write_file("/vol/2/1", n5_block([2, 4]))  # end block, clipped as N5 Java writes it
    assert gw.walk_keys() == ["vol/0/0", "vol/2/1", "vol/attributes.json"]
    assert gw.stats()["rejections"] == 0


@pytest.mark.parametrize(
    ("key", "data", "rule"),
    [
        ("vol/0/0", b"\x00\x00\x00\x02garbage", "block-header"),
        ("vol/0/0", n5_block([4, 3]), "block-shape"),
        ("vol/9/0", n5_block([4, 4]), "out-of-grid"),
        ("vol/0/0", n5_block([4, 4])[:-6], "undecodable"),
        ("vol/0/0", n5_block([4, 4])[:16] + zlib.compress(b"\0" * 50_000_000)[2:], ""),
        ("vol/attributes.json", b'{"dimensions": [10, 8]}', "dataset-keys"),
        ("vol/attributes.json", b"{not json", "json"),
    ],
)
def test_invalid_commits_are_refused(gw: Gateway, key: str, data: bytes, rule: str) -> None:
    n5_array(gw)
    gw.write_file("/vol/0/0", n5_block([4, 4]))
    before = {k: gw.store.get(k) for k in gw.walk_keys()}
    with pytest.raises(Rejected) as info:
        gw.write_file("/" + key, data)
    assert errno_of(info.value) == errno.EINVAL
    assert rule in info.value.rule
    assert {k: gw.store.get(k) for k in gw.walk_keys()} == before
    lines = gw.read_file("/.n5fs/rejections").decode().splitlines()
    record = json.loads(lines[-1])
    assert record["path"] == "/" + key
    assert record["fmt"] == "n5"
    assert record["stored"] is False


def test_rename_of_bad_temp_onto_chunk_is_refused(gw: Gateway) -> None:
    n5_array(gw)
    gw.write_file("/vol/0/.0.tmp123", b"junk")  # rsync's temp name: stored as it is
    with pytest.raises(Rejected):
        gw.rename("/vol/0/.0.tmp123", "/vol/0/0")
    assert gw.store.get("vol/0/.0.tmp123") == b"junk"
    assert gw.store.get("vol/0/0") is None
    gw.write_file("/vol/0/.0.good", n5_block([4, 4]))
    gw.rename("/vol/0/.0.good", "/vol/0/0")
    assert gw.store.get("vol/0/0") == n5_block([4, 4])


def test_link_validates_at_the_new_name(gw: Gateway) -> None:
    n5_array(gw)
    gw.write_file("/vol/0/x.partial", n5_block([4, 4]))
    gw.link("/vol/0/x.partial", "/vol/0/1")
    assert gw.store.get("vol/0/1") == n5_block([4, 4])
    with pytest.raises(KeyExists):
        gw.link("/vol/0/x.partial", "/vol/0/1")
    gw.write_file("/vol/0/y.partial", b"bad")
    with pytest.raises(Rejected):
        gw.link("/vol/0/y.partial", "/vol/1/1")


def test_truncate_of_a_chunk_is_refused(gw: Gateway) -> None:
    n5_array(gw)
    block = n5_block([4, 4])
    gw.write_file("/vol/0/0", block)
    with pytest.raises(Rejected):
        gw.truncate("/vol/0/0", 10)
    assert gw.store.get("vol/0/0") == block


def test_pwrite_over_header_is_refused_at_close(gw: Gateway) -> None:
    n5_array(gw)
    block = n5_block([4, 4])
    gw.write_file("/vol/0/0", block)
    fh = gw.open("/vol/0/0", os.O_RDWR)
    gw.write(fh, b"\xff\xff", 0)
    with pytest.raises(Rejected):
        gw.flush(fh)
    gw.release(fh)
    assert gw.store.get("vol/0/0") == block
    assert gw.read_file("/vol/0/0") == block


def test_structural_change_refused_while_chunks_exist(gw: Gateway) -> None:
    n5_array(gw)
    gw.write_file("/vol/0/0", n5_block([4, 4]))
    changed = {**N5_ATTRS, "blockSize": [2, 2]}
    with pytest.raises(Rejected) as info:
        gw.write_file("/vol/attributes.json", json.dumps(changed).encode())
    assert info.value.rule == "structural-change"
    gw.write_file(
        "/vol/attributes.json",
        json.dumps({**N5_ATTRS, "dimensions": [12, 8], "note": "resized"}).encode(),
    )
    gw.unlink("/vol/0/0")
    gw.write_file("/vol/attributes.json", json.dumps(changed).encode())  # no chunks: allowed


def test_growing_past_a_clipped_end_block_is_refused(gw: Gateway) -> None:
    n5_array(gw)
    gw.write_file("/vol/2/0", n5_block([2, 4]))  # clipped end block along dim 0
    with pytest.raises(Rejected) as info:
        gw.write_file(
            "/vol/attributes.json", json.dumps({**N5_ATTRS, "dimensions": [16, 8]}).encode()
        )
    assert info.value.rule == "stored-chunk-invalid"


def test_metadata_after_chunks_validates_them(gw: Gateway, tmp_path: Path) -> None:
    """`cp -r` may copy chunk files before the metadata that gives them meaning."""
    src = tmp_path / "ts"
    tensorstore_n5(src, ramp((10, 8)), [4, 4])
    files = sorted(p for p in src.rglob("*") if p.is_file())
    chunks = [p for p in files if p.name != "attributes.json"]
    for p in chunks:
        gw.write_file("/a/" + p.relative_to(src).as_posix(), p.read_bytes())
    gw.write_file("/a/attributes.json", (src / "attributes.json").read_bytes())
    # now the same, with one chunk that the metadata arriving later does not accept
    for p in chunks:
        gw.write_file("/b/" + p.relative_to(src).as_posix(), p.read_bytes())
    gw.write_file("/b/0/0", b"\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00\x04junk")
    with pytest.raises(Rejected) as info:
        gw.write_file("/b/attributes.json", (src / "attributes.json").read_bytes())
    assert info.value.rule == "stored-chunk-invalid"
    assert gw.store.get("b/attributes.json") is None


def test_format_clash_is_refused(gw: Gateway) -> None:
    gw.write_file("/g/.zgroup", b'{"zarr_format": 2}')
    with pytest.raises(Rejected) as info:
        gw.write_file("/g/zarr.json", b'{"zarr_format": 3, "node_type": "group"}')
    assert info.value.rule == "format-clash"


def test_other_files_are_never_judged(gw: Gateway) -> None:
    n5_array(gw)
    for name in ("README.md", "0/.0.Ab12Cd", "0/0.1c2d.partial", "0/0.__lock"):
        gw.write_file(f"/vol/{name}", b"anything")
    gw.write_file("/plain/attributes.json", b'{"just": "a config file"}')
    assert gw.stats()["rejections"] == 0


@pytest.mark.parametrize("mode", ["warn", "off"])
def test_warn_and_off_modes_store_invalid_content(store: KvStore, mode: str) -> None:
    gw = Gateway(store, GatewayConfig(validate=mode))
    n5_array(gw)
    gw.write_file("/vol/0/0", b"junk")
    assert store.get("vol/0/0") == b"junk"
    lines = gw.read_file("/.n5fs/rejections").decode().splitlines()
    if mode == "warn":
        assert json.loads(lines[-1])["stored"] is True
    else:
        assert lines == []


# -- consolidated metadata ----------------------------------------------------------------------


def test_zmetadata_stays_true_after_a_new_array(tmp_path: Path) -> None:
    import zarr

    root = tmp_path / "v2"
    zarr_python_hierarchy(root, 2)
    zarr.consolidate_metadata(str(root))
    gw = Gateway(FileStore(root))
    zarray = {
        "zarr_format": 2,
        "shape": [4],
        "chunks": [2],
        "dtype": "<i4",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
    gw.write_file("/labels/new/.zarray", json.dumps(zarray).encode())
    gw.write_file("/labels/new/.zattrs", b'{"unit": "nm"}')
    doc = json.loads((root / ".zmetadata").read_text())
    assert doc["metadata"]["labels/new/.zarray"] == zarray
    assert doc["metadata"]["labels/new/.zattrs"] == {"unit": "nm"}
    group = zarr.open_consolidated(str(root))
    assert group["labels/new"].shape == (4,)
    gw.unlink("/labels/new/.zattrs")
    assert "labels/new/.zattrs" not in json.loads((root / ".zmetadata").read_text())["metadata"]


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_v3_inline_consolidated_stays_true(tmp_path: Path) -> None:
    import zarr

    root = tmp_path / "v3"
    zarr_python_hierarchy(root, 3)
    zarr.consolidate_metadata(str(root))
    gw = Gateway(FileStore(root))
    meta = json.loads((root / "raw" / "zarr.json").read_text())
    meta["attributes"] = {"changed": True}
    gw.write_file("/raw/zarr.json", json.dumps(meta).encode())
    group = zarr.open_consolidated(str(root), zarr_format=3)
    assert dict(group["raw"].attrs) == {"changed": True}


# -- hdmf-zarr links ----------------------------------------------------------------------------


def test_hdmf_links_are_symlinks(gw: Gateway) -> None:
    gw.write_file("/.zgroup", b'{"zarr_format": 2}')
    gw.write_file("/.zattrs", b'{"namespace": "core", "neurodata_type": "NWBFile"}')
    gw.write_file("/acq/.zgroup", b'{"zarr_format": 2}')
    gw.write_file("/proc/.zgroup", b'{"zarr_format": 2}')
    gw.write_file(
        "/proc/.zattrs",
        json.dumps({"zarr_link": [{"name": "raw", "source": ".", "path": "/acq"}]}).encode(),
    )
    assert gw.stat("/proc/raw").kind is EntryKind.SYMLINK
    assert gw.readlink("/proc/raw") == "../acq"
    assert dict(gw.readdir("/proc"))["raw"].kind is EntryKind.SYMLINK
    gw.symlink("../acq", "/proc/again")
    attrs = json.loads(gw.store.get("proc/.zattrs") or b"{}")
    assert {"name": "again", "source": ".", "path": "/acq"}.items() <= attrs["zarr_link"][
        -1
    ].items()
    gw.unlink("/proc/raw")
    with pytest.raises(KeyNotFound):
        gw.stat("/proc/raw")


def test_hdmf_link_cannot_leave_the_store(gw: Gateway) -> None:
    gw.write_file("/g/.zgroup", b'{"zarr_format": 2}')
    gw.write_file("/g/.zattrs", b'{"zarr_dtype": "int32"}')
    for target in ("../../outside", "/abs/path", ".."):
        with pytest.raises(InvalidKey):
            gw.symlink(target, "/g/link")
    gw.write_file("/h/.zgroup", b'{"zarr_format": 2}')
    gw.symlink("../h", "/g/sibling")
    assert gw.readlink("/g/sibling") == "../h"


def test_symlink_outside_hdmf_is_refused(gw: Gateway) -> None:
    gw.mkdir("/d")
    with pytest.raises(OSError) as info:
        gw.symlink("x", "/d/link")
    assert errno_of(info.value) == errno.ENOTSUP


# -- caches and faults --------------------------------------------------------------------------


def test_stat_storm_is_one_listing_per_folder() -> None:
    inner = MemoryStore()
    for i in range(0, 1000, 10):
        inner.set(f"arr/{i}", b"x")
    store = CountingStore(inner)
    gw = Gateway(store)
    found = 0
    for i in range(1000):
        try:
            gw.stat(f"/arr/{i}")
            found += 1
        except KeyNotFound:
            pass
    assert found == 100
    assert store.count("list") == 1  # one LIST of "arr/" answers all 1000 lookups


def test_listing_expires_with_the_injected_clock() -> None:
    now = [0.0]
    store = MemoryStore()
    gw = Gateway(store, GatewayConfig(ttl=5.0), clock=lambda: now[0])
    with pytest.raises(KeyNotFound):
        gw.stat("/late")
    store.set("late", b"1")  # someone else writes the store
    with pytest.raises(KeyNotFound):
        gw.stat("/late")  # negative answer cached
    now[0] = 5.0
    assert gw.stat("/late").size == 1


def test_store_fault_is_an_error_not_a_crash() -> None:
    store = FaultyStore(MemoryStore())
    gw = Gateway(store)
    gw.write_file("/k", b"v")
    store.fail("set")
    with pytest.raises(StoreUnavailable) as info:
        gw.write_file("/k", b"w")
    assert errno_of(info.value) == errno.EIO
    gw.write_file("/k", b"w")  # the gateway keeps working
    assert gw.read_file("/k") == b"w"


def test_directory_cannot_be_opened_or_unlinked(gw: Gateway) -> None:
    gw.write_file("/d/x", b"1")
    with pytest.raises(IsAPrefix):
        gw.open("/d", os.O_RDONLY)
    with pytest.raises(IsAPrefix):
        gw.unlink("/d")


def test_shell_redirection_first_close_answers_einval_and_records_nothing(gw: Gateway) -> None:
    """`cmd > chunk`: the shell's first close flushes the still-empty new file. That close
    answers EINVAL (an empty chunk is refused), but another descriptor holds the file: the
    name stays (the command fstat-s its output), nothing is recorded, and the command's
    write and close commit the chunk."""
    n5_array(gw)
    fh = gw.create("/vol/0/0", os.O_WRONLY | os.O_TRUNC)
    with pytest.raises(NothingWritten) as refused:
        gw.flush(fh)  # close() of the descriptor the shell dup2'ed away
    assert errno_of(refused.value) == errno.EINVAL
    assert refused.value.rule == "block-header"
    assert gw.stats()["rejections"] == 0
    assert gw.store.get("vol/0/0") is None
    assert gw.stat("/vol/0/0").size == 0  # visible while open, and it opens
    assert gw.read_file("/vol/0/0") == b""
    gw.write(fh, n5_block([4, 4]), 0)
    gw.flush(fh)
    gw.release(fh)
    assert gw.store.get("vol/0/0") == n5_block([4, 4])
    assert gw.stats()["rejections"] == 0


def test_empty_new_chunk_is_refused_at_close_and_recorded_when_the_last_handle_goes(
    gw: Gateway,
) -> None:
    """`touch chunk`: its close answers EINVAL; the refusal is recorded and the name is gone
    when the last handle goes (the kernel's release follows that close), and a retried
    create with content works at once."""
    n5_array(gw)
    fh = gw.create("/vol/1/1", os.O_WRONLY)
    with pytest.raises(Rejected) as refused:
        gw.flush(fh)
    assert errno_of(refused.value) == errno.EINVAL
    gw.release(fh)
    assert gw.store.get("vol/1/1") is None
    [rejection] = gw.rejections
    assert (rejection.path, rejection.rule) == ("/vol/1/1", "block-header")
    assert (
        json.loads(gw.read_file("/.n5fs/rejections").decode().splitlines()[-1])["path"]
        == "/vol/1/1"
    )
    with pytest.raises(KeyNotFound):
        gw.stat("/vol/1/1")
    assert [name for name, _ in gw.readdir("/vol")] == ["attributes.json"]
    # the kernel still holds the entry: the retried open(O_CREAT) comes as a plain open
    fh = gw.open("/vol/1/1", os.O_WRONLY | os.O_TRUNC)
    gw.write(fh, n5_block([4, 4]), 0)
    gw.flush(fh)
    gw.release(fh)
    assert gw.read_file("/vol/1/1") == n5_block([4, 4])


@pytest.mark.parametrize("path", ["/notes.txt", "/vol/notes", "/plain/0"])
def test_an_empty_new_file_the_format_takes_is_stored_at_release(gw: Gateway, path: str) -> None:
    """`touch notes.txt`: an empty file outside an array (or a name no array grammar claims)
    closes with 0 and is stored when the last handle goes."""
    n5_array(gw)
    fh = gw.create(path, os.O_WRONLY)
    gw.flush(fh)  # the shell's first close, or touch's only one: 0
    assert gw.stat(path).size == 0
    gw.flush(fh)
    gw.release(fh)
    assert gw.store.get(path[1:]) == b""
    assert gw.stat(path).size == 0
    assert gw.rejections == []


def test_path_truncate_commits_now_even_while_a_reader_holds_the_file(gw: Gateway) -> None:
    gw.write_file("/f", b"0123456789")
    fh = gw.open("/f", os.O_RDONLY)  # a handle with nothing staged (FUSE's late RELEASE)
    gw.truncate("/f", 4)
    assert gw.store.get("f") == b"0123"
    gw.release(fh)
