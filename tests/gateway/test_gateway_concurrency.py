"""The gateway under many threads, without FUSE: writers, renamers, listers, metadata changers
and cache droppers on one folder, over the memory, file and S3 (moto server) stores.

Every assertion here holds for *any* interleaving of a correct gateway (docs/semantics.md,
"Consistency and concurrency"); none hopes for a lucky schedule. What makes the races show up
on a broken gateway is not luck either:

- the store answers a little late (:class:`Naps`, seeded): a LIST or a probe is fetched, and
  the gateway sees it after other threads have committed into the folder; a ``set`` or a
  ``rename`` starts a little after the validation that allowed it;
- time moves one tick per reading of the gateway's clock (:class:`TickingClock`), so listings
  and detection results expire after a fixed number of cache reads, whatever the machine's speed;
- the interpreter switches threads every 100 µs instead of every 5 ms.

Each test does a fixed number of operations (fewer against S3, where moto answers in
milliseconds), so its running time is bounded and its count of operations is the same every run.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from n5fs.errors import KeyNotFound, Rejected
from n5fs.formats.consolidation import consolidated_metadata
from n5fs.gateway import EntryKind, Gateway, GatewayConfig
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.validate import validate_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from n5fs.kvstore.base import KvStore

# every lock checked against the gateway's lock order (tests/conftest.py)
pytestmark = [pytest.mark.timeout(300), pytest.mark.debug_locks]

# -- harness -----------------------------------------------------------------------------------


@dataclass
class Backend:
    kind: str
    store: KvStore
    #: 1 for local stores; a fraction for S3, where every request is an HTTP round trip
    scale: float

    def n(self, count: int, least: int = 2) -> int:
        """``count`` operations, scaled down for slow stores (never below ``least``)."""
        return max(least, round(count * self.scale))


@pytest.fixture(
    params=["memory", "file", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        yield Backend("memory", MemoryStore(), 1.0)
        return
    if request.param == "file":
        yield Backend("file", FileStore(tmp_path / "store"), 1.0)
        return
    from n5fs.kvstore import open_store

    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    store = open_store(
        {"driver": "s3", "bucket": bucket, "path": "gw/", "endpoint": server.endpoint}
    )
    yield Backend("s3", store, 0.15)
    store.close()


@pytest.fixture(autouse=True)
def _fine_grained_thread_switching() -> Iterator[None]:
    """Switch threads every 100 µs (default 5 ms): more interleavings per operation."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


class TickingClock:
    """Time that moves ``tick`` seconds each time it is read: a cache with a TTL of ``k * tick``
    expires after ``k`` readings of the clock, however fast or slow the machine is."""

    def __init__(self, tick: float = 0.001) -> None:
        self.tick = tick
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.tick
            return self.now


class Naps:
    """Widen the gateway's race windows by making the store a little slow where it matters.

    The answers of ``list``, ``get``, ``get_many`` and ``stat`` reach the gateway up to ``most``
    seconds after the store produced them (a listing is stale by the time it is cached, unless
    the gateway knows a commit happened meanwhile); ``set`` and ``rename`` start up to ``most``
    seconds late (after the validation that allowed them). The store object is patched in place
    so every other method, and its type, stay as they are. Seeded: the same naps each run.
    """

    LATE_ANSWERS = ("list", "get", "get_many", "stat")
    LATE_STARTS = ("set", "rename")

    def __init__(self, store: KvStore, seed: int, most: float = 0.001) -> None:
        self.store = store
        self.most = most
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._inside = threading.local()
        for name in self.LATE_ANSWERS + self.LATE_STARTS:
            setattr(
                store, name, self._wrap(getattr(store, name), late_start=name in self.LATE_STARTS)
            )

    def nap(self) -> None:
        with self._lock:
            seconds = self._rng.random() * self.most
        time.sleep(seconds)

    def _wrap(self, call: Callable[..., Any], *, late_start: bool) -> Callable[..., Any]:
        def napping(*args: Any, **kwargs: Any) -> Any:
            outermost = not getattr(self._inside, "depth", 0)  # get_many may call get
            self._inside.depth = getattr(self._inside, "depth", 0) + 1
            try:
                if outermost and late_start:
                    self.nap()
                out = call(*args, **kwargs)
            finally:
                self._inside.depth -= 1
            if outermost and not late_start:
                self.nap()
            return out

        return napping

    def remove(self) -> None:
        for name in self.LATE_ANSWERS + self.LATE_STARTS:
            vars(self.store).pop(name, None)


