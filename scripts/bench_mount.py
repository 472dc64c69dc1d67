"""Mount benchmark (issue 5): n5fs against direct access, a bare mfusepy passthrough and
fsspec's FUSE, on the file store and on S3 (a moto server on 127.0.0.1, port 0), in one run.

Every figure is measured in this run and printed as one table of ratios with the issue's
targets beside them (compared, never asserted). Columns: ``direct`` (the backing directory;
boto3 or TensorStore's s3 driver on S3), ``pt`` and ``pt+kc`` (a minimal multithreaded
mfusepy passthrough on libfuse 3, written below, without and with ``kernel_cache``; same
attr/entry/negative timeouts as n5fs), ``n5fs`` (``-o ro``: kernel_cache), ``n5fs-rw`` and
``fsspec`` (``fsspec.fuse.run`` over its local or s3fs filesystem; "not installed" when
fsspec, fusepy or s3fs cannot be imported by ``--peer-python``). Cold = a fresh mount after
``echo 3 > /proc/sys/vm/drop_caches`` (or, without root, ``posix_fadvise(DONTNEED)`` on every
backing file); warm = best of ``--rounds`` repeats on the same mount. Each measured call runs
under a watchdog that kills the mount daemons when it overruns, so a hung mount fails the call
with ENOTCONN instead of hanging the script; every mount is unmounted at the end, and the
generated data (a temp dir) removed.

    python scripts/bench_mount.py                 # full size (~1.6 GiB of data, ~20 min)
    python scripts/bench_mount.py --quick         # small smoke run
    python scripts/bench_mount.py --only read --skip-s3
    python scripts/bench_mount.py --peer-python /path/to/venv/bin/python   # fsspec + s3fs there
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from n5fs.fuse_front.mounts import MountFailed, mount_entry, unmount
from n5fs.fuse_front.options import parse_size
from n5fs.testing.moto_server import moto_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

MiB = 1 << 20
BLOCK = 128
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
AWS_ENV = {**AWS, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
TTL = "5"  # n5fs's default --cache-ttl, given to the passthrough's kernel timeouts too
GROUPS = ("read", "list", "stat", "tensorstore", "write", "rss")
FSSPEC_LAUNCHER = """
import sys
import fsspec, fsspec.fuse
kind, root, mountpoint, endpoint = sys.argv[1:5]
if kind == "s3":
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing",
                           client_kwargs={"region_name": "us-east-1"})
else:
    fs = fsspec.filesystem("file")
