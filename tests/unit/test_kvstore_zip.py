"""The zip adapter: archives written by Python's zipfile, read by range over a base store,
rewritten atomically on flush; plus the shared KvStore contract over memory, file and S3."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import struct
import subprocess
import sys
import threading
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from n5fs.errors import (
    InvalidKey,
    N5fsError,
    NoSpace,
    NotSupported,
    ReadOnly,
    StoreCorrupt,
    StoreUnavailable,
    errno_of,
)
from n5fs.kvstore import open_store, tempnames
from n5fs.kvstore.base import ByteRange, KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.spec import FileSpec, S3Spec, ZipSpec, parse_spec
from n5fs.kvstore.wrappers import ReadOnlyStore
from n5fs.kvstore.zip import ZipStore
from n5fs.kvstore.zip import rewrite as ziprewrite
from n5fs.kvstore.zip import writer as zipwriter
from n5fs.testing.doubles import CountingStore, FaultyStore
from n5fs.testing.kvstore_contract import KvStoreContract

ARCHIVE = "arch/a.zip"
Entries = dict[str, bytes]


def make_zip(
    entries: Entries,
    compression: int = zipfile.ZIP_DEFLATED,
    comment: bytes = b"",
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as out:
        for name, value in entries.items():
            out.writestr(name, value)
        out.comment = comment
    return buf.getvalue()


def unzip(data: bytes) -> Entries:
    with zipfile.ZipFile(io.BytesIO(data)) as src:
        assert src.testzip() is None
        return {name: src.read(name) for name in src.namelist()}


def over_memory(data: bytes | None, **kwargs: Any) -> tuple[MemoryStore, ZipStore]:
    mem = MemoryStore()
    if data is not None:
        mem.set(ARCHIVE, data)
    return mem, ZipStore(mem, ARCHIVE, **kwargs)


def archive_of(mem: KvStore) -> bytes:
    data = mem.get(ARCHIVE)
    assert data is not None
    return data


def central_entry_at(data: bytes, name: str) -> int:
    """Offset of ``name``'s central-directory entry (archive without comment or ZIP64)."""
    pos = int(struct.unpack_from("<L", data, len(data) - 6)[0])
    while data[pos : pos + 4] == b"PK\x01\x02":
        nlen, elen, clen = struct.unpack_from("<3H", data, pos + 28)
        if data[pos + 46 : pos + 46 + nlen].decode() == name:
            return pos
        pos += 46 + nlen + elen + clen
    raise AssertionError(f"no entry {name!r}")


def patch_member(
    data: bytes,
    name: str,
    *,
    flags: int | None = None,
    method: int | None = None,
    size: int | None = None,
) -> bytes:
    """Rewrite fields of one member in both its central entry and its local header."""
    out = bytearray(data)
    central = central_entry_at(data, name)
    local = struct.unpack_from("<L", data, central + 42)[0]
    for value, c_off, l_off, fmt in (
        (flags, 8, 6, "<H"),
        (method, 10, 8, "<H"),
        (size, 24, 22, "<L"),
    ):
        if value is not None:
            struct.pack_into(fmt, out, central + c_off, value)
            struct.pack_into(fmt, out, local + l_off, value)
    return bytes(out)


# -- reading archives written by zipfile ---------------------------------------------------------


@pytest.mark.parametrize(
    "compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]
)
def test_reads_every_supported_method(compression: int) -> None:
    value = bytes(range(256)) * 400 + b"tail"
    _, store = over_memory(make_zip({"g/chunk": value, "g/sub/x": b"", "top": b"t"}, compression))
    assert store.get("g/chunk") == value
    assert store.get("g/chunk", ByteRange(1000, 300)) == value[1000:1300]
    assert store.get("g/chunk", ByteRange(-4)) == b"tail"
    assert store.get("g/chunk", ByteRange(len(value) + 5)) == b""
    assert store.get("g/sub/x") == b""
    info = store.stat("g/chunk")
    assert info is not None
    assert info.size == len(value)
    listing = store.list("")
    assert ([k.key for k in listing.keys], listing.prefixes) == (["top"], ("g/",))
    assert store.list("g/", delimiter=None).names() == ["g/chunk", "g/sub/x"]


