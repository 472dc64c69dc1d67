"""``n5fs validate`` on local files: keys scanned by name (:mod:`n5fs.validate.localscan`) and
chunks checked in worker processes (:mod:`n5fs.validate.procs`). The processes find what the
threads find; a worker that dies ends the run with an error naming what it held, never a
valid report; no worker outlives the run, an interrupted one, or a parent killed outright."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pytest

from n5fs.cli import commands
from n5fs.cli.main import main as cli_main
from n5fs.formats.base import ArrayNode
from n5fs.formats.n5 import N5Format
from n5fs.formats.zarr2 import Zarr2ArrayNode
from n5fs.formats.zarr3 import Zarr3Format
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.tempnames import PARTIAL_SUFFIX
from n5fs.kvstore.wrappers import ForwardingStore
from n5fs.validate import ChunkChecker, ChunkJob, Progress, Report, Validator
from n5fs.validate import chunks as chunks_module
from n5fs.validate.chunks import VANISHED
from n5fs.validate.localscan import scan_keys
from n5fs.validate.procs import WorkerDied, Workers
from tests.unit.test_validate_parallel import BAD, COLS, ROWS, fill, node_of, zarray

if TYPE_CHECKING:
    from collections.abc import Callable


# -- the local scan ------------------------------------------------------------------------------


def tree_with_odd_entries(root: Path) -> FileStore:
    """Files at several depths, and every kind of entry a listing must judge."""
    store = FileStore(root)
    for key in ("top", "a/x", "a/b/y", "a/b/c/z", "d/e/f/g/h"):
        store.set(key, b"1")
    (root / "a" / f".x.w1{PARTIAL_SUFFIX}").write_bytes(b"p")  # a writer's temp file
    (root / "a" / "b" / "link-in").symlink_to(root / "a" / "x")  # a file inside: a key
    (root / "a" / "link-out").symlink_to("/etc/hostname")  # out of the root: no key
    (root / "a" / "link-folder").symlink_to(root / "a" / "b")  # a folder: not walked into
    (root / "a" / "b" / "loop").symlink_to("loop")  # a link to itself: no key
    (root / "self").symlink_to(".")  # a loop through a folder link: not walked into
    os.mkfifo(root / "a" / "fifo")  # no key
    (root / "empty").mkdir()
    return store


@pytest.mark.parametrize("prefix", ["", "a/", "a/b/", "d/e/", "nothing/"])
def test_the_local_scan_finds_the_keys_of_a_flat_listing(tmp_path: Path, prefix: str) -> None:
    store = tree_with_odd_entries(tmp_path)
    folder = store.local_folder(prefix)
    scanned = [] if folder is None else list(scan_keys(store, folder, prefix))
    assert sorted(scanned) == [info.key for info in store.list(prefix, delimiter=None).keys]
    assert len(scanned) == len(set(scanned))


def test_the_local_scan_of_a_folder_gone_is_empty(tmp_path: Path) -> None:
    store = tree_with_odd_entries(tmp_path)
    folder = store.local_folder("a/b/")
    assert folder is not None
    (tmp_path / "a" / "b").rename(tmp_path / "moved")
    assert list(scan_keys(store, folder, "a/b/")) == []


# -- processes find what threads find --------------------------------------------------------


class ReadyWorkers(Workers[ChunkJob]):
    """Workers the checker waits for (it goes on with threads while real ones start), so
    every chunk after the threshold goes to the processes; counts what they were sent, and
    runs ``on_submit`` (the test's hook) before each batch is sent."""

    sent: ClassVar[int] = 0
    on_submit: ClassVar[Callable[[Workers[ChunkJob], list[ChunkJob]], None] | None] = None
    started: ClassVar[list[ReadyWorkers]] = []

    def __init__(self, count: int) -> None:
        super().__init__(count)
        ReadyWorkers.started.append(self)

    def ready(self, *, block: bool = False) -> bool:
        return super().ready(block=True)

    def submit(self, jobs: list[ChunkJob], *args: Any) -> Any:
        ReadyWorkers.sent += len(jobs)
        if ReadyWorkers.on_submit is not None:
            ReadyWorkers.on_submit(self, jobs)
        return super().submit(jobs, *args)


@pytest.fixture
def ready_workers(monkeypatch: pytest.MonkeyPatch) -> type[ReadyWorkers]:
    monkeypatch.setattr(chunks_module, "Workers", ReadyWorkers)
    monkeypatch.setattr(ReadyWorkers, "sent", 0)
    monkeypatch.setattr(ReadyWorkers, "on_submit", None)
    monkeypatch.setattr(ReadyWorkers, "started", [])
    return ReadyWorkers


def write_array(
    store: FileStore, prefix: str, fmt: Any, name: str, doc: dict[str, Any]
) -> ArrayNode:
    """Every chunk of a 6x6 uint16 array of 2x2 chunks, chunk (1, 2) not one."""
    data = json.dumps(doc).encode()
    store.set(prefix + name, data)
    node = fmt.parse_metadata(name, data, path=prefix + name)
    assert isinstance(node, ArrayNode)
    for row in range(3):
        for col in range(3):
            values = np.full((2, 2), row * 3 + col, dtype="<u2")
            key = node.chunk_key((row, col))
            store.set(prefix + key, node.encode_chunk((row, col), values))
    store.set(prefix + node.chunk_key((1, 2)), b"not a chunk")
    return node


N5_DOC = {"dimensions": [6, 6], "blockSize": [2, 2], "dataType": "uint16"}
V3_DOC = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [6, 6],
    "data_type": "uint16",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "codecs": [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "gzip", "configuration": {"level": 1}},
    ],
    "fill_value": 0,
}