class Hold:
    """Make one race deterministic: the interleaving a broken gateway allows, forced; a correct
    gateway only waits ``most`` seconds for nothing.

    Until the store has stored ``trigger`` (a metadata key, by anyone), ``set`` of a key that
    ``held_sets`` accepts starts late (it was validated before the metadata changed, and lands
    after), and ``get_many`` answers that ``held_probes`` accepts arrive late (a folder's
    detection probe, taken before the metadata existed, reaches the detector after it was
    stored), except in the thread ``exempt`` (the one committing the metadata). Holding ends
    ``most`` seconds after the first held call: a correct gateway that orders the two commits
    (the held one first) merely pays that once.
    """

    def __init__(
        self,
        store: KvStore,
        trigger: str,
        *,
        held_sets: Callable[[str], bool] = lambda key: False,
        held_probes: Callable[[list[str]], bool] = lambda keys: False,
        most: float = 0.1,
    ) -> None:
        self.store = store
        self.trigger = trigger
        self.stored = threading.Event()
        self.exempt: threading.Thread | None = None
        self.held = 0
        self._deadline: float | None = None  # holding ends then, stored or not
        self._lock = threading.Lock()
        self._saved = {name: vars(store).get(name) for name in ("set", "get_many")}
        inner_set, inner_get_many = store.set, store.get_many

        def set_(key: str, value: bytes, *args: Any, **kwargs: Any) -> Any:
            if held_sets(key):
                self._wait(most)
            out = inner_set(key, value, *args, **kwargs)
            if key == trigger:
                self.stored.set()
            return out

        def get_many(keys: Any, *args: Any, **kwargs: Any) -> Any:
            keys = list(keys)
            out = inner_get_many(keys, *args, **kwargs)
            if held_probes(keys) and threading.current_thread() is not self.exempt:
                self._wait(most)
            return out

        store.set = set_  # type: ignore[method-assign]
        store.get_many = get_many  # type: ignore[method-assign]

    def _wait(self, most: float) -> None:
        with self._lock:
            if self._deadline is None:
                self._deadline = time.monotonic() + most
            left = self._deadline - time.monotonic()
            if left <= 0 or self.stored.is_set():
                return
            self.held += 1
        self.stored.wait(left)

    def remove(self) -> None:
        for name, saved in self._saved.items():
            if saved is None:
                vars(self.store).pop(name, None)
            else:
                setattr(self.store, name, saved)