def test_mtime_comes_from_the_dos_timestamp() -> None:
    import time

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        out.writestr(zipfile.ZipInfo("k", date_time=(2011, 3, 4, 5, 6, 8)), b"v")
    _, store = over_memory(buf.getvalue())
    info = store.stat("k")
    assert info is not None
    assert info.mtime == time.mktime((2011, 3, 4, 5, 6, 8, 0, 0, -1))


def test_longest_comment_with_a_fake_end_record_inside() -> None:
    comment = (b"PK\x05\x06" + b"\x00" * 18 + b"x" * 70_000)[:0xFFFF]
    data = make_zip({"a": b"alpha", "b/c": b"gamma"}, comment=comment)
    mem, store = over_memory(data)
    assert store.get("b/c") == b"gamma"
    store.set("d", b"delta")
    store.flush()
    # zipfile itself trips on the fake record (it takes the last signature), so check by hand.
    assert archive_of(mem).endswith(struct.pack("<H", len(comment)) + comment)
    again = ZipStore(mem, ARCHIVE)
    assert (again.get("a"), again.get("d")) == (b"alpha", b"delta")


def test_zip64_member_extras_forced_by_zipfile() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as out:
        for name in ("x/big", "y"):
            with out.open(name, "w", force_zip64=True) as f:
                f.write(name.encode() * 5000)
    _, store = over_memory(buf.getvalue())
    assert store.get("x/big") == b"x/big" * 5000
    assert store.get("y", ByteRange(10, 3)) == b"yyy"


def test_zip64_end_records_from_zipfile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 3)
    entries = {f"k{i}": bytes([i]) * i for i in range(7)}
    data = make_zip(entries)
    assert b"PK\x06\x06" in data  # zipfile did write a ZIP64 end record
    _, store = over_memory(data)
    assert store.list("").names() == sorted(entries)
    assert all(store.get(k) == v for k, v in entries.items())


class _Unseekable(io.RawIOBase):
    def __init__(self) -> None:
        self.buf = io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return int(self.buf.write(b))


def test_data_descriptor_members_read_and_survive_a_rewrite() -> None:
    sink = _Unseekable()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as out, out.open("s/d", "w") as f:
        f.write(b"streamed " * 1000)
    data = sink.buf.getvalue()
    assert zipfile.ZipFile(io.BytesIO(data)).getinfo("s/d").flag_bits & 0x08
    mem, store = over_memory(data)
    assert store.get("s/d") == b"streamed " * 1000
    store.set("other", b"o")
    store.flush()
    assert unzip(archive_of(mem)) == {"s/d": b"streamed " * 1000, "other": b"o"}
    assert ZipStore(mem, ARCHIVE).get("s/d") == b"streamed " * 1000


def test_self_extractor_stub_is_read_and_kept() -> None:
    stub = b"#!/bin/sh\nexit 0\n" * 50
    mem, store = over_memory(stub + make_zip({"a": b"1", "b": b"2" * 1000}))
    assert store.get("b") == b"2" * 1000
    store.set("c", b"3")
    store.flush()
    data = archive_of(mem)
    assert data.startswith(stub)
    assert unzip(data) == {"a": b"1", "b": b"2" * 1000, "c": b"3"}


def test_directory_entries_make_prefixes_until_deleted() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        out.mkdir("empty")
        out.mkdir("full")
        out.writestr("full/k", b"v")
    mem, store = over_memory(buf.getvalue())
    assert store.list("").prefixes == ("empty/", "full/")
    assert store.get("empty") is None
    assert store.delete_prefix("empty/") == 0
    assert store.list("").prefixes == ("full/",)
    store.flush()
    assert sorted(unzip(archive_of(mem))) == ["full/", "full/k"]


# -- what is not exposed or not decoded -----------------------------------------------------------