class VanishingStore(ForwardingStore):
    """Removes ``victim`` when a checker first asks for the local folder it is in: after the
    listing found it (the validator asks only for the array's own folder), before any
    worker reads it."""

    def __init__(self, inner: FileStore, victim: str) -> None:
        super().__init__(inner)
        self.victim = victim

    def local_folder(self, prefix: str) -> str | None:
        if self.victim.rpartition("/")[0] + "/" == prefix:
            self.inner.delete(self.victim)
        return super().local_folder(prefix)


N5_NODE: list[ArrayNode] = []


def mixed_tree(root: Path) -> FileStore:
    """Zarr v2, N5 (gzip, chunks in sub-folders) and Zarr v3 arrays with invalid chunks; a
    chunk that is a link inside the root (valid, read through ``get``), one out of the grid,
    a file that is no chunk."""
    store = FileStore(root)
    fill(store, "z2/", bad=BAD)
    store.set("z2/99.0", b"junk")  # out of the grid
    store.set("z2/README", b"hello")
    n5_doc = {**N5_DOC, "compression": {"type": "gzip"}}
    N5_NODE[:] = [write_array(store, "n5/", N5Format(), "attributes.json", n5_doc)]
    write_array(store, "z3/", Zarr3Format(), "zarr.json", V3_DOC)
    real = root / "z2" / "4.4"
    store.set("spare/4.4", real.read_bytes())
    real.unlink()
    real.symlink_to(root / "spare" / "4.4")
    return store


def test_processes_find_what_threads_find(
    tmp_path: Path, ready_workers: type[ReadyWorkers]
) -> None:
    store = mixed_tree(tmp_path)
    threads = Validator(store, jobs=2, processes_after=None).run()
    assert ready_workers.sent == 0
    procs = Validator(store, jobs=2, processes_after=0).run()
    assert ready_workers.sent >= ROWS * COLS  # every chunk went to a process first
    assert procs.to_json() == threads.to_json()
    assert procs.chunks == threads.chunks == ROWS * COLS + 9 + 9
    keys = [f.key for f in procs.invalid]
    n5_bad = "n5/" + N5_NODE[0].chunk_key((1, 2))
    assert keys == sorted([*(f"z2/{k}" for k in BAD), "z2/99.0", n5_bad, "z3/c/1/2"])
    assert not procs.unreadable


