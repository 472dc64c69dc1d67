"""The read path over a local file store: a read-only handle reads its own descriptor of the
stored file (libfuse reads from it in C), what it sees when a commit or another process
replaces the file, and what each open tells the kernel to do with the pages it caches (keep,
drop, bypass)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from n5fs.errors import KeyNotFound
from n5fs.gateway import Gateway
from n5fs.gateway.read.byte_cache import OpenedStamps, Stamp
from n5fs.gateway.read.reader import PageCache
from n5fs.kvstore.base import KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import CountingStore, FaultyStore

OLD = b"old bytes " * 1000
NEW = b"NEW BYTES " * 1000  # same size: only the bytes tell the versions apart


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "f.bin").write_bytes(OLD)
    return tmp_path


@pytest.fixture
def gw(root: Path) -> Gateway:
    return Gateway(FileStore(root))


def read_all(gw: Gateway, fh: int, step: int = 4096) -> bytes:
    out = bytearray()
    while chunk := gw.read(fh, step, len(out)):
        out += chunk
    return bytes(out)


def replace_behind(root: Path, data: bytes, name: str = "plain/f.bin") -> None:
    """Another process replaces the stored file (a new inode, as every atomic writer does)."""
    tmp = root / f"{name}.other"
    tmp.write_bytes(data)
    os.replace(tmp, root / name)


def page_cache_of_open(gw: Gateway, path: str = "/plain/f.bin") -> PageCache:
    fh = gw.open(path, os.O_RDONLY)
    try:
        return gw.page_cache(fh)
    finally:
        gw.release(fh)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# == reads from the local descriptor ==============================================================


def test_reads_come_from_the_local_file_not_the_store(root: Path) -> None:
    store = CountingStore(FileStore(root))
    gw = Gateway(store)
    fh = gw.open("/plain/f.bin", os.O_RDONLY)
    assert read_all(gw, fh) == OLD
    assert gw.read(fh, 100, len(OLD) - 10) == OLD[-10:]  # short at the end, as pread
    assert gw.read(fh, 100, len(OLD) + 5) == b""
    gw.release(fh)
    assert store.count("get") == 0
    assert gw.stats()["bytes_out"] >= len(OLD)


def test_read_fd_hands_out_the_descriptor_and_counts_what_it_serves(gw: Gateway) -> None:
    fh = gw.open("/plain/f.bin", os.O_RDONLY)
    fd = gw.read_fd(fh, 4096, 0)
    assert fd is not None
    assert os.pread(fd, 4096, 0) == OLD[:4096]
    before = gw.stats()["bytes_out"]
    gw.read_fd(fh, 4096, len(OLD) - 100)  # libfuse will get 100 bytes there
    assert gw.stats()["bytes_out"] == before + 100
    gw.release(fh)


def test_stores_without_local_files_read_through_the_store() -> None:
    store = MemoryStore()
    store.set("plain/f.bin", OLD)
    gw = Gateway(store)
    fh = gw.open("/plain/f.bin", os.O_RDONLY)
    assert gw.read_fd(fh, 4096, 0) is None
    assert read_all(gw, fh) == OLD
    gw.release(fh)


def test_a_faulty_store_keeps_its_faults_on_the_read_path(root: Path) -> None:
    """FaultyStore hides the local file: an injected get fault still fails the read."""
    store = FaultyStore(FileStore(root))
    gw = Gateway(store)
    fh = gw.open("/plain/f.bin", os.O_RDONLY)
    assert gw.read_fd(fh, 10, 0) is None
    store.fail("get", KeyNotFound)
    with pytest.raises(KeyNotFound):
        gw.read(fh, 10, 0)
    gw.release(fh)


def test_release_closes_the_descriptor(gw: Gateway) -> None:
    before = open_fds()
    handles = [gw.open("/plain/f.bin", os.O_RDONLY) for _ in range(20)]
    assert open_fds() == before + 20
    for fh in handles:
        gw.release(fh)
    assert open_fds() == before
    node = gw.files.acquire("plain/f.bin")  # a fresh node: nothing left reading
    assert node.reading == {}
    gw.files.release(node)


# == what an open reader sees while the file is replaced ==========================================


def test_a_commit_that_replaces_the_file_leaves_an_open_reader_its_old_bytes(gw: Gateway) -> None:
    reader = gw.open("/plain/f.bin", os.O_RDONLY)
    first = gw.read(reader, 5000, 0)
    gw.write_file("/plain/f.tmp", NEW)
    gw.rename("/plain/f.tmp", "/plain/f.bin")  # zarr-python's and TensorStore's commit
    assert first + gw.read(reader, len(OLD), 5000) == OLD  # never a mix
    assert gw.read_file("/plain/f.bin") == NEW  # a new open reads the new file
    gw.release(reader)


def test_another_process_replacing_the_file(gw: Gateway, root: Path) -> None:
    reader = gw.open("/plain/f.bin", os.O_RDONLY)
    first = gw.read(reader, 5000, 0)
    replace_behind(root, NEW)
    assert first + gw.read(reader, len(OLD), 5000) == OLD
    assert gw.read_file("/plain/f.bin") == NEW  # even before the listing expires
    gw.release(reader)


def test_an_unlinked_file_stays_readable_through_an_open_handle(gw: Gateway) -> None:
    reader = gw.open("/plain/f.bin", os.O_RDONLY)
    gw.unlink("/plain/f.bin")
    assert read_all(gw, reader) == OLD  # as an unlinked file on disk
    gw.release(reader)
    with pytest.raises(KeyNotFound):
        gw.open("/plain/f.bin", os.O_RDONLY)


def test_a_file_being_written_is_read_through_the_staging(gw: Gateway) -> None:
    reader = gw.open("/plain/f.bin", os.O_RDONLY)
    writer = gw.open("/plain/f.bin", os.O_RDWR)
    gw.write(writer, b"XYZ", 0)
    assert gw.read_fd(reader, 10, 0) is None  # staged: libfuse must ask read()
    assert gw.read(reader, 10, 0) == b"XYZ" + OLD[3:10]  # both handles share the staging
    late = gw.open("/plain/f.bin", os.O_RDONLY)  # opened while staged: no descriptor at all
    assert gw.files.handle(late).local is None
    assert gw.read(late, 5, 0) == b"XYZ" + OLD[3:5]
    gw.flush(writer)
    gw.release(writer)
    assert gw.read(reader, 10, 0) == b"XYZ" + OLD[3:10]
    for fh in (reader, late):
        gw.release(fh)
    assert gw.read_file("/plain/f.bin") == b"XYZ" + OLD[3:]


# == what the kernel keeps of its pages ===========================================================


def test_an_unchanged_file_keeps_the_pages_from_its_second_open(gw: Gateway) -> None:
    assert page_cache_of_open(gw) is PageCache.DROP  # nothing known about its pages yet
    assert page_cache_of_open(gw) is PageCache.KEEP
    assert page_cache_of_open(gw) is PageCache.KEEP


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda gw, root: gw.write_file("/plain/f.bin", NEW), id="our-commit"),
        pytest.param(
            lambda gw, root: (
                gw.write_file("/plain/t", NEW),
                gw.rename("/plain/t", "/plain/f.bin"),
            ),
            id="our-rename-over",
        ),
        pytest.param(lambda gw, root: gw.utimens("/plain/f.bin", 1e9), id="our-utimens"),
        pytest.param(lambda gw, root: gw.truncate("/plain/f.bin", 10), id="our-truncate"),
        pytest.param(lambda gw, root: replace_behind(root, NEW), id="replaced-behind"),
        pytest.param(
            lambda gw, root: os.utime(root / "plain" / "f.bin", ns=(0, 10**18)),
            id="touched-behind",
        ),
        pytest.param(lambda gw, root: gw.drop_caches(), id="sighup"),
        pytest.param(
            lambda gw, root: gw.release(gw.open("/plain/f.bin", os.O_RDWR)), id="opened-to-write"
        ),
        pytest.param(
            lambda gw, root: (gw.rename("/plain", "/moved"), gw.rename("/moved", "/plain")),
            id="folder-moved-away-and-back",
        ),
    ],
)
def test_a_change_drops_the_pages_at_the_next_open(gw: Gateway, root: Path, change) -> None:
    page_cache_of_open(gw)
    assert page_cache_of_open(gw) is PageCache.KEEP
    change(gw, root)
    assert page_cache_of_open(gw) is PageCache.DROP
    assert page_cache_of_open(gw) is PageCache.KEEP  # and the version after is kept again


def test_a_second_reader_of_another_version_bypasses_the_pages(gw: Gateway, root: Path) -> None:
    """The kernel caches pages per name: an old reader's reads would fill them with old bytes
    a new reader could be served, so the new one reads around them while both are open."""
    old_reader = gw.open("/plain/f.bin", os.O_RDONLY)
    replace_behind(root, NEW)
    new_reader = gw.open("/plain/f.bin", os.O_RDONLY)
    assert gw.page_cache(new_reader) is PageCache.BYPASS
    assert read_all(gw, new_reader) == NEW
    assert read_all(gw, old_reader) == OLD
    same_version = gw.open("/plain/f.bin", os.O_RDONLY)  # still beside the old reader
    assert gw.page_cache(same_version) is PageCache.BYPASS
    for fh in (old_reader, new_reader, same_version):
        gw.release(fh)
    assert page_cache_of_open(gw) is PageCache.DROP  # the pages may hold old bytes
    assert page_cache_of_open(gw) is PageCache.KEEP


def test_readers_of_one_version_share_the_pages(gw: Gateway) -> None:
    page_cache_of_open(gw)
    first = gw.open("/plain/f.bin", os.O_RDONLY)
    second = gw.open("/plain/f.bin", os.O_RDONLY)
    assert gw.page_cache(first) is gw.page_cache(second) is PageCache.KEEP
    gw.release(first)
    gw.release(second)


def test_stores_without_local_files_keep_pages_by_the_listing_version() -> None:
    store = MemoryStore()
    store.set("plain/f.bin", OLD)
    gw = Gateway(store)
    assert page_cache_of_open(gw) is PageCache.DROP
    assert page_cache_of_open(gw) is PageCache.KEEP
    gw.write_file("/plain/f.bin", NEW)
    assert page_cache_of_open(gw) is PageCache.DROP
    assert page_cache_of_open(gw) is PageCache.KEEP


def test_control_files_bypass_the_pages(gw: Gateway) -> None:
    assert page_cache_of_open(gw, "/.n5fs/stats.json") is PageCache.BYPASS


class CommitWhileDeciding(OpenedStamps):
    """Runs ``change`` once, between an open's look at the file and the record of its stamp:
    the race of an open against a commit of the same file, made deterministic."""

    def __init__(self, change) -> None:
        super().__init__()
        self.change = change

    def opened(self, key: str, stamp: Stamp) -> bool:
        change, self.change = self.change, None
        if change is not None:
            change()
        return super().opened(key, stamp)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_commit_racing_an_open_is_never_kept_at_the_next(tmp_path: Path, kind: str) -> None:
    store: KvStore = FileStore(tmp_path) if kind == "file" else MemoryStore()
    store.set("plain/f.bin", OLD)
    gw = Gateway(store)
    page_cache_of_open(gw)
    assert page_cache_of_open(gw) is PageCache.KEEP
    gw.reader.cache.opened = CommitWhileDeciding(lambda: gw.write_file("/plain/f.bin", NEW))
    page_cache_of_open(gw)  # its stamp is the old file's, recorded after the commit
    assert page_cache_of_open(gw) is PageCache.DROP
    assert gw.read_file("/plain/f.bin") == NEW


def test_opened_stamps_stay_bounded() -> None:
    stamps = OpenedStamps(limit=3)
    for i in range(5):
        stamps.opened(f"k{i}", (1, 1.0))
    assert not stamps.opened("k0", (1, 1.0))  # forgotten for room: dropped, never wrongly kept
    assert stamps.opened("k4", (1, 1.0))
