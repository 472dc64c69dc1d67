"""What the mount benchmark (scripts/bench_mount.py) measures: the data sets it writes (N5 raw
and gzip, a Zarr v2 chunk tree laid out as a large nested volume, a sparse Zarr v2 grid),
their upload to S3, and the workloads timed on a mount of them, each with the answer a correct
run must give.

The chunk tree is a Zarr v2 array of 51,200 chunks in 1,641 folders: a 3-D array
with dimension_separator "/" and 40 x 40 x 32 stored chunks (1 + 40 + 1,600 folders) of 512
bytes each; its grid runs ten times further along the last axis than the stored chunks, so
the stat storm can ask in-grid keys of which 90 % are absent, spread over the 1,600 leaf
folders (an out-of-grid name would be a different question: not a chunk key at all).

Kept apart from bench_mount.py so that the data and the workloads read on their own, and
bench_mount.py stays the runner (columns, rounds, table). No shared state: every function
works on its arguments (S3 workloads close over one boto3 client, which is thread-safe).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

MiB = 1 << 20
BLOCK = 128
SMALL_FILES = 10_000  # the "read 10k small files" row: this many Zarr chunks
ZARR_CHUNK = (4, 8, 8)  # uint16: 512 bytes a chunk before zstd
GRID_SPAN = 10  # the chunk tree's grid, along its last axis, over its stored chunks
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
AWS_ENV = {**AWS, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


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
    zarr_chunks: int  # chunk files in the tree
    zarr_folders: int  # folders in the tree, `zarr` itself included
    small: list[str]  # up to SMALL_FILES Zarr chunks, spread over the array, in name order
    small_bytes: int
    storm_keys: list[str]  # in-grid chunk keys of the tree, in grid order (10 % stored)
    storm_present: int
    sparse_sum: int  # of the sparse array's values (TensorStore sparse read)


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


def parse_grid(text: str) -> tuple[int, int, int]:
    """``"40,40,32"``: the chunk tree's stored chunks per axis."""
    grid = tuple(int(x) for x in text.split(","))
    if len(grid) != 3 or min(grid) < 1:
        raise ValueError(f"a grid is three positive counts, like 40,40,32: {text!r}")
    return grid[0], grid[1], grid[2]


def write_zarr(root: Path, stored: tuple[int, int, int]) -> None:
    """The chunk tree: ``stored`` chunks per axis, written whole, nested by "/"; the grid is
    :data:`GRID_SPAN` times longer along the last axis (never written: absent chunks)."""
    import numpy as np
    import tensorstore as ts

    grid = (stored[0], stored[1], stored[2] * GRID_SPAN)
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(root / "zarr")},
        "metadata": {
            "shape": [g * c for g, c in zip(grid, ZARR_CHUNK, strict=True)],
            "chunks": list(ZARR_CHUNK),
            "dtype": "<u2",
            "compressor": {"id": "zstd", "level": 1},
            "fill_value": 0,
            "dimension_separator": "/",
        },
    }
    array = ts.open(spec, create=True).result()
    extent = tuple(n * c for n, c in zip(stored, ZARR_CHUNK, strict=True))
    rng = np.random.default_rng(1)
    for i in range(0, extent[0], ZARR_CHUNK[0]):  # one slab of chunks at a time: bounded memory
        slab = rng.integers(1, 999, (ZARR_CHUNK[0], *extent[1:]), dtype=np.uint16)
        array[i : i + ZARR_CHUNK[0], :, : extent[2]].write(slab).result()