def test_a_chunk_gone_before_a_process_reads_it_is_unreadable_as_on_threads(
    tmp_path: Path, ready_workers: type[ReadyWorkers]
) -> None:
    reports = []
    for after in (None, 0):
        root = tmp_path / str(after)
        inner = mixed_tree(root)
        victim = "n5/" + N5_NODE[0].chunk_key((2, 1))
        store = VanishingStore(inner, victim)
        reports.append(Validator(store, jobs=2, processes_after=after).run())
    threads, procs = reports
    assert ready_workers.sent > 0
    assert [(f.key, f.message) for f in procs.unreadable] == [(victim, VANISHED)]
    assert procs.to_json() == threads.to_json()
    assert not procs.ok


def test_small_runs_and_other_stores_stay_on_threads(
    tmp_path: Path, ready_workers: type[ReadyWorkers]
) -> None:
    store = mixed_tree(tmp_path)
    report = Validator(store, jobs=2, processes_after=10_000).run()
    assert report.chunks == ROWS * COLS + 18
    assert not ready_workers.started


# -- a worker that dies, or fails --------------------------------------------------------------


@dataclass(frozen=True)
class CrashingNode(Zarr2ArrayNode):
    """Checking chunk (3, 3) ends the process (a decoder that crashed); pickled by reference,
    so a worker process imports this module to judge with it."""

    def validate_chunk(self, position: tuple[int, ...], data: bytes, *, path: str = "") -> None:
        if position == (3, 3):
            os._exit(70)
        super().validate_chunk(position, data, path=path)


@dataclass(frozen=True)
class BuggyNode(Zarr2ArrayNode):
    """Checking chunk (3, 3) raises what no verdict covers: a bug."""

    def validate_chunk(self, position: tuple[int, ...], data: bytes, *, path: str = "") -> None:
        if position == (3, 3):
            raise RuntimeError("a bug in a check")
        super().validate_chunk(position, data, path=path)


@dataclass(frozen=True)
class UnpicklableNode(Zarr2ArrayNode):
    """An array no worker process can be given."""

    def __reduce__(self) -> Any:
        raise TypeError("not to be pickled")


def run_checker(store: FileStore, node: ArrayNode) -> tuple[Report, int]:
    """The report of ROWS x COLS chunks of ``node``, and how many processes judged."""
    report = Report()
    with ChunkChecker(store, report, Progress(), 2, processes_after=0) as checker:
        for row in range(ROWS):
            for col in range(COLS):
                checker.add(ChunkJob(node, f"{row}.{col}", (row, col), -1))
        checker.finish()
    return report, checker.in_processes


def test_an_array_that_does_not_pickle_is_checked_on_threads(
    tmp_path: Path, ready_workers: type[ReadyWorkers]
) -> None:
    store = FileStore(tmp_path)
    fill(store, bad=BAD)
    report, in_processes = run_checker(store, crashing(UnpicklableNode))
    assert in_processes == 0
    assert report.chunks == ROWS * COLS
    assert [f.key for f in report.invalid] == sorted(BAD)
    plain, in_processes = run_checker(store, node_of(zarray()))
    assert in_processes == ROWS * COLS
    assert plain.to_json() == report.to_json()


def crashing(cls: type[Zarr2ArrayNode]) -> Zarr2ArrayNode:
    base = node_of(zarray())
    return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init})


