"""Reads without opens (zero-message opens of a read-only mount of local files), gateway
level: the descriptor each thread holds, when it is kept, reopened and closed."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from n5fs.errors import KeyNotFound
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.namespace.control import STATS_BLOCK
from n5fs.gateway.read.unopened import REUSE_SECONDS, UnopenedReads
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.tempnames import PARTIAL_SUFFIX
from n5fs.testing.doubles import Clock


@pytest.fixture
def gateway(tmp_path: Path) -> Gateway:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"x" * 300_000)
    (tmp_path / "a" / "y").write_bytes(b"y" * 10)
    return Gateway(FileStore(tmp_path), GatewayConfig(read_only=True))


def opens(gw: Gateway) -> int:
    return gw.reader.store_reads


def test_a_read_only_local_mount_may_skip_opens(gateway: Gateway, tmp_path: Path) -> None:
    assert gateway.opens_optional
    assert not Gateway(FileStore(tmp_path), GatewayConfig()).opens_optional  # read-write


def test_a_thread_keeps_its_descriptor_for_one_path_then_reopens(gateway: Gateway) -> None:
    clock = Clock()
    reads = UnopenedReads(gateway.reader, clock)
    fd = reads.read_fd("/a/x", 131072, 0)
    assert os.pread(fd, 3, 0) == b"xxx"
    assert reads.read_fd("/a/x", 131072, 131072) == fd  # read-ahead: no second open
    assert opens(gateway) == 1
    clock.now += REUSE_SECONDS + 0.1  # a file replaced on disk is seen once this passed
    reads.read_fd("/a/x", 131072, 0)
    assert opens(gateway) == 2
    fd_y = reads.read_fd("/a/y", 4096, 0)  # another path: the held one is closed first
    assert os.pread(fd_y, 20, 0) == b"y" * 10
    assert opens(gateway) == 3
    assert gateway.reader.bytes_out == 131072 * 3 + 10
    reads.close()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd_y)


def test_threads_share_a_files_descriptor_and_the_last_holder_closes_it(
    gateway: Gateway,
) -> None:
    """libfuse reads the descriptor after the call returned, on the calling thread: a hold
    ends only at that thread's next read, and a descriptor closes when no thread holds it.
    Threads reading one file share one descriptor (one read-ahead stream on the backing
    file, as one open's handles do)."""
    reads = UnopenedReads(gateway.reader)
    mine = reads.read_fd("/a/x", 4096, 0)
    with ThreadPoolExecutor(1) as worker:  # one other thread, alive throughout
        assert worker.submit(reads.read_fd, "/a/x", 4096, 4096).result() == mine
        assert opens(gateway) == 1
        fd_y = worker.submit(reads.read_fd, "/a/y", 10, 0).result()  # the worker lets go of x
        assert os.pread(mine, 3, 0) == b"xxx"  # this thread still holds it
        assert reads.read_fd("/a/y", 10, 0) == fd_y  # shared; x has no holder left: closed
        assert opens(gateway) == 2
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(mine)
    reads.close()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd_y)


def test_a_miss_a_temp_name_and_a_control_entry_have_no_descriptor(
    gateway: Gateway, tmp_path: Path
) -> None:
    with pytest.raises(KeyNotFound):
        gateway.read_fd_unopened("/a/nothing", 10, 0)
    (tmp_path / "a" / f"x{PARTIAL_SUFFIX}").write_bytes(b"a writer's temp file")
    with pytest.raises(KeyNotFound):
        gateway.read_fd_unopened(f"/a/x{PARTIAL_SUFFIX}", 10, 0)
    assert gateway.read_fd_unopened("/.n5fs/stats.json", 10, 0) is None
    assert gateway.read_unopened("/.n5fs/stats.json", 1, 0) == b"{"
    assert gateway.read_unopened("/a/y", 100, 5) == b"y" * 5  # a file, as bytes
    with pytest.raises(KeyNotFound):
        gateway.read_unopened("/a/nothing", 10, 0)


def test_a_control_entry_read_without_an_open_is_announced_stale(gateway: Gateway) -> None:
    told: list[list[str]] = []
    gateway.subscribe(lambda paths: told.append(list(paths)))
    gateway.read_unopened("/.n5fs/stats.json", 4096, 0)
    assert ["/.n5fs/stats.json"] in told


def test_stats_json_keeps_its_size_while_its_counters_change(gateway: Gateway) -> None:
    """The kernel reads a file it opened by itself up to the size it was told: a document
    of another length would come out cut, or padded with zeros."""
    before = gateway.read_unopened("/.n5fs/stats.json", 1 << 20, 0)
    fd = gateway.read_fd_unopened("/a/x", 131072, 0)
    assert fd is not None
    after = gateway.read_unopened("/.n5fs/stats.json", 1 << 20, 0)
    assert json.loads(after)["bytes_out"] > json.loads(before)["bytes_out"]
    assert len(after) == len(before) == STATS_BLOCK
    assert gateway.stat("/.n5fs/stats.json").size == STATS_BLOCK


def test_two_threads_opening_one_file_at_once_end_with_one_descriptor(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is opened outside the lock: the worker opens x and stops before sharing it,
    this thread opens and shares x meanwhile; the worker's descriptor is then the spare."""
    reads = UnopenedReads(gateway.reader)
    real = gateway.reader.open_local
    opened, go = threading.Event(), threading.Event()

    def gated(key: str) -> object:
        local = real(key)
        if not opened.is_set():
            opened.set()
            assert go.wait(10)
        return local

    monkeypatch.setattr(gateway.reader, "open_local", gated)
    with ThreadPoolExecutor(1) as worker:
        first = worker.submit(reads.read_fd, "/a/x", 10, 0)
        assert opened.wait(10)
        mine = reads.read_fd("/a/x", 10, 0)
        go.set()
        assert first.result() == mine
    assert opens(gateway) == 2
    reads.close()