fsspec.fuse.run(fs, root, mountpoint, foreground=True)
"""


class BenchError(RuntimeError):
    """A measurement that could not be taken (mount failed, watchdog fired, wrong answer)."""


# == data ==========================================================================================


@dataclass(frozen=True)
class Data:
    """The datasets under one backing root, with what a correct read of each must see."""

    root: Path
    raw: list[str]  # relative paths of the raw N5 dataset, in order
    gzip: list[str]
    raw_bytes: int
    gzip_bytes: int
    zarr_entries: int  # lines `find zarr` prints
    sparse_keys: list[str]  # every chunk key of the sparse array's grid
    sparse_present: int
    sparse_sum: int


def n5_shape(gib: float) -> tuple[int, int, int]:
    blocks = max(1, round(gib * 2**30 / (2 * BLOCK**3)))
    side = 8 if blocks >= 64 else 2 if blocks >= 4 else 1
    return (-(-blocks // side**2) * BLOCK, side * BLOCK, side * BLOCK)


def write_n5_pair(root: Path, gib: float) -> None:
    """The same uint16 volume (smooth ramp + 8 bits of noise: gzip keeps ~60 %) as raw and
    gzip N5, block by block so memory stays bounded."""
    import numpy as np
    import tensorstore as ts

    shape = n5_shape(gib)
    meta = {"dimensions": list(shape), "blockSize": [BLOCK] * 3, "dataType": "uint16"}
    arrays = [
        ts.open(
            {
                "driver": "n5",
                "kvstore": {"driver": "file", "path": str(root / name)},
                "metadata": {**meta, "compression": {"type": kind}},
            },
            create=True,
        ).result()
        for name, kind in (("n5raw", "raw"), ("n5gzip", "gzip"))
    ]
    rng = np.random.default_rng(5)
    ramp = (np.arange(BLOCK, dtype=np.uint16) * 16)[:, None, None]
    pending: list[Any] = []
    for z in range(0, shape[0], BLOCK):
        for y in range(0, shape[1], BLOCK):
            for x in range(0, shape[2], BLOCK):
                block = rng.integers(0, 256, (BLOCK,) * 3, dtype=np.uint16) + ramp
                where = np.s_[z : z + BLOCK, y : y + BLOCK, x : x + BLOCK]
                pending += [a[where].write(block) for a in arrays]
                while len(pending) > 8:
                    pending.pop(0).result()
    for future in pending:
        future.result()


def write_zarr(root: Path, chunks: int) -> None:
    import numpy as np
    import tensorstore as ts

    cols = max(1, int(chunks**0.5))
    rows = -(-chunks // cols)
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(root / "zarr")},
        "metadata": {
            "shape": [rows * 16, cols * 16],
            "chunks": [16, 16],
            "dtype": "<u2",
            "compressor": {"id": "zstd", "level": 1},
            "fill_value": 0,
        },
    }
    array = ts.open(spec, create=True).result()
    values = np.random.default_rng(1).integers(1, 999, (rows * 16, cols * 16), dtype=np.uint16)
    array.write(values).result()


def write_sparse(root: Path, side: int) -> tuple[list[str], int, int]:
    """A side x side grid of 64x64 chunks of which 10 % are stored: the stat storm's keys."""
    import numpy as np
    import tensorstore as ts

    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(root / "sparse")},
        "metadata": {
            "shape": [side * 64, side * 64],
            "chunks": [64, 64],
            "dtype": "<u2",
            "compressor": {"id": "zstd", "level": 1},
            "fill_value": 0,
        },
    }
    array = ts.open(spec, create=True).result()
    rng = np.random.default_rng(2)
    present = max(1, side * side // 10)
    total = 0
    for cell in rng.choice(side * side, present, replace=False):
        i, j = divmod(int(cell), side)
        block = rng.integers(1, 1000, (64, 64), dtype=np.uint16)
        total += int(block.sum())
        array[i * 64 : (i + 1) * 64, j * 64 : (j + 1) * 64].write(block).result()
    return [f"sparse/{i}.{j}" for i in range(side) for j in range(side)], present, total


def make_data(root: Path, gib: float, zarr_chunks: int, sparse_side: int) -> Data:
    start = time.perf_counter()
    write_n5_pair(root, gib)
    write_zarr(root, zarr_chunks)
    keys, present, total = write_sparse(root, sparse_side)

    def files(name: str) -> list[str]:
        return sorted(
            p.relative_to(root).as_posix() for p in (root / name).rglob("*") if p.is_file()
        )

    raw, gz = files("n5raw"), files("n5gzip")
    data = Data(
        root,
        raw,
        gz,
        sum((root / f).stat().st_size for f in raw),
        sum((root / f).stat().st_size for f in gz),
        sum(1 for _ in (root / "zarr").rglob("*")) + 1,
        keys,
        present,
        total,
    )
    print(
        f"data in {root}: N5 raw {data.raw_bytes / MiB:.0f} MiB ({len(raw)} files), gzip "
        f"{data.gzip_bytes / MiB:.0f} MiB; Zarr v2 {data.zarr_entries - 2} chunks; sparse "
        f"{present}/{len(keys)} chunks ({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    return data


def drop_caches(data: Data) -> str:
    """Empty the page cache (FUSE mounts' too); without root, evict the backing files only."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        for path in data.root.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return "posix_fadvise(DONTNEED) on the backing files (drop_caches refused: not root)"
    return "echo 3 > /proc/sys/vm/drop_caches"


# == S3 ============================================================================================


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(max_pool_connections=32),
        aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"],
    )


def upload(data: Data, client: Any, bucket: str) -> None:
    client.create_bucket(Bucket=bucket)
    files = [p for p in data.root.rglob("*") if p.is_file()]
    start = time.perf_counter()

    def put(path: Path) -> None:
        key = path.relative_to(data.root).as_posix()
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        for _ in pool.map(put, files):
            pass
    print(f"uploaded {len(files)} objects to moto in {time.perf_counter() - start:.0f} s")


# == mounts ========================================================================================


@dataclass
class Mount:
    path: Path
    proc: subprocess.Popen[bytes] | None = None  # None: direct access, nothing mounted
    log: Path | None = None


class Mounts:
    """Mount daemons in child processes, a watchdog per measured call, and cleanup."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.live: list[Mount] = []
        self.fired = False

    def start(self, name: str, argv: Callable[[Path], list[str]]) -> Mount:
        mp = self.tmp / "mnt" / f"{name}-{uuid.uuid4().hex[:6]}"
        mp.mkdir(parents=True)
        log = self.tmp / "logs" / f"{mp.name}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("wb") as err:
            proc = subprocess.Popen(argv(mp), env=self.env, stdout=err, stderr=err)
        mount = Mount(mp, proc, log)
        self.live.append(mount)
        deadline = time.monotonic() + 90
        while mount_entry(str(mp)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop(mount)
                raise BenchError(f"{name} did not mount: {log.read_text()[-600:]}")
            time.sleep(0.02)
        with self.guard(f"first stat of {name}", 60):
            os.stat(mp)
        return mount

    def stop(self, mount: Mount) -> None:
        if mount.proc is None:
            return
        if mount_entry(str(mount.path)) is not None:
            try:
                unmount(str(mount.path))
            except MountFailed:
                unmount(str(mount.path), lazy=True)
        try:
            mount.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            mount.proc.kill()
            mount.proc.wait()
        with contextlib.suppress(OSError):
            mount.path.rmdir()
        self.live.remove(mount)

    @contextlib.contextmanager
    def guard(self, what: str, seconds: float) -> Iterator[None]:
        """Kill every mount daemon if ``what`` overruns: its calls then fail with ENOTCONN."""
        self.fired = False

        def fire() -> None:
            self.fired = True
            print(f"  watchdog: {what} overran {seconds:g} s; killing the mount daemons")
            self.kill_all()

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def kill_all(self) -> None:
        for mount in self.live:
            if mount.proc is not None and mount.proc.poll() is None:
                mount.proc.send_signal(signal.SIGKILL)

    def cleanup(self) -> None:
        self.kill_all()
        for mount in list(self.live):
            if mount_entry(str(mount.path)) is not None:
                with contextlib.suppress(MountFailed):
                    unmount(str(mount.path), lazy=True)
            if mount.proc is not None:
                mount.proc.wait()
        self.live.clear()


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(value.split()[0])
    return out


@dataclass(frozen=True)
class Variant:
    """One column: how to mount the store, or None for direct access."""

    name: str
    argv: Callable[[Path], list[str]] | None = None
    missing: str | None = None  # why this peer cannot run here


def n5fs_variant(name: str, source: str, *opts: str) -> Variant:
    return Variant(
        name, lambda mp: [sys.executable, "-m", "n5fs", "mount", source, str(mp), "-f", *opts]
    )


def passthrough_variant(name: str, root: Path, *opts: str) -> Variant:
    script = os.path.abspath(__file__)
    return Variant(
        name, lambda mp: [sys.executable, script, "--serve-passthrough", str(root), str(mp), *opts]
    )


def fsspec_variant(peer: str, kind: str, root: str, endpoint: str = "") -> Variant:
    modules = "fsspec.fuse, fuse" + (", s3fs" if kind == "s3" else "")
    probe = subprocess.run(
        [peer, "-c", f"import {modules}"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return Variant("fsspec", missing=f"not installed for {peer} ({why})")
    return Variant(
        "fsspec", lambda mp: [peer, "-c", FSSPEC_LAUNCHER, kind, root, str(mp), endpoint]
    )


# == the minimal passthrough (run in its own process by --serve-passthrough) ======================


def serve_passthrough(root: str, mountpoint: str, *, kernel_cache: bool, durable: bool) -> None:
    """The Python-FUSE ceiling: every call one syscall on the backing directory. ``durable``
    fsyncs a written file and its directory at close (flush), as n5fs's file store
    commits."""
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # mfusepy would pick libfuse 2 first
    import mfusepy

    written: dict[int, str] = {}

    class Passthrough(mfusepy.Operations):  # type: ignore[misc]  # untyped binding
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            st = os.fstat(fh) if fh is not None else os.lstat(root + path)
            keys = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")
            attrs = {key: getattr(st, key) for key in keys}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path: str, fh: int) -> list[Any]:
            with os.scandir(root + path) as entries:
                kinds = [
                    (e.name, stat.S_IFDIR if e.is_dir(follow_symlinks=False) else stat.S_IFREG, 0)
                    for e in entries
                ]
            return [".", "..", *kinds]

        def open(self, path: str, flags: int) -> int:
            return os.open(root + path, flags)

        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            fd = os.open(root + path, flags | os.O_CREAT, mode)
            written[fd] = root + path
            return fd

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return os.pwrite(fh, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            os.truncate(root + path, length)

        def flush(self, path: str, fh: int) -> None:
            """close(2) waits for flush (not for release): the durable variant syncs here."""
            name = written.get(fh)
            if durable and name is not None:
                os.fsync(fh)
                parent = os.open(os.path.dirname(name), os.O_RDONLY)
                os.fsync(parent)
                os.close(parent)

        def release(self, path: str, fh: int) -> None:
            written.pop(fh, None)
            os.close(fh)

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            os.fsync(fh)

        def unlink(self, path: str) -> None:
            os.unlink(root + path)

        def mkdir(self, path: str, mode: int) -> None:
            os.mkdir(root + path, mode)

        def rmdir(self, path: str) -> None:
            os.rmdir(root + path)

        def rename(self, old: str, new: str) -> None:
            os.rename(root + old, root + new)

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(root + path, mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            os.lchown(root + path, uid, gid)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
            if times is None:
                os.utime(root + path)
            else:
                os.utime(root + path, ns=times)

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(root)
            names = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
            return {name: getattr(sv, name) for name in names}

    opts: dict[str, Any] = {"attr_timeout": TTL, "entry_timeout": TTL, "negative_timeout": TTL}
    if kernel_cache:
        opts["kernel_cache"] = True
    mfusepy.FUSE(Passthrough(), mountpoint, foreground=True, nothreads=False, **opts)


# == workloads =====================================================================================


def read_files(root: Path, names: list[str], threads: int = 1) -> int:
    """Read whole files in order through 1 MiB buffers; the bytes seen."""

    def one(name: str) -> int:
        view, total = memoryview(bytearray(MiB)), 0
        with open(root / name, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
        return total

    if threads == 1:
        return sum(one(name) for name in names)
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, names))


def run_tool(*argv: str) -> int:
    """A command-line tool's run; the lines it printed."""
    proc = subprocess.run(argv, capture_output=True, check=False)
    if proc.returncode != 0:
        raise BenchError(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-300:]!r}")
    return proc.stdout.count(b"\n")


def stat_storm(root: Path, keys: list[str]) -> int:
    found = 0
    for key in keys:
        try:
            os.stat(root / key)
        except FileNotFoundError:
            continue
        found += 1
    return found


def ts_sum(kvstore: dict[str, Any]) -> int:
    """TensorStore reads the whole sparse array (no cache pool); the sum of its values."""
    import numpy as np
    import tensorstore as ts

    array = ts.open({"driver": "zarr", "kvstore": kvstore}, read=True, context=ts.Context())
    return int(np.sum(array.result().read().result(), dtype=np.uint64))


@dataclass
class Workload:
    """One row (or a cold and a warm row): how to run it on a root, and the right answer."""

    label: str
    group: str
    run: Callable[[Path], int]
    expect: int | None  # None: only the tool's exit status is checked
    nbytes: int = 0  # > 0: shown as MB/s
    warm: bool = True
    direct: Callable[[], int] | None = None  # S3: the plain boto3/TensorStore equivalent


def file_workloads(data: Data) -> list[Workload]:
    chunks = f"{(data.zarr_entries - 2) / 1000:g}k"
    storm = f"{len(data.sparse_keys) / 1000:g}k keys, 90% absent"
    return [
        Workload("read N5 raw", "read", partial(read_files, names=data.raw), data.raw_bytes,
                 data.raw_bytes),
        Workload("read N5 gzip", "read", partial(read_files, names=data.gzip), data.gzip_bytes,
                 data.gzip_bytes),
        Workload(f"find Zarr2 {chunks} chunks", "list",
                 lambda r: run_tool("find", str(r / "zarr")), data.zarr_entries, warm=False),
        Workload(f"ls -lR Zarr2 {chunks} chunks", "list",
                 lambda r: run_tool("ls", "-lR", str(r / "zarr")), None, warm=False),
        Workload(f"stat storm {storm}", "stat", partial(stat_storm, keys=data.sparse_keys),
                 data.sparse_present),
        Workload("TensorStore sparse read", "tensorstore",
                 lambda r: ts_sum({"driver": "file", "path": f"{r}/sparse/"}), data.sparse_sum),
    ]  # fmt: skip


def s3_workloads(data: Data, endpoint: str, bucket: str) -> list[Workload]:
    """The file workloads through mounts of the bucket, each with its boto3 equivalent."""
    client = s3_client(endpoint)

    def get_all(names: list[str]) -> int:
        return sum(len(client.get_object(Bucket=bucket, Key=n)["Body"].read()) for n in names)

    def list_all() -> int:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="zarr/")
        return sum(len(p.get("Contents", ())) for p in pages) + 1  # + the folder, as find

    def head_all() -> int:
        found = 0
        for key in data.sparse_keys:
            with contextlib.suppress(client.exceptions.ClientError):
                client.head_object(Bucket=bucket, Key=key)
                found += 1
        return found

    ts_s3 = {"driver": "s3", "bucket": bucket, "path": "sparse/", "endpoint": endpoint,
             "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}  # fmt: skip
    directs = [
        lambda: get_all(data.raw),
        lambda: get_all(data.gzip),
        list_all,
        list_all,
        head_all,
        lambda: ts_sum(ts_s3),
    ]
    loads = file_workloads(data)
    for load, direct in zip(loads, directs, strict=True):
        load.direct = direct
    return loads


# == measuring =====================================================================================


@dataclass
class Bench:
    args: argparse.Namespace
    mounts: Mounts
    cells: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (row, store, col)
    seconds: dict[tuple[str, str, str], float] = field(default_factory=dict)
    cache_note: str = ""

    def record(self, row: str, store: str, col: str, value: float, nbytes: int) -> None:
        self.seconds[(row, store, col)] = value
        self.cells[(row, store, col)] = (
            f"{nbytes / value / 1e6:.0f} MB/s" if nbytes else f"{value:.3g} s"
        )

    def failed(self, row: str, store: str, col: str, exc: BenchError) -> None:
        """A watchdog overrun is a lower bound on the time (ratios then read "> x")."""
        if str(exc).startswith("watchdog"):
            self.seconds[(row, store, col)] = self.args.timeout
            self.cells[(row, store, col)] = f"> {self.args.timeout:g} s"
        else:
            self.cells[(row, store, col)] = "failed"

    def timed(self, what: str, call: Callable[[], int], expect: int | None) -> float:
        with self.mounts.guard(what, self.args.timeout):
            start = time.perf_counter()
            try:
                got = call()
            except Exception as exc:  # any failure is a cell of the table, not the end
                fired = self.mounts.fired
                why = (
                    f"watchdog > {self.args.timeout:g} s"
                    if fired
                    else f"{type(exc).__name__}: {exc}"
                )
                raise BenchError(why) from exc
            elapsed = time.perf_counter() - start
        if expect is not None and got != expect:
            raise BenchError(f"{what}: wrong answer {got}, want {expect}")
        return elapsed

    @contextlib.contextmanager
    def mounted(self, variant: Variant, direct_root: Path) -> Iterator[Mount]:
        if variant.argv is None:
            yield Mount(direct_root)
            return
        mount = self.mounts.start(variant.name, variant.argv)
        try:
            yield mount
        finally:
            self.mounts.stop(mount)

    def workload(self, load: Workload, store: str, variants: list[Variant], data: Data) -> None:
        cold, warm = f"{load.label} · cold", f"{load.label} · warm"
        for variant in variants:
            if variant.missing:
                self.cells[(cold, store, variant.name)] = "not installed"
                continue
            what = f"{store} {load.label} via {variant.name}"
            try:
                with self.mounted(variant, data.root) as mount:
                    call = load.direct if variant.argv is None and load.direct else None
                    run = call or partial(load.run, mount.path)
                    self.cache_note = drop_caches(data)
                    self.record(cold, store, variant.name, self.timed(what, run, load.expect),
                                load.nbytes)  # fmt: skip
                    if load.warm:
                        rounds = self.args.rounds if store == "file" else self.args.s3_rounds
                        best = min(self.timed(what, run, load.expect) for _ in range(rounds))
                        self.record(warm, store, variant.name, best, load.nbytes)
            except BenchError as exc:
                self.failed(cold, store, variant.name, exc)
                print(f"  {what}: {exc}", flush=True)
            print(f"  {what}: cold {self.cells.get((cold, store, variant.name))}"
                  f", warm {self.cells.get((warm, store, variant.name), '-')}", flush=True)  # fmt: skip

    def writes(self, data: Data, tmp: Path) -> None:
        """``cp -r`` of each N5 dataset into an empty backing directory, directly or through
        a read-write mount, the variants taking turns each round (so drift hits all alike);
        each copy is compared byte for byte with its source afterwards."""
        variants = [
            Variant("direct"),
            passthrough_variant("pt", tmp / "w-pt"),
            passthrough_variant("pt+fsync", tmp / "w-pt+fsync", "--durable"),
            n5fs_variant("n5fs-rw", str(tmp / "w-n5fs-rw")),
        ]
        for name, nbytes in (("n5raw", data.raw_bytes), ("n5gzip", data.gzip_bytes)):
            row = f"cp -r N5 {name[2:]} (validated)"
            read_files(data.root, data.raw if name == "n5raw" else data.gzip)  # source warm
            backs = {v.name: tmp / f"w-{v.name}" for v in variants}
            times: dict[str, list[float]] = {v.name: [] for v in variants}
            try:
                with contextlib.ExitStack() as stack:
                    for v in variants:
                        backs[v.name].mkdir()
                    mounts = {v.name: stack.enter_context(self.mounted(v, backs[v.name]))
                              for v in variants}  # fmt: skip
                    for r in range(self.args.rounds):
                        for v in variants:
                            self.copy_once(row, v.name, mounts[v.name], name, r, data, times)
                    stats = self.mount_stats(mounts["n5fs-rw"])
                for v in variants:
                    if times[v.name]:
                        self.check_copy(data.root / name, backs[v.name], len(times[v.name]))
                        self.record(row, "file", v.name, min(times[v.name]), nbytes)
                print(f"  file {row}: "
                      + ", ".join(f"{v.name} {self.cells.get((row, 'file', v.name))}"
                                  for v in variants) + f" {stats}", flush=True)  # fmt: skip
            except BenchError as exc:
                print(f"  file {row}: {exc}", flush=True)
            finally:
                for back in backs.values():
                    shutil.rmtree(back, ignore_errors=True)

    def copy_once(self, row: str, col: str, mount: Mount, name: str, r: int, data: Data,
                  times: dict[str, list[float]]) -> None:  # fmt: skip
        cp = partial(run_tool, "cp", "-r", str(data.root / name), str(mount.path / f"{name}-{r}"))
        os.sync()  # no dirty backlog of an earlier copy throttles this one
        try:
            times[col].append(self.timed(f"{row} via {col}", cp, None))
        except BenchError as exc:
            self.failed(row, "file", col, exc)
            print(f"  file {row} via {col}: {exc}", flush=True)

    @staticmethod
    def mount_stats(mount: Mount) -> str:
        path = mount.path / ".n5fs" / "stats.json"
        if mount.proc is None or not path.exists():
            return ""
        stats = json.loads(path.read_text())
        return f"(commits {stats['commits']}, rejections {stats['rejections']})"

    @staticmethod
    def check_copy(src: Path, back: Path, copies: int) -> None:
        for r in range(copies):
            dst = back / f"{src.name}-{r}"
            for path in src.rglob("*"):
                if path.is_file() and not filecmp.cmp(path, dst / path.relative_to(src), False):
                    raise BenchError(f"{dst} differs from {src} at {path.relative_to(src)}")

    def rss(self, data: Data, store: str, source: str, sizes: list[str]) -> None:
        """Peak RSS of the daemon over a sequential then a 4-thread read of both N5 datasets."""
        for size in sizes:
            row = f"peak RSS, --cache-size {size}"
            variant = n5fs_variant("n5fs", source, "-o", "ro", "--cache-size", size)
            try:
                with self.mounted(variant, data.root) as mount:
                    assert mount.proc is not None
                    base = status_kib(mount.proc.pid)["VmRSS"]
                    both = data.raw + data.gzip
                    expect = data.raw_bytes + data.gzip_bytes
                    drop_caches(data)
                    self.timed(row, partial(read_files, mount.path, both), expect)
                    drop_caches(data)
                    self.timed(row, partial(read_files, mount.path, both, 4), expect)
                    peak = status_kib(mount.proc.pid)["VmHWM"]
                limit = parse_size(size) / MiB + 150
                self.cells[(row, store, "n5fs")] = f"{peak / 1024:.0f} MiB"
                self.cells[(row, store, "ratio")] = f"start {base / 1024:.0f} MiB"
                self.cells[(row, store, "target")] = f"<= {limit:.0f} MiB"
                self.cells[(row, store, "met")] = "yes" if peak / 1024 <= limit else "NO"
            except BenchError as exc:
                self.cells[(row, store, "n5fs")] = "failed"
                print(f"  {store} {row}: {exc}", flush=True)
            print(f"  {store} {row}: {self.cells.get((row, store, 'n5fs'))}", flush=True)


# == the table =====================================================================================

COLUMNS = ("direct", "pt", "pt+kc", "pt+fsync", "n5fs", "n5fs-rw", "fsspec")
#: row prefix -> (reference column, target on file, target on S3); ratio = t_ref / t_n5fs
TARGETS: dict[str, tuple[str, float | None, float | None]] = {
    "find": ("fsspec", 2.0, 10.0),
    "ls -lR": ("fsspec", 2.0, 10.0),
    "stat storm": ("fsspec", 2.0, 10.0),
    "TensorStore": ("direct", None, None),
    "cp -r": ("pt", 0.7, None),
}


def target_of(row: str) -> tuple[str, float | None, float | None] | None:
    if row.startswith("read N5"):
        return ("pt+kc", 0.9, None) if row.endswith("cold") else ("direct", 0.6, 0.6)
    return next((spec for prefix, spec in TARGETS.items() if row.startswith(prefix)), None)


def fill_ratios(bench: Bench, rows: list[tuple[str, str]]) -> None:
    for row, store in rows:
        spec = target_of(row)
        if spec is None:
            continue
        ref, on_file, on_s3 = spec
        if store == "s3" and ref.startswith("pt"):
            ref = "direct"  # no passthrough over S3: compare with boto3 itself
        mine = bench.seconds.get((row, store, "n5fs-rw" if row.startswith("cp") else "n5fs"))
        theirs = bench.seconds.get((row, store, ref))
        target = on_file if store == "file" else on_s3
        if mine is None or theirs is None:
            continue
        ratio = theirs / mine
        bound = "> " if bench.cells.get((row, store, ref), "").startswith(">") else ""
        bench.cells[(row, store, "ratio")] = f"{bound}{ratio:.2f}x vs {ref}"
        if target is not None:
            bench.cells[(row, store, "target")] = f">= {target:g}x"
            bench.cells[(row, store, "met")] = "yes" if ratio >= target else "NO"


def print_table(bench: Bench) -> None:
    rows: list[tuple[str, str]] = []
    for row, store, _ in bench.cells:
        if (row, store) not in rows:
            rows.append((row, store))
    fill_ratios(bench, rows)
    heads = ("workload", "store", *COLUMNS, "n5fs ratio", "target", "met")
    table = [
        [row, store, *(bench.cells.get((row, store, c), "") for c in (*COLUMNS, "ratio", "target", "met"))]
        for row, store in rows
    ]  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(heads, *table, strict=True)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rounds = f"{bench.args.rounds} (S3: {bench.args.s3_rounds})"
    print(f"\ncold = fresh mount after {bench.cache_note}; warm = best of {rounds}")
    print(f"{os.cpu_count()} CPUs, load average now {load} (other work on the machine skews)")
    print("ratios are speeds (t_ref / t_n5fs; cp -r uses n5fs-rw); RSS rows show VmHWM\n")
    for line in (heads, *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


# == main ==========================================================================================


def variants_for(group: str, store: str, source: str, data: Data, peer: Variant) -> list[Variant]:
    direct, ro = Variant("direct"), n5fs_variant("n5fs", source, "-o", "ro")
    if store == "s3":
        return [direct, ro, peer]
    pt = passthrough_variant("pt", data.root)
    if group == "read":
        kc = passthrough_variant("pt+kc", data.root, "--kernel-cache")
        return [direct, pt, kc, ro, n5fs_variant("n5fs-rw", source), peer]
    return [direct, pt, ro, peer]


def run_store(bench: Bench, store: str, data: Data, loads: list[Workload], source: str,
              peer: Variant) -> None:  # fmt: skip
    args = bench.args
    for load in loads:
        if args.only in (None, load.group):
            bench.workload(load, store, variants_for(load.group, store, source, data, peer), data)
    if args.only in (None, "rss"):
        sizes = args.cache_sizes.split(",") if store == "file" else ["256M"]
        bench.rss(data, store, source, sizes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--skip-file", action="store_true", help="measure S3 only")
    p.add_argument("--only", choices=GROUPS, default=None, help="one workload group")
    p.add_argument("--gib", type=float, default=1.0, help="size of each N5 dataset (decoded)")
    p.add_argument("--zarr-chunks", type=int, default=50_000)
    p.add_argument("--sparse-side", type=int, default=100, help="grid side: side^2 keys")
    p.add_argument("--s3-gib", type=float, default=None, help="scale the S3 N5 data down")
    p.add_argument("--s3-zarr-chunks", type=int, default=None, help="scale the S3 listing down")
    p.add_argument("--rounds", type=int, default=3, help="warm repeats (best of)")
    p.add_argument("--s3-rounds", type=int, default=1, help="warm repeats on S3 (slow on moto)")
    p.add_argument("--timeout", type=float, default=600, help="watchdog per measured call, s")
    p.add_argument("--cache-sizes", default="64M,256M,1G", help="--cache-size values for RSS")
    p.add_argument("--peer-python", default=sys.executable, help="interpreter for fsspec FUSE")
    p.add_argument("--tmp", default=None, help="where the temp dir goes (default: system tmp)")
    p.add_argument("--serve-passthrough", nargs=2, metavar=("ROOT", "MP"), help=argparse.SUPPRESS)
    p.add_argument("--kernel-cache", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--durable", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.gib, args.zarr_chunks, args.sparse_side = 1 / 16, 2_000, 30
        args.rounds, args.timeout, args.cache_sizes = 2, 120, "64M"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_passthrough:
        root, mountpoint = args.serve_passthrough
        serve_passthrough(root, mountpoint, kernel_cache=args.kernel_cache, durable=args.durable)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-mount-", dir=args.tmp))
    env = {**os.environ, **AWS_ENV, "N5FS_STATE_DIR": str(tmp / "state")}
    os.environ.update(AWS_ENV)  # for TensorStore's s3 driver in this process
    bench = Bench(args, Mounts(tmp, env))
    try:
        data = make_data(tmp / "data", args.gib, args.zarr_chunks, args.sparse_side)
        peer = fsspec_variant(args.peer_python, "file", str(data.root))
        if not args.skip_file:
            run_store(bench, "file", data, file_workloads(data), str(data.root), peer)
        if args.only in (None, "write") and not args.skip_file:
            bench.writes(data, tmp)
        if not args.skip_s3 and args.only != "write":
            run_s3(bench, data, tmp)
        print_table(bench)
    finally:
        bench.mounts.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def run_s3(bench: Bench, data: Data, tmp: Path) -> None:
    args = bench.args
    gib, chunks = args.s3_gib or args.gib, args.s3_zarr_chunks or args.zarr_chunks
    if (gib, chunks) != (args.gib, args.zarr_chunks):
        print(f"S3 runs scaled down: N5 {gib:g} GiB, Zarr2 {chunks} chunks")
        data = make_data(tmp / "s3data", gib, chunks, args.sparse_side)
    with moto_server() as endpoint:
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        upload(data, s3_client(endpoint), bucket)
        source = json.dumps({"driver": "s3", "bucket": bucket, "path": "", "endpoint": endpoint,
                             "aws_region": "us-east-1"})  # fmt: skip
        peer = fsspec_variant(args.peer_python, "s3", bucket, endpoint)
        run_store(bench, "s3", data, s3_workloads(data, endpoint, bucket), source, peer)


if __name__ == "__main__":
    raise SystemExit(main())