def test_a_worker_that_dies_ends_the_run_naming_the_chunks_it_held(
    tmp_path: Path, ready_workers: type[ReadyWorkers]
) -> None:
    store = FileStore(tmp_path)
    fill(store)
    # every chunk is in the one batch the worker held (fewer than PROCESS_BATCH)
    held = rf"held {ROWS * COLS} chunks \(0\.0 \.\. 9\.9\)"
    with pytest.raises(WorkerDied, match=rf"exit code 70\) while it {held}: .*not checked"):
        run_checker(store, crashing(CrashingNode))
    for workers in ready_workers.started:
        assert all(gone(pid) for pid in workers.pids) or not workers.pids


def test_a_bug_in_a_worker_is_raised_in_the_parent(
    tmp_path: Path, ready_workers: type[ReadyWorkers]
) -> None:
    store = FileStore(tmp_path)
    fill(store)
    with pytest.raises(RuntimeError, match="a bug in a check") as caught:
        run_checker(store, crashing(BuggyNode))
    assert "validate_chunk" in str(caught.value.__cause__)  # the worker's traceback


def kill_each(workers: Workers[ChunkJob], jobs: list[ChunkJob]) -> None:
    """Kill every worker process at the first batch (after it was told to expect chunks)."""
    for pid in workers.pids:
        os.kill(pid, signal.SIGKILL)
    ReadyWorkers.on_submit = None


def test_a_killed_worker_ends_validate_with_an_error_and_exit_2(
    tmp_path: Path,
    ready_workers: type[ReadyWorkers],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = FileStore(tmp_path / "data")
    fill(store, bad=BAD)
    monkeypatch.setattr(commands, "Validator", partial(Validator, processes_after=0))
    ready_workers.on_submit = kill_each
    code = cli_main(["validate", str(tmp_path / "data")])
    out, err = capsys.readouterr()
    assert code == 2
    assert "worker process ended" in err
    assert "not checked" in err
    assert "valid" not in out  # no report: the run did not end
    for workers in ready_workers.started:
        assert workers.pids == []  # closed and reaped


def gone(pid: int) -> bool:
    """Has process ``pid`` exited (or is it a zombie nobody reaped yet)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


#: a parent that starts workers, gives them a batch, prints their pids, then waits
PARENT = textwrap.dedent(
    """
    import sys, time
    from n5fs.validate.procs import Workers
    workers = Workers(2)
    workers.ready(block=True)
    print(" ".join(map(str, workers.pids)), flush=True)
    {then}
    """
)


def start_parent(then: str) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(then=then)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, [int(pid) for pid in line.split()]


def test_no_worker_outlives_a_parent_killed_outright() -> None:
    proc, pids = start_parent("time.sleep(600)")
    with proc:
        assert len(pids) == 2
        assert not any(gone(pid) for pid in pids)
        proc.kill()
        proc.wait(30)
    assert wait_gone(pids), "a worker outlived its parent"


def test_an_interrupted_validate_exits_130_and_leaves_no_worker(tmp_path: Path) -> None:
    """Ctrl-C reaches the parent only (the workers have their own session): it ends the
    run as before, and takes the workers with it."""
    store = FileStore(tmp_path / "data")
    fill(store)
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        from functools import partial
        from n5fs.cli import commands
        from n5fs.cli.main import main
        from n5fs.validate import Validator, chunks
        from n5fs.validate.procs import Workers

        class Slow(Workers):
            def ready(self, *, block=False):
                return super().ready(block=True)
            def submit(self, *args):
                print(" ".join(map(str, self.pids)), flush=True)
                time.sleep(600)  # the listing stops here: the interrupt finds it mid-run

        # Ctrl-C as a terminal sends it, even where this suite was started with SIGINT
        # ignored (a background job of a shell), which the child would inherit
        signal.signal(signal.SIGINT, signal.default_int_handler)
        chunks.Workers = Slow
        commands.Validator = partial(Validator, processes_after=0)
        sys.exit(main(["validate", {str(tmp_path / "data")!r}]))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    with proc:
        assert proc.stdout is not None
        pids = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()
    assert wait_gone(pids, 10)
