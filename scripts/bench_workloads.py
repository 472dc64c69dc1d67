"""What the mount benchmark (scripts/bench_mount.py) measures: the data sets it writes (N5 raw
and gzip, a Zarr v2 array of many small chunks, a sparse Zarr v2 grid), their upload to S3,
and the workloads timed on a mount of them, each with the answer a correct run must give.

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
SMALL_FILES = 10_000  # the "read 10k small files": this many Zarr chunks
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
    small: list[str]  # up to SMALL_FILES Zarr chunks, spread over the array, in name order
    small_bytes: int
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
    chunks = [f for f in files("zarr") if not f.rpartition("/")[2].startswith(".")]
    small = chunks[:: max(1, len(chunks) // SMALL_FILES)][:SMALL_FILES]
    data = Data(
        root,
        raw,
        gz,
        sum((root / f).stat().st_size for f in raw),
        sum((root / f).stat().st_size for f in gz),
        sum(1 for _ in (root / "zarr").rglob("*")) + 1,
        small,
        sum((root / f).stat().st_size for f in small),
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
        Workload(f"read {len(data.small) / 1000:g}k small files (Zarr2 chunks)", "read",
                 partial(read_files, names=data.small), data.small_bytes),
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
