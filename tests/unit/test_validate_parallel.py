"""``n5fs validate``'s parallel path: chunks checked on workers while the store is listed, read
from local files where the store has them, in a bounded window; the report the same, in the
same order, however many workers did the work."""

from __future__ import annotations

import errno
import json
import os
import threading
from concurrent import futures
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from n5fs.errors import StoreUnavailable
from n5fs.formats.zarr2 import Zarr2ArrayNode, Zarr2Format
from n5fs.kvstore import open_store
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.wrappers import ForwardingStore
from n5fs.testing.doubles import CountingStore, FaultyStore
from n5fs.validate import (
    BATCH_BYTES,
    ChunkChecker,
    ChunkJob,
    Progress,
    Report,
    Validator,
    validate_store,
)
from n5fs.validate import chunks as chunks_module
from n5fs.validate.chunks import VANISHED

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from n5fs.kvstore.base import KvStore

SIDE = 4
ROWS, COLS = 20, 30  # 600 chunks: many batches on any number of workers
BAD = {"0.7": b"not zlib", "11.3": b"", "19.29": b"\x78\x9c\x03\x00"}


def zarray(rows: int = ROWS, cols: int = COLS) -> dict[str, Any]:
    return {
        "zarr_format": 2,
        "shape": [rows * SIDE, cols * SIDE],
        "chunks": [SIDE, SIDE],
        "dtype": "<u2",
        "compressor": {"id": "zlib", "level": 1},
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }


def node_of(doc: dict[str, Any]) -> Zarr2ArrayNode:
    node = Zarr2Format().parse_metadata(".zarray", json.dumps(doc).encode())
    assert isinstance(node, Zarr2ArrayNode)
    return node


def fill(store: KvStore, prefix: str = "", bad: dict[str, bytes] | None = None) -> int:
    """A Zarr v2 array of ROWS x COLS zlib chunks at ``prefix``, ``bad`` ones replaced."""
    doc = zarray()
    node = node_of(doc)
    store.set(prefix + ".zarray", json.dumps(doc).encode())
    count = 0
    for row in range(ROWS):
        for col in range(COLS):
            values = np.full((SIDE, SIDE), row * COLS + col, dtype="<u2")
            store.set(f"{prefix}{row}.{col}", node.encode_chunk((row, col), values))
            count += 1
    for key, data in (bad or {}).items():
        store.set(prefix + key, data)
    return count