def storm_keys(stored: tuple[int, int, int], count: int) -> tuple[list[str], int]:
    """``count`` in-grid chunk keys of the tree, 10 % stored (spread over the stored chunks)
    and 90 % absent (spread over the leaf folders' unwritten grid positions), in grid order
    as a reader of chunks asks them; and how many are stored."""
    import numpy as np

    rng = np.random.default_rng(3)
    a, b, c = stored
    present = min(max(1, count // 10), a * b * c)
    absent = min(count - present, a * b * c * (GRID_SPAN - 1))
    cells = [np.unravel_index(n, (a, b, c)) for n in rng.choice(a * b * c, present, replace=False)]
    cells += [
        (i, j, k + c)
        for i, j, k in (
            np.unravel_index(n, (a, b, c * (GRID_SPAN - 1)))
            for n in rng.choice(a * b * c * (GRID_SPAN - 1), absent, replace=False)
        )
    ]
    ordered = sorted(tuple(int(x) for x in cell) for cell in cells)
    return [f"zarr/{i}/{j}/{k}" for i, j, k in ordered], present


def write_sparse(root: Path, side: int) -> tuple[int, int]:
    """A side x side grid of 64x64 chunks of which 10 % are stored, for TensorStore to read
    whole; how many chunks are stored and the sum of the array's values."""
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
    return present, total


def make_data(root: Path, gib: float, zarr_grid: tuple[int, int, int], sparse_side: int,
              storm: int) -> Data:  # fmt: skip
    start = time.perf_counter()
    write_n5_pair(root, gib)
    write_zarr(root, zarr_grid)
    sparse_present, sparse_sum = write_sparse(root, sparse_side)
    keys, present = storm_keys(zarr_grid, storm)

    def files(name: str) -> list[str]:
        return sorted(
            p.relative_to(root).as_posix() for p in (root / name).rglob("*") if p.is_file()
        )

    raw, gz = files("n5raw"), files("n5gzip")
    chunks = [f for f in files("zarr") if not f.rpartition("/")[2].startswith(".")]
    folders = 1 + sum(1 for p in (root / "zarr").rglob("*") if p.is_dir())
    small = chunks[:: max(1, len(chunks) // SMALL_FILES)][:SMALL_FILES]
    data = Data(
        root,
        raw,
        gz,
        sum((root / f).stat().st_size for f in raw),
        sum((root / f).stat().st_size for f in gz),
        sum(1 for _ in (root / "zarr").rglob("*")) + 1,
        len(chunks),
        folders,
        small,
        sum((root / f).stat().st_size for f in small),
        keys,
        present,
        sparse_sum,
    )
    print(
        f"data in {root}: N5 raw {data.raw_bytes / MiB:.0f} MiB ({len(raw)} files), gzip "
        f"{data.gzip_bytes / MiB:.0f} MiB; Zarr v2 {len(chunks)} chunks in {folders} folders "
        f"(stat storm: {len(keys)} keys, {present} stored); sparse {sparse_present}/"
        f"{sparse_side**2} chunks ({time.perf_counter() - start:.0f} s)",
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
    tree = f"{data.zarr_chunks / 1000:g}k chunks in {data.zarr_folders:,} folders"
    leaves = len({key.rpartition("/")[0] for key in data.storm_keys})
    storm = f"{len(data.storm_keys) / 1000:g}k chunk keys, 90% absent, over {leaves:,} folders"
    return [
        Workload("read N5 raw", "read", partial(read_files, names=data.raw), data.raw_bytes,
                 data.raw_bytes),
        Workload("read N5 gzip", "read", partial(read_files, names=data.gzip), data.gzip_bytes,
                 data.gzip_bytes),
        Workload(f"read {len(data.small) / 1000:g}k small files (Zarr2 chunks)", "read",
                 partial(read_files, names=data.small), data.small_bytes),
        Workload(f"find Zarr2 {tree}", "list",
                 lambda r: run_tool("find", str(r / "zarr")), data.zarr_entries, warm=False),
        Workload(f"ls -lR Zarr2 {tree}", "list",
                 lambda r: run_tool("ls", "-lR", str(r / "zarr")), None, warm=False),
        Workload(f"stat storm {storm}", "stat", partial(stat_storm, keys=data.storm_keys),
                 data.storm_present),
        Workload("TensorStore sparse read", "tensorstore",
                 lambda r: ts_sum({"driver": "file", "path": f"{r}/sparse/"}), data.sparse_sum),
    ]  # fmt: skip


def s3_workloads(data: Data, endpoint: str, bucket: str) -> list[Workload]:
    """The file workloads through mounts of the bucket, each with its boto3 equivalent."""
    client = s3_client(endpoint)

    def get_all(names: list[str]) -> int:
        return sum(len(client.get_object(Bucket=bucket, Key=n)["Body"].read()) for n in names)

    def list_all() -> int:
        """The tree's keys, one flat listing, and the folders they imply: what find prints."""
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="zarr/")
        keys = [c["Key"] for p in pages for c in p.get("Contents", ())]
        leaves = {key.rpartition("/")[0] for key in keys}
        folders = {leaf[:i] for leaf in leaves for i, ch in enumerate(leaf) if ch == "/"}
        return len(keys) + len(leaves | folders)

    def head_all() -> int:
        found = 0
        for key in data.storm_keys:
            with contextlib.suppress(client.exceptions.ClientError):
                client.head_object(Bucket=bucket, Key=key)
                found += 1
        return found

    ts_s3 = {"driver": "s3", "bucket": bucket, "path": "sparse/", "endpoint": endpoint,
             "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}  # fmt: skip
    directs = [
        lambda: get_all(data.raw),
        lambda: get_all(data.gzip),
        lambda: get_all(data.small),
        list_all,
        list_all,
        head_all,
        lambda: ts_sum(ts_s3),
    ]
    loads = file_workloads(data)
    for load, direct in zip(loads, directs, strict=True):
        load.direct = direct
    return loads