def test_escaping_names_are_hidden_logged_once_and_kept(caplog: pytest.LogCaptureFixture) -> None:
    evil = ["../evil", "/abs", "a\\b", "C:/x", "ok/../../up", "./dot", "a//b"]
    mem, store = over_memory(make_zip({**dict.fromkeys(evil, b"bad"), "ok/a": b"good"}))
    with caplog.at_level(logging.WARNING, logger="n5fs.kvstore.zip"):
        assert store.list("", delimiter=None).names() == ["ok/a"]
        store.refresh()
        assert store.list("").prefixes == ("ok/",)
    warnings = [r for r in caplog.records if "not exposed" in r.getMessage()]
    assert len(warnings) == 1
    assert "'../evil'" in warnings[0].getMessage()
    with pytest.raises(InvalidKey):
        store.get("../evil")
    store.set("new", b"n")
    store.flush()  # the hidden members are not ours to drop
    assert set(unzip(archive_of(mem))) == {*evil, "ok/a", "new"}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"flags": 0x1}, "encrypted"),
        ({"flags": 0x41}, "encrypted"),
        ({"method": 99}, "encrypted"),
        ({"method": 9}, "method 9"),
    ],
)
def test_unreadable_members_are_refused(patch: dict[str, int], message: str) -> None:
    data = patch_member(make_zip({"secret": b"s" * 100, "plain": b"p"}), "secret", **patch)
    _, store = over_memory(data)
    assert store.get("plain") == b"p"
    info = store.stat("secret")
    assert info is not None
    assert info.size == 100
    for byte_range in (None, ByteRange(0, 1)):
        with pytest.raises(NotSupported, match=message):
            store.get("secret", byte_range)


def test_lying_member_is_refused_without_inflating() -> None:
    bomb = make_zip({"bomb": bytes(20 << 20)})
    _, store = over_memory(patch_member(bomb, "bomb", size=1000))
    assert store.get("bomb", ByteRange(0, 10)) == bytes(10)  # within its declared size
    tracemalloc.start()
    try:
        with pytest.raises(StoreCorrupt, match="declared size of 1000"):
            store.get("bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (4 << 20)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d.replace(b"PK\x01\x02", b"PK\x09\x09", 1), id="entry-signature"),
        pytest.param(lambda d: d[:-10], id="truncated"),
        pytest.param(lambda d: b"not a zip at all" * 100, id="not-a-zip"),
        pytest.param(lambda d: d[:-10] + struct.pack("<L", 1 << 30) + d[-6:], id="cd-size"),
    ],
)
def test_damaged_archive_is_store_corrupt(damage: Any) -> None:
    _, store = over_memory(damage(make_zip({"a": b"1", "b": b"2"})))
    with pytest.raises(StoreCorrupt, match=r"arch/a\.zip"):
        store.list("")


def test_crc_mismatch_is_store_corrupt() -> None:
    data = bytearray(make_zip({"k": b"0123456789"}, zipfile.ZIP_STORED))
    data[data.index(b"0123456789") + 5] ^= 0xFF
    _, store = over_memory(bytes(data))
    assert store.get("k", ByteRange(0, 3)) == b"012"
    with pytest.raises(StoreCorrupt, match="CRC"):
        store.get("k")


def test_stored_ranges_fetch_only_the_range() -> None:
    value = os.urandom(4 << 20)
    mem = MemoryStore()
    mem.set(ARCHIVE, make_zip({"big": value, "small": b"s" * 50}, zipfile.ZIP_STORED))
    rec = CountingStore(mem)
    store = ZipStore(rec, ARCHIVE)
    store.list("")
    rec.clear()
    assert store.get("big", ByteRange(3 << 20, 100)) == value[3 << 20 : (3 << 20) + 100]
    assert store.get("small") == b"s" * 50
    fetched = [r.length for r in rec.ranges() if r is not None and r.length is not None]
    assert len(fetched) == len(rec.ranges()) == 3  # header + range, then header and data at once
    assert sum(fetched) < 4096


@settings(max_examples=150, deadline=None)
@given(
    hits=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4
    ),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
def test_damaged_bytes_raise_only_typed_errors(
    hits: list[tuple[float, int]], cut: float | None
) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        for method, name in (
            (zipfile.ZIP_DEFLATED, "a/d"),
            (zipfile.ZIP_BZIP2, "b"),
            (zipfile.ZIP_LZMA, "c"),
            (zipfile.ZIP_STORED, "s"),
        ):
            out.writestr(name, name.encode() * 200, compress_type=method)
    data = bytearray(buf.getvalue())
    for where, value in hits:
        data[int(where * len(data))] = value
    if cut is not None:
        data = data[int(cut * len(data)) :]
    mem, store = over_memory(bytes(data))
    try:
        for info in store.walk():
            for byte_range in (None, ByteRange(3, 10), ByteRange(-5)):
                with contextlib.suppress(N5fsError):
                    store.get(info.key, byte_range)
        store.set("new", b"n")
        store.flush()
        ZipStore(mem, ARCHIVE).list("", delimiter=None)
    except N5fsError:
        pass  # StoreCorrupt, NotSupported: anything else is a bug