def run_threads(
    workers: list[Callable[[], None]],
    watchers: list[Callable[[threading.Event], None]] | None = None,
    *,
    timeout: float = 240,
) -> None:
    """Run ``workers`` (a fixed amount of work each) and ``watchers`` (loop until told to stop)
    at once; stop the watchers when the workers are done; fail with every thread's exception."""
    watchers = watchers or []
    stop = threading.Event()
    start = threading.Barrier(len(workers) + len(watchers))

    def started(job: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            start.wait(timeout=60)
            job(*args)

        return run

    with ThreadPoolExecutor(len(workers) + len(watchers)) as pool:
        watching = [pool.submit(started(w, stop)) for w in watchers]
        working = [pool.submit(started(w)) for w in workers]
        wait(working, timeout=timeout)
        stop.set()
        wait(watching, timeout=timeout)
    errors = [
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        for f in working + watching
        if (exc := f.exception()) is not None
    ]
    assert not errors, f"{len(errors)} thread(s) failed; the first:\n{errors[0]}"


def write_partial_then_rename(gw: Gateway, folder: str, name: str, data: bytes) -> str:
    """What zarr-python's LocalStore and dask do: ``name.<uuid>.partial``, then os.replace."""
    tmp = f"{folder}/{name}.{uuid.uuid4().hex}.partial"
    fh = gw.create(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        gw.write(fh, data, 0)
        gw.flush(fh)
    finally:
        gw.release(fh)
    gw.rename(tmp, f"{folder}/{name}")
    return tmp


def payload(name: str, version: int, rng: random.Random) -> bytes:
    """Content that says whose it is, of a size that differs between versions."""
    head = f"{name}#{version}|".encode()
    return (head * 64)[: 40 + rng.randrange(200)]


def read_once(gw: Gateway, path: str) -> bytes:
    """The whole (small) file in one read: one read sees one version (docs/semantics.md: a
    later read on the same handle may see a newer one, since a store has no inodes)."""
    fh = gw.open(path, os.O_RDONLY)
    try:
        return gw.read(fh, 1 << 20, 0)
    finally:
        gw.release(fh)


def assert_valid(store: KvStore, prefix: str = "") -> None:
    """The strict-mode invariant: every metadata key valid, every chunk decodes validly."""
    report = validate_store(store, prefix, jobs=4)
    assert report.ok, [f"{f.key}: {f.rule}: {f.message}" for f in report.invalid]


# -- a, d: temp files renamed into one folder, listers, staters, cache droppers ------------------


class Model:
    """What the writers have committed: name -> content, and every content each name may show."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.content: dict[str, bytes] = {}
        self.names: list[str] = []
        self.versions: dict[str, set[bytes]] = {}

    def about_to_write(self, name: str, data: bytes, *, in_place: bool = False) -> None:
        """``in_place``: written by create(O_TRUNC) + write at the name itself, as cp does, so
        a reader may also see it empty for a moment (the writer's staged file, truncated)."""
        with self.lock:
            self.versions.setdefault(name, set()).add(data)
            if in_place:
                self.versions[name].add(b"")

    def committed(self, name: str, data: bytes) -> None:
        with self.lock:
            if name not in self.content:
                self.names.append(name)
            self.content[name] = data

    def snapshot(self) -> set[str]:
        with self.lock:
            return set(self.content)

    def pick(self, rng: random.Random) -> str | None:
        with self.lock:
            return rng.choice(self.names) if self.names else None


def _writers_and_watchers(
    backend: Backend,
    gw: Gateway,
    *,
    writers: int,
    ops: int,
    direct_every: int = 0,
    drop_caches: bool = False,
) -> None:
    """``writers`` threads each commit ``ops`` files into /d (a fifth of them over one of their
    earlier names); listers, staters/readers (and a cache dropper) run until they are done."""
    gw.write_file("/d/README", b"a folder many threads write into\n")
    pause = 0.0005 / backend.scale  # between a watcher's calls: watchers must not starve writers
    model = Model()
    model.about_to_write("README", b"a folder many threads write into\n")
    model.committed("README", b"a folder many threads write into\n")

    def writer(w: int) -> None:
        rng = random.Random(w)
        mine: list[str] = []
        for i in range(ops):
            again = bool(mine) and rng.random() < 0.2
            name = rng.choice(mine) if again else f"x_{w}_{i}"
            data = payload(name, i, rng)
            in_place = bool(direct_every) and i % direct_every == 0
            model.about_to_write(name, data, in_place=in_place)
            if in_place:
                gw.write_file(f"/d/{name}", data)  # cp: create + write + close at the name
                tmp = None
            else:
                tmp = write_partial_then_rename(gw, "/d", name, data)
            model.committed(name, data)
            if not again:
                mine.append(name)
            # the writer's own commit is visible at once, by stat, read and readdir
            attr = gw.stat(f"/d/{name}")
            assert (attr.kind, attr.size) == (EntryKind.FILE, len(data)), (name, attr)
            got = read_once(gw, f"/d/{name}")
            assert got == data, f"/d/{name} read back {got[:30]!r}, wrote {data[:30]!r}"
            listed = dict(gw.readdir("/d"))
            assert name in listed, f"/d/{name} not listed right after its commit"
            assert listed[name].size == len(data), (name, listed[name])
            if tmp is not None:
                assert gw.lookup(tmp) is None, f"{tmp} still there after its rename"
                assert tmp.rsplit("/", 1)[1] not in listed, f"{tmp} listed after its rename"

    def lister(stop: threading.Event) -> None:
        for _ in range(5000):
            if stop.wait(pause):
                return
            before = model.snapshot()
            listed = {name for name, _ in gw.readdir("/d")}
            missing = before - listed
            assert not missing, f"committed but not listed: {sorted(missing)[:5]}"

    def stater(stop: threading.Event, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(20000):
            if stop.wait(pause / 2):
                return
            name = model.pick(rng)
            if name is None:
                time.sleep(0.001)
                continue
            attr = gw.stat(f"/d/{name}")  # KeyNotFound here is the spurious ENOENT
            assert attr.kind is EntryKind.FILE, (name, attr)
            if rng.random() < 0.3:
                got = read_once(gw, f"/d/{name}")
                assert got in model.versions[name], f"/d/{name} read {got[:30]!r}: never written"

    def dropper(stop: threading.Event) -> None:
        for _ in range(100000):
            if stop.wait(4 * pause):
                return
            gw.drop_caches()

    watchers: list[Callable[[threading.Event], None]] = [lister, lister]
    watchers += [lambda stop, s=s: stater(stop, 100 + s) for s in range(2)]
    if drop_caches:
        watchers.append(dropper)
    run_threads([lambda w=w: writer(w) for w in range(writers)], watchers)

    expected = model.snapshot()
    listed = {name for name, _ in gw.readdir("/d")}
    assert listed == expected, (sorted(listed - expected)[:5], sorted(expected - listed)[:5])
    stored = {key.removeprefix("d/") for key in gw.walk_keys() if key.startswith("d/")}
    assert stored == expected, (sorted(stored - expected)[:5], sorted(expected - stored)[:5])
    for name, data in model.content.items():
        assert backend.store.get(f"d/{name}") == data, name


def test_partial_files_renamed_into_one_folder(backend: Backend) -> None:
    """(a) Six writers do what zarr-python and dask do, while others list and stat the folder:
    no ENOENT for a name whose rename returned, every commit visible at once, nothing lost."""
    Naps(backend.store, seed=1)
    gw = Gateway(backend.store, GatewayConfig(ttl=0.05), clock=TickingClock(0.001))
    _writers_and_watchers(backend, gw, writers=6, ops=backend.n(60, 10))


def test_drop_caches_while_writing_and_listing(backend: Backend) -> None:
    """(d) The same with a tiny TTL, some plain creates, and a thread dropping every cache (what
    SIGHUP does) all the time: nothing the writers committed goes missing, no errors."""
    Naps(backend.store, seed=4)
    gw = Gateway(backend.store, GatewayConfig(ttl=0.005), clock=TickingClock(0.001))
    _writers_and_watchers(  # on S3 every dropped cache is LISTs again: fewer writers there
        backend, gw, writers=backend.n(6, 3), ops=backend.n(30, 5), direct_every=3, drop_caches=True
    )


def test_readdir_while_commits_patch_the_cached_listing(backend: Backend) -> None:
    """A long TTL keeps the folder's listing cached, so every commit patches it while listers
    go through it: a lister never fails ("dictionary changed size during iteration" was EIO)
    and always shows what was committed before it began."""
    store = backend.store
    existing = backend.n(1000, 100)
    if backend.kind == "s3":
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: store.set(f"big/old_{i}", b"o"), range(existing)))
    else:
        for i in range(existing):
            store.set(f"big/old_{i}", b"o")
    gw = Gateway(store, GatewayConfig(ttl=3600))
    model = Model()
    for i in range(existing):
        model.committed(f"old_{i}", b"o")

    def writer(w: int) -> None:
        for i in range(backend.n(100, 10)):
            name = f"new_{w}_{i}"
            gw.write_file(f"/big/{name}", b"n")
            model.committed(name, b"n")

    def lister(stop: threading.Event) -> None:
        for _ in range(5000):
            if stop.wait(0.0002):
                return
            before = model.snapshot()
            listed = {name for name, _ in gw.readdir("/big")}
            assert before <= listed, f"committed but not listed: {sorted(before - listed)[:5]}"

    run_threads([lambda w=w: writer(w) for w in range(4)], [lister] * 3)
    assert {name for name, _ in gw.readdir("/big")} == model.snapshot()


# -- b: chunk commits against dtype changes of their array --------------------------------------

ZARRAY = {
    "zarr_format": 2,
    "shape": [64, 64],
    "chunks": [8, 8],
    "dtype": "<u2",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}


def zarray(dtype: str = "<u2", **changes: Any) -> bytes:
    return json.dumps({**ZARRAY, "dtype": dtype, **changes}).encode()


def test_chunk_commits_and_dtype_changes_are_ordered(backend: Backend) -> None:
    """(b) Writers commit valid ``<u2`` chunks of a fresh array while another thread keeps
    trying to switch its dtype between ``<u2`` and ``<u4``, and another commits chunks of the
    wrong size. A dtype change may succeed only while no chunk is stored; one that starts after
    a chunk commit returned must be refused; bad chunks are always refused; and afterwards every
    stored chunk decodes under the array's metadata (the strict-mode invariant).

    Forced in each round: the first chunk commits reach the store only once the dtype change
    has (or after 0.1 s), so a gateway that lets a chunk validated under ``<u2`` land after a
    change to ``<u4`` passed its "no chunks exist" check fails every time."""
    naps = Naps(backend.store, seed=2)
    gw = Gateway(backend.store, GatewayConfig(ttl=0.05), clock=TickingClock(0.001))
    for r in range(backend.n(6, 3)):
        _dtype_round(backend, gw, f"/arr{r}")
    naps.remove()
    assert_valid(backend.store)


POSITIONS = [(i, j) for i in range(8) for j in range(8)]


def _dtype_round(backend: Backend, gw: Gateway, folder: str) -> None:
    gw.write_file(f"{folder}/.zarray", zarray("<u2"))
    key_prefix = folder[1:] + "/"
    hold = Hold(
        backend.store,
        f"{key_prefix}.zarray",
        held_sets=lambda key: key.startswith(key_prefix) and key[len(key_prefix) :][0].isdigit(),
    )
    chunk_returned = threading.Event()
    lock = threading.Lock()
    stored: dict[str, bytes] = {}

    def writer(w: int) -> None:
        rng = random.Random(w)
        for i, j in POSITIONS[w::3][: backend.n(12, 3)]:
            data = rng.randbytes(128)  # 8 x 8 x <u2, no compressor
            try:
                gw.write_file(f"{folder}/{i}.{j}", data)
            except Rejected:
                continue  # the dtype was <u4 at the time: 128 bytes are the wrong size
            chunk_returned.set()
            with lock:
                stored[f"{key_prefix}{i}.{j}"] = data

    def changer() -> None:
        time.sleep(0.005 / backend.scale)  # the first chunks are judged and on their way
        current = "<u2"
        for _ in range(backend.n(10, 4)):
            after_a_chunk = chunk_returned.is_set()
            target = "<u4" if current == "<u2" else "<u2"
            try:
                gw.write_file(f"{folder}/.zarray", zarray(target))
            except Rejected:
                continue
            finally:
                time.sleep(0.0005)
            assert not after_a_chunk, (
                f"{folder}/.zarray: dtype changed to {target} after a chunk commit returned"
            )
            current = target

    def vandal() -> None:
        rng = random.Random(99)
        for _ in range(backend.n(8, 3)):
            # never a writer's key: handles of one name share its staging, so a writer's
            # 128 bytes landing between the vandal's write and flush would be committed
            i, j = rng.choice(POSITIONS[3 * backend.n(12, 3) :])
            try:
                gw.write_file(f"{folder}/{i}.{j}", rng.randbytes(100))
            except Rejected:
                continue
            raise AssertionError(f"{folder}/{i}.{j}: a 100-byte chunk was accepted")

    try:
        run_threads([lambda w=w: writer(w) for w in range(3)] + [changer, vandal])
    finally:
        hold.remove()
    for key, data in stored.items():
        assert backend.store.get(key) == data, f"{key}: a committed chunk changed"
    assert gw.read_file(f"{folder}/.zarray") == backend.store.get(f"{key_prefix}.zarray")
    assert_valid(backend.store, key_prefix)


def test_new_array_metadata_against_a_racing_bad_chunk(backend: Backend) -> None:
    """A ``.zarray`` commit into a plain folder races a bad chunk (13 bytes) at ``0.0``.
    Whatever the order, the store validates clean afterwards: the bad chunk is refused once
    the folder is an array, and if it got in first, as a plain file, the metadata that would
    make it a chunk is refused. Two interleavings are forced, in alternate rounds:

    - even rounds: a lister's detection probe of the folder, taken before ``.zarray`` existed,
      reaches the detector after the metadata commit (a detection cache that stores it calls
      the folder plain, and lets the bad chunk in unvalidated); the bad chunk comes after the
      metadata commit returned, so it must be refused;
    - odd rounds: the bad chunk, judged while the folder was plain, reaches the store only
      after the ``.zarray`` commit passed its "which chunks exist" check.
    """
    naps = Naps(backend.store, seed=3)
    gw = Gateway(backend.store, GatewayConfig(ttl=0.5), clock=TickingClock(0.001))
    for r in range(backend.n(8, 4)):
        _new_array_round(backend, gw, f"/new{r}", chunk_first=r % 2 == 1)
    naps.remove()
    assert_valid(backend.store)


def _new_array_round(backend: Backend, gw: Gateway, folder: str, *, chunk_first: bool) -> None:
    gw.write_file(f"{folder}/README", b"soon an array\n")
    gw.drop_caches()  # the folder's next detection loads anew (and in even rounds, is held)
    key_prefix = folder[1:] + "/"
    hold = Hold(
        backend.store,
        f"{key_prefix}.zarray",
        held_sets=lambda key: chunk_first and key == f"{key_prefix}0.0",
        held_probes=lambda keys: not chunk_first and f"{key_prefix}.zarray" in keys,
    )
    metadata_in = threading.Event()  # the .zarray commit returned successfully
    metadata_done = threading.Event()  # ... or was refused
    chunk_tried = threading.Event()

    def metadata() -> None:
        hold.exempt = threading.current_thread()
        if chunk_first:
            chunk_tried.wait(1)
        # the bad chunk is judged and on its way to the store; or the listers' probes are out
        time.sleep(0.005 / backend.scale)
        try:
            gw.write_file(f"{folder}/.zarray", zarray("<u2"))
        except Rejected:
            return  # the bad "chunk" was stored first (a plain file then): rightly refused
        else:
            metadata_in.set()
        finally:
            metadata_done.set()

    def bad_chunk(attempts: int) -> None:
        for attempt in range(attempts):
            if chunk_first and attempt == 0:
                chunk_tried.set()
            else:
                metadata_done.wait(5)
            committed = metadata_in.is_set()
            try:
                gw.write_file(f"{folder}/0.0", b"not 128 bytes")
            except Rejected:
                continue
            assert not committed, (
                f"{folder}/0.0 stored unvalidated after {folder}/.zarray was committed"
            )

    def looker(stop: threading.Event) -> None:
        for _ in range(2000):
            if stop.wait(0.0005):
                return
            gw.readdir(folder)  # detects the folder (for its hdmf links), and caches that
            gw.lookup(f"{folder}/1.1")

    try:
        run_threads([metadata, lambda: bad_chunk(4)], [looker, looker])
    finally:
        hold.remove()
    assert_valid(backend.store, key_prefix)


# -- c: consolidated metadata kept true under concurrent metadata commits -----------------------


def test_zmetadata_lists_every_array_created_concurrently(backend: Backend) -> None:
    """(c) Zarr v2: threads create arrays (``.zarray`` + ``.zattrs``) under a root that holds
    ``.zmetadata``, and rewrite attributes: ``.zmetadata`` ends up listing every one of them
    with the last content written, and the gateway's view of it is the store's."""
    store = backend.store
    naps = Naps(store, seed=5)
    gw = Gateway(store, GatewayConfig(ttl=0.05), clock=TickingClock(0.001))
    gw.write_file("/.zgroup", b'{"zarr_format": 2}')
    zmeta = {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}
    gw.write_file("/.zmetadata", json.dumps(zmeta).encode())
    threads, arrays = 8, backend.n(4, 2)
    expected: dict[str, Any] = {".zgroup": {"zarr_format": 2}}
    lock = threading.Lock()

    def creator(t: int) -> None:
        for k in range(arrays):
            doc = json.loads(zarray("<u2", shape=[8 * (t + 1), 8 * (k + 1)]))
            attrs = {"thread": t, "array": k}
            gw.write_file(f"/a{t}_{k}/.zarray", json.dumps(doc).encode())
            gw.write_file(f"/a{t}_{k}/.zattrs", json.dumps(attrs).encode())
            with lock:
                expected[f"a{t}_{k}/.zarray"] = doc
                expected[f"a{t}_{k}/.zattrs"] = attrs
        final = {"thread": t, "final": True}
        gw.write_file(f"/a{t}_0/.zattrs", json.dumps(final).encode())
        with lock:
            expected[f"a{t}_0/.zattrs"] = final

    run_threads([lambda t=t: creator(t) for t in range(threads)])
    naps.remove()
    raw = store.get(".zmetadata")
    assert raw is not None
    got = json.loads(raw)["metadata"]
    missing = sorted(k for k in expected if k not in got)
    assert not missing, f".zmetadata lost {len(missing)} entries: {missing[:6]}"
    assert got == expected
    assert gw.read_file("/.zmetadata") == raw
    assert_valid(store)


def zarr3_array(t: int, k: int) -> dict[str, Any]:
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [16, 8 * (k + 1)],
        "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "attributes": {"thread": t, "array": k},
    }


def test_v3_inline_consolidated_lists_every_array_created_concurrently(backend: Backend) -> None:
    """(c) Zarr v3: the same with inline ``consolidated_metadata`` in the root ``zarr.json``."""
    store = backend.store
    naps = Naps(store, seed=6)
    gw = Gateway(store, GatewayConfig(ttl=0.05), clock=TickingClock(0.001))
    root = {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {},
        "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}},
    }
    gw.write_file("/zarr.json", json.dumps(root).encode())
    threads, arrays = 8, backend.n(4, 2)
    children: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def creator(t: int) -> None:
        for k in range(arrays):
            doc = zarr3_array(t, k)
            gw.write_file(f"/a{t}_{k}/zarr.json", json.dumps(doc).encode())
            with lock:
                children[f"a{t}_{k}"] = doc
        doc = {**zarr3_array(t, 0), "attributes": {"thread": t, "final": True}}
        gw.write_file(f"/a{t}_0/zarr.json", json.dumps(doc).encode())
        with lock:
            children[f"a{t}_0"] = doc

    run_threads([lambda t=t: creator(t) for t in range(threads)])
    naps.remove()
    raw = store.get("zarr.json")
    assert raw is not None
    got = json.loads(raw)["consolidated_metadata"]["metadata"]
    missing = sorted(k for k in children if k not in got)
    assert not missing, f"consolidated_metadata lost {len(missing)} arrays: {missing[:6]}"
    assert got == consolidated_metadata(children)["metadata"]
    assert gw.read_file("/zarr.json") == raw
    assert_valid(store)


# -- a check of the harness itself ---------------------------------------------------------------


def test_run_threads_reports_a_failing_thread() -> None:
    def fails() -> None:
        raise KeyNotFound("/d/x")

    with pytest.raises(AssertionError, match="KeyNotFound"):
        run_threads([fails, lambda: None], [lambda stop: stop.wait(5)])