def test_bad_chunks_found_by_workers_are_reported_with_key_and_reason(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    fill(store, bad=BAD)
    report = Validator(store, jobs=3).run()
    assert report.chunks == ROWS * COLS
    assert report.metadata == 1
    assert [f.key for f in report.invalid] == sorted(BAD)  # sorted, not in finishing order
    for found in report.invalid:
        assert found.rule
        assert found.message
    assert not report.unreadable


@pytest.mark.parametrize("store_kind", ["file", "memory"])
def test_report_is_the_same_for_any_number_of_workers(tmp_path: Path, store_kind: str) -> None:
    store: KvStore = FileStore(tmp_path) if store_kind == "file" else MemoryStore()
    fill(store, "a/", bad=BAD)
    fill(store, "b/", bad={"3.3": b"junk"})
    store.set("b/99.0", b"junk")  # out of the grid: found while listing, not by a worker
    store.set("README", b"hello")
    reports = [Validator(store, jobs=jobs).run() for jobs in (1, 2, 5)]
    first = reports[0]
    assert [f.key for f in first.invalid] == [
        *(f"a/{key}" for key in sorted(BAD)),
        "b/3.3",
        "b/99.0",
    ]
    assert first.invalid[-1].rule == "out-of-grid"
    assert first.other == 1
    for report in reports[1:]:
        assert report.invalid == first.invalid
        assert report.unreadable == first.unreadable
        assert report.to_json() == first.to_json()


def test_progress_counts_every_chunk_and_ends_listed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    fill(store)
    validator = Validator(store, jobs=2)
    validator.run()
    progress = validator.progress
    assert progress.listing_done
    assert progress.total_chunks == progress.done_chunks == ROWS * COLS
    assert progress.done_bytes == sum(
        path.stat().st_size for path in tmp_path.iterdir() if path.name != ".zarray"
    )


def checker_over(store: KvStore, jobs: int = 1) -> tuple[ChunkChecker, Report]:
    report = Report()
    return ChunkChecker(store, report, Progress(), jobs), report


def one_job(key: str, size: int) -> ChunkJob:
    return ChunkJob(node_of(zarray()), key, (0, 0), size)


def test_local_read_takes_the_bytes_written_after_the_listing(tmp_path: Path) -> None:
    """The listed size is a hint: a chunk that grew since is read whole and judged whole."""
    store = FileStore(tmp_path)
    node = node_of(zarray())
    good = node.encode_chunk((0, 0), np.arange(SIDE * SIDE, dtype="<u2").reshape(SIDE, SIDE))
    store.set("0.0", good + b"trailing bytes")
    checker, report = checker_over(store)
    with checker:
        checker.add(one_job("0.0", len(good)))  # listed before the tail was appended
        checker.finish()
    assert [f.key for f in report.invalid] == ["0.0"]
    assert "trailing" in report.invalid[0].rule or "after" in report.invalid[0].message

    store.set("0.0", good)
    checker, report = checker_over(store)
    with checker:
        checker.add(one_job("0.0", len(good) + 1000))  # listed larger: it shrank since
        checker.finish()
    assert report.ok
    assert report.chunks == 1


def test_a_chunk_gone_since_the_listing_is_unreadable_not_invalid_nor_valid(
    tmp_path: Path,
) -> None:
    """Its bytes were never read: it is not invalid, and the report is not valid either."""
    checker, report = checker_over(FileStore(tmp_path))
    with checker:
        checker.add(one_job("0.0", 10))
        checker.finish()
    assert not report.invalid
    assert not report.ok
    assert report.chunks == 0  # not counted as checked
    assert [(f.key, f.message) for f in report.unreadable] == [("0.0", VANISHED)]


def test_a_link_out_of_the_root_is_not_read_through(tmp_path: Path) -> None:
    """Local reads ask the store for the path: a symlink leading out of the root is absent
    to them as it is to ``get``."""
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "outside"
    secret.write_bytes(b"x" * 40)
    (root / "0.0").symlink_to(secret)
    checker, report = checker_over(FileStore(root))
    with checker:
        checker.add(one_job("0.0", 40))
        checker.finish()
    assert [(f.key, f.message) for f in report.unreadable] == [("0.0", VANISHED)]


def test_a_link_inside_the_root_is_read_through_get(tmp_path: Path) -> None:
    """Chunks are opened relative to their folder without following links; a chunk that is
    a link is asked of ``get``, which follows a link to a file inside the root."""
    node = node_of(zarray())
    good = node.encode_chunk((0, 0), np.zeros((SIDE, SIDE), dtype="<u2"))
    store = FileStore(tmp_path)
    store.set("data/real", good)
    (tmp_path / "0.0").symlink_to(tmp_path / "data" / "real")
    checker, report = checker_over(store)
    with checker:
        checker.add(one_job("0.0", len(good)))
        checker.finish()
    assert report.ok, report.to_json()
    assert report.chunks == 1


def test_a_fifo_at_a_chunk_name_is_judged_not_waited_on(tmp_path: Path) -> None:
    """A FIFO planted where a chunk was listed must not block a worker (no writer ever
    comes): it reads as empty and is reported invalid."""
    os.mkfifo(tmp_path / "0.0")
    store = FileStore(tmp_path)
    checker, report = checker_over(store)
    done = threading.Event()

    def run() -> None:
        with checker:
            checker.add(one_job("0.0", 10))
            checker.finish()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "the check of a FIFO never ended"
    assert [f.key for f in report.invalid] == ["0.0"]


def test_chunks_are_opened_relative_to_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One resolution of a folder per batch, not a path walk (``lstat`` calls) per chunk."""
    store = FileStore(tmp_path)
    count = fill(store, "a/b/")
    lstats: list[str] = []
    real_lstat = os.lstat

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        lstats.append(str(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", counting)
    report = validate_store(store, jobs=1)
    assert report.ok
    assert report.chunks == count
    assert [p for p in lstats if os.path.basename(p)[:1].isdigit()] == []  # no chunk's
    assert len([p for p in lstats if p.endswith(f"a{os.sep}b")]) < count // 10  # per batch


def test_a_fault_on_one_key_makes_only_it_unreadable_on_stores_without_local_files() -> None:
    inner = MemoryStore()
    fill(inner)
    faulty = FaultyStore(inner)
    for op in ("get_many", "get"):  # the batch fails, then the key alone
        faulty.fail(op, times=None, when=lambda key: key == "5.5")
    report = Validator(faulty, jobs=2).run()
    assert not report.invalid
    assert not report.ok  # one chunk was not read: never "valid"
    assert report.chunks == ROWS * COLS - 1  # the others were read and judged
    assert [f.to_json() for f in report.unreadable] == [
        {"key": "5.5", "rule": "StoreUnavailable", "message": "injected fault: get '5.5'"}
    ]


class OSErrorOnGet(ForwardingStore):
    """Reading ``key`` fails as a local file system does: a plain ``OSError`` (FaultyStore
    raises n5fs errors only), and alone (a batch is read key by key, so its others succeed)."""

    def __init__(self, inner: KvStore, key: str, error: OSError) -> None:
        super().__init__(inner)
        self.key = key
        self.error = error

    def get(self, key: str, byte_range: Any = None) -> bytes | None:
        if key == self.key:
            raise self.error
        return super().get(key, byte_range)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return {key: self.get(key) for key in keys}


def test_an_os_error_reading_a_chunk_is_unreadable_not_the_end_of_the_run() -> None:
    inner = MemoryStore()
    fill(inner)
    error = PermissionError(errno.EACCES, "Permission denied", "/data/5.5")
    report = Validator(OSErrorOnGet(inner, "5.5", error), jobs=2).run()
    assert not report.invalid
    assert report.chunks == ROWS * COLS - 1
    assert [f.to_json() for f in report.unreadable] == [
        {
            "key": "5.5",
            "rule": "PermissionError",
            "message": "[Errno 13] Permission denied: '/data/5.5'",
        }
    ]


def test_a_metadata_file_that_cannot_be_read_is_unreadable_and_not_counted() -> None:
    """Detection read it (``get_many``); the check's own read (``get``) fails."""
    inner = MemoryStore()
    fill(inner)
    faulty = FaultyStore(inner)
    faulty.fail("get", times=None, when=lambda key: key == ".zarray")
    report = Validator(faulty, jobs=2).run()
    assert report.metadata == 0
    assert report.chunks == ROWS * COLS
    assert [(f.key, f.rule) for f in report.unreadable] == [(".zarray", "StoreUnavailable")]
    assert not report.invalid
    assert not report.ok


def test_a_failed_search_for_leftovers_is_unreadable() -> None:
    inner = MemoryStore()
    fill(inner)

    faulty = FaultyStore(inner)
    faulty.fail("leftovers", lambda _: StoreUnavailable("listing of uploads failed"))
    report = Validator(faulty, jobs=1).run()
    assert [f.to_json() for f in report.unreadable] == [
        {"key": "<root>", "rule": "leftovers", "message": "listing of uploads failed"}
    ]
    assert not report.ok


def test_the_listing_waits_while_the_window_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """jobs=1: one batch running and one queued; the third batch waits (bounded memory)."""
    inner = MemoryStore()
    for i in range(6):
        inner.set(f"k{i}", b"x")
    store = CountingStore(inner)
    batches = store.gate("get_many", when="before", times=None)  # every batch waits
    blocked = threading.Event()
    real_wait = futures.wait  # what the checker waits with

    def waiting(*args: Any, **kwargs: Any) -> Any:
        blocked.set()
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(chunks_module, "wait", waiting)
    checker, report = checker_over(store, jobs=1)
    added: list[int] = []

    def lister() -> None:
        for i in range(6):  # each job fills a batch by itself
            checker.add(ChunkJob(node_of(zarray()), f"k{i}", (0, 0), BATCH_BYTES))
            added.append(i)
        checker.finish()

    thread = threading.Thread(target=lister)
    with checker:
        thread.start()
        batches.wait_reached()
        assert blocked.wait(30)
        # add(3) submits the third batch and waits: two are in the window, one is running
        assert added == [0, 1, 2]
        assert store.count("get_many") == 1
        batches.release()
        thread.join(30)
    assert not thread.is_alive()
    assert added == list(range(6))
    assert report.chunks == 6
    assert len(report.invalid) == 6  # b"x" is no zlib stream; each reported under its key
    assert [f.key for f in sorted(report.invalid, key=lambda f: f.key)] == [
        f"k{i}" for i in range(6)
    ]


@pytest.mark.s3
@pytest.mark.slow
def test_s3_chunks_are_checked_page_by_page(s3_server: Any, s3_bucket: str) -> None:
    store = open_store(
        {
            "driver": "s3",
            "bucket": s3_bucket,
            "path": "arr/",
            "endpoint": s3_server.endpoint,
            "aws_region": s3_server.region,
        }
    )
    staged = MemoryStore()
    fill(staged, bad={"2.2": b"junk"})
    with store:
        with futures.ThreadPoolExecutor(8) as pool:  # 600 PUTs, a few at a time
            keys = staged.list("", delimiter=None).names()
            seeded = pool.map(lambda key: store.set(key, staged.get(key) or b""), keys)
            assert len(list(seeded)) == ROWS * COLS + 1
        report = validate_store(store)
    assert report.chunks == ROWS * COLS
    assert [f.key for f in report.invalid] == ["2.2"]