def test_listing_skips_subtrees_but_honours_deletions() -> None:
    names = {f"g/{i:03}/k": b"v" for i in range(300)} | {"g/x": b"", "h/a": b"", "h/b": b""}
    _, store = over_memory(make_zip(names))
    assert store.list("g/").prefixes == tuple(f"g/{i:03}/" for i in range(300))
    store.delete("h/a")
    assert store.list("").prefixes == ("g/", "h/")
    store.delete("h/b")
    assert store.list("").prefixes == ("g/",)
    store.set("h/c/d", b"")
    assert store.list("").prefixes == ("g/", "h/")
    assert store.list("h/").prefixes == ("h/c/",)


# -- writing --------------------------------------------------------------------------------------


def test_absent_archive_is_empty_and_created_by_the_first_flush() -> None:
    mem, store = over_memory(None)
    assert store.list("") == store.list("", delimiter=None)
    assert store.get("k") is None
    store.flush()
    assert mem.get(ARCHIVE) is None  # nothing changed: nothing written
    store.set("k", b"v")
    store.delete("k")
    store.set("j", b"w")
    store.flush()
    assert unzip(archive_of(mem)) == {"j": b"w"}
    store.delete("j")
    store.flush()
    assert unzip(archive_of(mem)) == {}


def test_empty_file_reads_as_an_empty_archive() -> None:
    _, store = over_memory(b"")
    assert store.list("", delimiter=None).keys == ()


def test_overwrite_and_flush_never_duplicates_names() -> None:
    mem, store = over_memory(make_zip({"a": b"1", "b": b"2", "c": b"3"}))
    store.set("b", b"two")
    store.set("b", b"TWO")
    store.copy("a", "c")
    store.flush()
    store.set("a", b"one")
    store.flush()
    names = zipfile.ZipFile(io.BytesIO(archive_of(mem))).namelist()
    assert sorted(names) == ["a", "b", "c"]
    assert unzip(archive_of(mem)) == {"a": b"one", "b": b"TWO", "c": b"1"}


def test_duplicates_in_the_source_archive_last_one_wins() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        out.writestr("d", b"first")
        with pytest.warns(UserWarning, match="Duplicate"):
            out.writestr("d", b"second")
    mem, store = over_memory(buf.getvalue())
    assert store.get("d") == b"second"
    store.set("x", b"")
    store.flush()
    assert zipfile.ZipFile(io.BytesIO(archive_of(mem))).namelist().count("d") == 1
    assert store.get("d") == b"second"


def test_unchanged_members_are_copied_raw_new_ones_deflated_or_stored() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        out.writestr("bz", b"b" * 5000, compress_type=zipfile.ZIP_BZIP2)
        out.writestr("xz", b"x" * 5000, compress_type=zipfile.ZIP_LZMA)
    mem, store = over_memory(buf.getvalue())
    noise = os.urandom(5000)
    store.set("json", b'{"zarr_format": 2}' * 100)
    store.set("noise", noise)
    store.flush()
    infos = {i.filename: i for i in zipfile.ZipFile(io.BytesIO(archive_of(mem))).infolist()}
    assert infos["bz"].compress_type == zipfile.ZIP_BZIP2
    assert infos["xz"].compress_type == zipfile.ZIP_LZMA
    assert infos["json"].compress_type == zipfile.ZIP_DEFLATED
    assert infos["noise"].compress_type == zipfile.ZIP_STORED
    assert unzip(archive_of(mem))["noise"] == noise


def test_inner_path_sees_and_writes_only_its_members() -> None:
    mem = MemoryStore()
    mem.set(ARCHIVE, make_zip({"in/a": b"1", "in/s/b": b"2", "out/c": b"3", "inx": b"4"}))
    store = ZipStore(mem, ARCHIVE, "in")
    assert store.list("", delimiter=None).names() == ["a", "s/b"]
    store.set("new", b"5")
    store.delete_prefix("s/")
    store.flush()
    assert unzip(archive_of(mem)) == {"in/a": b"1", "out/c": b"3", "inx": b"4", "in/new": b"5"}


def test_we_write_zip64_where_fields_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zipwriter, "ZIP64_LIMIT", 300)
    monkeypatch.setattr(zipwriter, "COUNT_LIMIT", 3)
    mem, store = over_memory(make_zip({"old": b"o" * 1000}, zipfile.ZIP_STORED))
    values = {f"n/{i}": os.urandom(100 * i) for i in range(6)}
    for key, value in values.items():
        store.set(key, value)
    store.flush()
    data = archive_of(mem)
    assert b"PK\x06\x06" in data
    assert data[-22 + 8 : -22 + 10] == b"\xff\xff"  # the short count points at ZIP64
    assert unzip(data) == {"old": b"o" * 1000, **values}
    again = ZipStore(mem, ARCHIVE)
    assert again.get("old") == b"o" * 1000
    assert all(again.get(k) == v for k, v in values.items())


def test_large_values_spill_to_anonymous_temp_files(tmp_path: Path) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    mem, store = over_memory(None, spill_threshold=1000, memory_budget=2500, tmp_dir=str(spill_dir))
    big, src = os.urandom(50_000), tmp_path / "src"
    src.write_bytes(big)
    store.put_file("file", src)
    store.set("set", big[:1500])
    for i in range(4):
        store.set(f"small/{i}", bytes([i]) * 900)  # the third and fourth pass the budget
    assert store.get("file", ByteRange(-10)) == big[-10:]
    assert store.get("set") == big[:1500]
    store.flush()
    assert os.listdir(spill_dir) == []
    stored = unzip(archive_of(mem))
    assert stored["file"] == big
    assert stored["small/3"] == b"\x03" * 900


def test_interrupted_rewrite_keeps_the_old_archive_and_retries(tmp_path: Path) -> None:
    old = make_zip({"k": b"old", "keep": b"kept"})
    mem = MemoryStore()
    mem.set(ARCHIVE, old)
    faulty = FaultyStore(mem)
    store = ZipStore(faulty, ARCHIVE, tmp_dir=str(tmp_path))
    store.set("k", b"new")
    store.set("added", b"x" * 10_000)
    faulty.fail("put_file")
    with pytest.raises(StoreUnavailable):
        store.flush()
    assert mem.get(ARCHIVE) == old
    assert ZipStore(mem, ARCHIVE).get("k") == b"old"
    assert store.get("k") == b"new"  # still pending
    assert os.listdir(tmp_path) == []
    faulty.heal()
    store.flush()
    assert unzip(archive_of(mem)) == {"k": b"new", "keep": b"kept", "added": b"x" * 10_000}
    assert os.listdir(tmp_path) == []


def test_read_only_base_refuses_changes() -> None:
    mem, _ = over_memory(make_zip({"k": b"v"}))
    store = ZipStore(ReadOnlyStore(mem), ARCHIVE)
    assert store.get("k") == b"v"
    for call in (
        lambda: store.set("k", b"w"),
        lambda: store.delete("k"),
        lambda: store.delete_prefix(""),
        lambda: store.copy("k", "j"),
    ):
        with pytest.raises(ReadOnly):
            call()
    store.flush()  # nothing pending: nothing to refuse


def test_base_refusing_the_put_fails_the_flush_with_read_only() -> None:
    mem, _ = over_memory(make_zip({"k": b"v"}))
    faulty = FaultyStore(mem)
    store = ZipStore(faulty, ARCHIVE)
    store.set("k", b"w")
    faulty.fail("put_file", ReadOnly, times=None)
    with pytest.raises(ReadOnly):
        store.flush()
    assert store.get("k") == b"w"
    assert unzip(archive_of(mem)) == {"k": b"v"}


def test_refresh_sees_outside_changes_and_keeps_pending_ones() -> None:
    mem, store = over_memory(make_zip({"a": b"1"}))
    assert store.get("a") == b"1"
    store.set("mine", b"m")
    mem.set(ARCHIVE, make_zip({"a": b"2", "b": b"3"}))
    assert store.get("b") is None  # the index is cached until refresh
    store.refresh()
    assert (store.get("a"), store.get("b"), store.get("mine")) == (b"2", b"3", b"m")


def test_readers_during_flushes_see_whole_values() -> None:
    fixed = {f"fixed/{i}": os.urandom(3000 + i) for i in range(20)}
    mem, store = over_memory(make_zip({"a0": b"first", **fixed}, zipfile.ZIP_STORED))
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                for key, value in fixed.items():
                    assert store.get(key) == value
                    assert store.get(key, ByteRange(100, 50)) == value[100:150]
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for i in range(6):
            store.set("a0", b"x" * (i * 777))  # shifts every other member's offset
            store.flush()
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert unzip(archive_of(mem))["fixed/7"] == fixed["fixed/7"]


# -- where rewrites write, what they leave, how they fail ----------------------------------------


class MovingFileStore(FileStore):
    """Remembers the local files put or moved into place. A FileStore itself, not a wrapper:
    the zip adapter rewrites beside the archive only over a FileStore."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.moved: list[str] = []
        self.put: list[str] = []

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self.moved.append(os.fspath(path))
        super().move_file(key, path)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self.put.append(os.fspath(path))
        super().put_file(key, path)


def test_file_base_rewrites_beside_the_archive_and_renames(tmp_path: Path) -> None:
    base = MovingFileStore(tmp_path / "root")
    (tmp_path / "root" / "arch").mkdir(parents=True)
    (tmp_path / "root" / ARCHIVE).write_bytes(make_zip({"k": b"old"}))
    store = ZipStore(base, ARCHIVE, tmp_dir=str(tmp_path / "elsewhere"))
    store.set("k", b"new")
    store.flush()
    assert base.put == []
    [moved] = base.moved
    folder, name = os.path.split(moved)
    assert folder == str(tmp_path / "root" / "arch")  # same filesystem: a rename
    assert name.startswith(".a.zip.n5fs~")
    assert tempnames.is_partial(name)
    assert tempnames.writer_of(name) == tempnames.current()
    assert os.listdir(tmp_path / "root" / "arch") == ["a.zip"]
    assert unzip((tmp_path / "root" / ARCHIVE).read_bytes()) == {"k": b"new"}


def test_file_base_creates_a_new_archive_in_a_new_folder(tmp_path: Path) -> None:
    store = ZipStore(FileStore(tmp_path / "root"), "new/dir/a.zip")
    store.set("k", b"v")
    store.flush()
    assert os.listdir(tmp_path / "root" / "new" / "dir") == ["a.zip"]
    assert unzip((tmp_path / "root" / "new/dir/a.zip").read_bytes()) == {"k": b"v"}


def test_other_bases_write_a_writer_tagged_temp_archive_in_tmp_dir(tmp_path: Path) -> None:
    base = CountingStore(MemoryStore())
    store = ZipStore(base, ARCHIVE, tmp_dir=str(tmp_path))
    store.set("k", b"v")
    store.flush()
    [put] = [call.src for call in base.calls_of("put_file")]  # the local files put, by name
    folder, name = os.path.split(put)
    assert folder == str(tmp_path)
    assert name.startswith(".n5fs-zip-")
    assert "-a.zip.n5fs~" in name
    assert tempnames.writer_of(name) == tempnames.current()
    assert os.listdir(tmp_path) == []
    other = ZipStore(MemoryStore("x/"), ARCHIVE, tmp_dir=str(tmp_path))
    assert other._temps.stem != store._temps.stem  # another archive's URL, another name


def dead_temp_name(stem: str) -> str:
    """A temp name made by a process that has exited."""
    code = "import sys; from n5fs.kvstore.tempnames import temp_name; print(temp_name(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", code, stem], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_leftovers_beside_the_archive_only_this_archives_and_not_below(tmp_path: Path) -> None:
    folder = tmp_path / "root" / "arch"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.zip").write_bytes(make_zip({"k": b"v"}))
    dead = folder / dead_temp_name("a.zip")
    live = folder / tempnames.temp_name("a.zip")  # this process: a rewrite in flight
    others = [
        folder / dead_temp_name("b.zip"),  # another archive's
        folder / "sub" / dead_temp_name("a.zip"),  # below the folder: not scanned
        folder / ".a.zip.0123456789abcdef0123456789abcdef.n5fs-partial",  # no writer tag
    ]
    for path in (dead, live, *others):
        path.write_bytes(b"PK half an archive")
    store = ZipStore(FileStore(tmp_path / "root"), ARCHIVE)
    found = {leftover.path: leftover for leftover in store.leftovers()}
    assert set(found) == {f"arch/{dead.name}", f"arch/{live.name}"}
    assert found[f"arch/{dead.name}"].dead
    assert not found[f"arch/{live.name}"].dead
    assert found[f"arch/{dead.name}"].what == "temp archive"
    assert found[f"arch/{dead.name}"].size == len(b"PK half an archive")
    assert store.leftovers("sub/") == ()
    assert [leftover.path for leftover in store.sweep()] == [f"arch/{dead.name}"]
    assert not dead.exists()
    assert live.exists()
    assert all(path.exists() for path in others)
    assert store.get("k") == b"v"


def test_leftovers_in_the_temp_dir_of_other_bases(tmp_path: Path) -> None:
    store = ZipStore(MemoryStore(), ARCHIVE, tmp_dir=str(tmp_path))
    other = ZipStore(MemoryStore("x/"), ARCHIVE, tmp_dir=str(tmp_path))
    dead = tmp_path / dead_temp_name(store._temps.stem)
    not_ours = tmp_path / dead_temp_name(other._temps.stem)
    for path in (dead, not_ours):
        path.write_bytes(b"PK")
    [leftover] = store.leftovers()
    assert leftover.path == str(dead)
    assert leftover.dead
    assert "pid" in leftover.writer
    assert store.sweep() == (leftover,)
    assert os.listdir(tmp_path) == [not_ours.name]


def test_remove_leftover_removes_nothing_but_this_archives_temp_archives(tmp_path: Path) -> None:
    store = ZipStore(FileStore(tmp_path), "a.zip")
    victim = tmp_path / "precious"
    victim.write_bytes(b"keep")
    forged = tempnames.Leftover("precious", "temp archive", 4, 0.0, "nobody", dead=True)
    with pytest.raises(InvalidKey):
        store.remove_leftover(forged)
    outside = tempnames.Leftover(str(victim), "temp archive", 4, 0.0, "nobody", dead=True)
    with pytest.raises(InvalidKey):
        ZipStore(MemoryStore(), "a.zip", tmp_dir=str(tmp_path / "t")).remove_leftover(outside)
    assert victim.read_bytes() == b"keep"


def test_size_bound_holds_for_incompressible_and_copied_members() -> None:
    old = make_zip({"copied": os.urandom(5000), "dir/": b"", "gone": b"g"}, comment=b"c" * 40)
    mem, store = over_memory(old)
    store.set("random", os.urandom(70_000))
    store.set("zeros", bytes(70_000))
    store.delete("gone")
    index = store._index_locked()
    changes = {key: store._overlay[key] for key in store._overlay}
    kept = [m for m in index.members if m.name not in changes]
    bound = ziprewrite.size_bound(index.start, kept, changes, index.comment)
    store.flush()
    assert len(archive_of(mem)) <= bound < len(archive_of(mem)) + 1000 + 70_000


@pytest.mark.parametrize(
    ("error", "expected", "code"),
    [
        (lambda msg: PermissionError(errno.EACCES, msg), PermissionError, errno.EACCES),
        (lambda msg: OSError(errno.EIO, msg), OSError, errno.EIO),
        (StoreUnavailable, StoreUnavailable, errno.EIO),
        (lambda msg: OSError(errno.ENOSPC, msg), NoSpace, errno.ENOSPC),
    ],
)
def test_a_failed_rewrite_names_the_archive_and_keeps_its_errno(
    tmp_path: Path, error: Any, expected: type[Exception], code: int
) -> None:
    mem, _ = over_memory(make_zip({"k": b"v"}))
    faulty = FaultyStore(mem)
    store = ZipStore(faulty, ARCHIVE, tmp_dir=str(tmp_path))
    store.set("k", b"w")
    store.set("j", b"x")
    faulty.fail("put_file", error)
    with pytest.raises(expected) as info:
        store.flush()
    assert errno_of(info.value) == code
    assert repr(ARCHIVE) in str(info.value)
    assert "2 staged change(s) stay pending" in str(info.value)
    assert "injected fault" in str(info.value)
    assert os.listdir(tmp_path) == []
    assert unzip(archive_of(mem)) == {"k": b"v"}
    store.flush()
    assert unzip(archive_of(mem)) == {"k": b"w", "j": b"x"}


# -- specs ----------------------------------------------------------------------------------------


def test_opened_from_a_url_over_a_file(tmp_path: Path) -> None:
    (tmp_path / "x.zip").write_bytes(make_zip({"in/k": b"v"}))
    url = f"file://{tmp_path}/x.zip|zip:in/"
    with open_store(url) as store:
        assert isinstance(store, ZipStore)
        assert store.get("k") == b"v"
        assert store.spec == ZipSpec(path="in/", base=FileSpec(path=f"{tmp_path}/x.zip"))
        assert parse_spec(store.spec.to_json()) == store.spec
        store.set("j", b"w")
    assert unzip((tmp_path / "x.zip").read_bytes()) == {"in/k": b"v", "in/j": b"w"}


def test_memory_url_opens_an_empty_archive() -> None:
    store = open_store("memory://arch/a.zip|zip:")
    assert isinstance(store, ZipStore)
    assert store.archive_key == "a.zip"
    assert store.list("") == store.list("", delimiter=None)
    assert store.list("").keys == ()
    assert store.spec.to_url() == "memory://arch/a.zip|zip:"


# -- the shared contract -------------------------------------------------------------------------


class _ZipContract(KvStoreContract):
    """seed rebuilds the archive with zipfile; peek flushes, then reads it with zipfile."""

    many_keys = 1200
    mtime_resolution = 2.0  # members carry DOS dates
    inner: ClassVar[str] = ""

    def native_read(self, store: ZipStore) -> bytes | None:
        raise NotImplementedError

    def native_write(self, store: ZipStore, data: bytes) -> None:
        raise NotImplementedError

    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        self.seed_many(store, [(key, value)])

    def seed_many(self, store: KvStore, items: Any) -> None:
        assert isinstance(store, ZipStore)
        new = {self.inner + k: v for k, v in items}
        old = self.native_read(store)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as out:
            if old:
                with zipfile.ZipFile(io.BytesIO(old)) as src:
                    for info in src.infolist():
                        if info.filename not in new:
                            out.writestr(info, src.read(info))
            for name, value in new.items():
                out.writestr(name, value)
        self.native_write(store, buf.getvalue())
        store.refresh()

    def peek(self, store: KvStore, key: str) -> bytes | None:
        assert isinstance(store, ZipStore)
        store.flush()
        data = self.native_read(store)
        if data is None:
            return None
        with zipfile.ZipFile(io.BytesIO(data)) as src:
            try:
                return src.read(self.inner + key)
            except KeyError:
                return None


class TestZipOverMemory(_ZipContract):
    persistent = False
    inner = "in/side/"

    @pytest.fixture
    def store(self) -> ZipStore:
        return ZipStore(MemoryStore(), ARCHIVE, self.inner)

    def native_read(self, store: ZipStore) -> bytes | None:
        assert isinstance(store.base, MemoryStore)
        entry = store.base._data.get(ARCHIVE)
        return None if entry is None else entry[0]

    def native_write(self, store: ZipStore, data: bytes) -> None:
        assert isinstance(store.base, MemoryStore)
        store.base._data[ARCHIVE] = (data, 0.0)


class TestZipOverFile(_ZipContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> ZipStore:
        return ZipStore(FileStore(tmp_path / "root"), ARCHIVE)

    def _path(self, store: ZipStore) -> Path:
        assert isinstance(store.base, FileStore)
        return store.base.root / ARCHIVE

    def native_read(self, store: ZipStore) -> bytes | None:
        path = self._path(store)
        return path.read_bytes() if path.exists() else None

    def native_write(self, store: ZipStore, data: bytes) -> None:
        path = self._path(store)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.mark.s3
@pytest.mark.slow
class TestZipOverS3(_ZipContract):
    @pytest.fixture
    def store(self, s3_server: Any, s3_bucket: str) -> ZipStore:
        from n5fs.kvstore.s3 import S3Store

        self.client = s3_server.client()
        self.bucket = s3_bucket
        spec = S3Spec(bucket=s3_bucket, path="", endpoint=s3_server.endpoint)
        return ZipStore(S3Store(spec), ARCHIVE)

    def native_read(self, store: ZipStore) -> bytes | None:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=ARCHIVE)["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return body

    def native_write(self, store: ZipStore, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=ARCHIVE, Body=data)
