"""Many mounts, one bucket: what conditional writes cost.

Commit throughput with 1, 2 and 4 n5fs daemons mounting one prefix of one bucket on a moto
server (127.0.0.1, port 0) and writing disjoint chunks of one Zarr v2 array (each mount a
node; ``--threads`` writers per mount, open/write/close per chunk, as a chunk writer does),
once with conditional writes in force (``-o conditional=auto``, the default) and once without
(``-o conditional=off``), plus boto3 PUTs of the same chunks from as many threads (direct).
A second workload creates arrays (metadata commits, each a compare-and-swap plus the upkeep of
a consolidated root) from every mount at once. Every figure comes from this run; the table
prints throughputs and the ratio that judges the design (conditional/off must stay >= 0.9 for
chunk writes: only metadata commits are compare-and-swap, so chunk writes should barely
pay). Nothing is asserted.

    python scripts/bench_many_mounts.py               # 4 x 256 chunks of 64 KiB per run
    python scripts/bench_many_mounts.py --quick       # a smoke run
    python scripts/bench_many_mounts.py --chunks 512 --chunk-kib 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import boto3

from n5fs.testing.moto_server import moto_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

CLI = [sys.executable, "-m", "n5fs"]


def client(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


@contextlib.contextmanager
def mounts(
    endpoint: str, bucket: str, prefix: str, count: int, tmp: Path, conditional: str
) -> Iterator[list[Path]]:
    spec = json.dumps({"driver": "s3", "bucket": bucket, "path": prefix, "endpoint": endpoint})
    points: list[Path] = []
    env = {
        **os.environ,
        "N5FS_STATE_DIR": str(tmp / "state"),
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        for i in range(count):
            mp = tmp / f"node{i}-{uuid.uuid4().hex[:6]}"
            mp.mkdir()
            points.append(mp)
            run = subprocess.run(
                [*CLI, "mount", spec, str(mp), "-q", "-o", f"conditional={conditional}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if run.returncode != 0:
                raise RuntimeError(f"mount failed: {run.stderr}")
        yield points
    finally:
        for mp in points:
            subprocess.run([*CLI, "unmount", str(mp)], env=env, capture_output=True, check=False)


def timed(work: Callable[..., None], *args: object) -> float:
    start = time.perf_counter()
    work(*args)
    return time.perf_counter() - start


def zarray(chunks: int, chunk_bytes: int) -> bytes:
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": [chunks * chunk_bytes],
            "chunks": [chunk_bytes],
            "dtype": "|u1",
            "compressor": None,
            "fill_value": 0,
            "order": "C",
            "filters": None,
        }
    ).encode()


def write_chunks(points: list[Path], total: int, chunk: bytes, threads: int) -> None:
    """Chunk i goes through mount i % len(points): disjoint chunks, every mount busy."""

    def one(i: int) -> None:
        (points[i % len(points)] / "arr" / str(i)).write_bytes(chunk)

    with ThreadPoolExecutor(threads * len(points)) as pool:
        list(pool.map(one, range(total)))


def create_arrays(points: list[Path], per_mount: int, threads: int) -> None:
    meta = zarray(4, 4)

    def one(job: tuple[int, int]) -> None:
        node, j = job
        folder = points[node] / f"n{node}_{j}"
        folder.mkdir()
        (folder / ".zarray").write_bytes(meta)

    jobs = [(node, j) for node in range(len(points)) for j in range(per_mount)]
    with ThreadPoolExecutor(threads * len(points)) as pool:
        list(pool.map(one, jobs))


def direct_puts(endpoint: str, bucket: str, prefix: str, total: int, chunk: bytes, threads: int):  # type: ignore[no-untyped-def]
    s3 = client(endpoint)

    def one(i: int) -> None:
        s3.put_object(Bucket=bucket, Key=f"{prefix}arr/{i}", Body=chunk)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(total)))


def run(args: argparse.Namespace) -> None:
    chunk = os.urandom(args.chunk_kib << 10)
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="n5fs-bench-") as tmp:
        s3 = client(endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        rows: list[tuple[str, int, str, float, float]] = []
        for count in args.mounts:
            total = args.chunks * count
            prefix = f"direct{count}/"
            seconds = timed(
                direct_puts, endpoint, bucket, prefix, total, chunk, args.threads * count
            )
            rows.append(("chunks", count, "direct", total / seconds, seconds))
            for conditional in ("auto", "off"):
                prefix = f"c{count}{conditional}/"
                s3.put_object(
                    Bucket=bucket,
                    Key=f"{prefix}arr/.zarray",
                    Body=zarray(total, len(chunk)),
                )
                s3.put_object(Bucket=bucket, Key=f"{prefix}.zgroup", Body=b'{"zarr_format": 2}')
                s3.put_object(
                    Bucket=bucket,
                    Key=f"{prefix}.zmetadata",
                    Body=b'{"zarr_consolidated_format": 1, "metadata": {}}',
                )
                with mounts(endpoint, bucket, prefix, count, Path(tmp), conditional) as points:
                    write_chunks(points[:1], 1, chunk, 1)  # warm: detection, listings
                    seconds = timed(write_chunks, points, total, chunk, args.threads)
                    rows.append(("chunks", count, conditional, total / seconds, seconds))
                    arrays = args.arrays * count
                    seconds = timed(create_arrays, points, args.arrays, args.threads)
                    rows.append(("arrays", count, conditional, arrays / seconds, seconds))
                    entries = json.loads(
                        s3.get_object(Bucket=bucket, Key=f"{prefix}.zmetadata")["Body"].read()
                    )["metadata"]
                    kept = sum(1 for k in entries if k.endswith("/.zarray") and k.startswith("n"))
                    print(
                        f"  {count} mount(s), conditional={conditional}: "
                        f"{kept}/{arrays} arrays in the consolidated root",
                        flush=True,
                    )
        report(rows, args)


def report(rows: list[tuple[str, int, str, float, float]], args: argparse.Namespace) -> None:
    by = {(what, count, mode): rate for what, count, mode, rate, _ in rows}
    print()
    print(
        f"chunk {args.chunk_kib} KiB, {args.chunks} chunks and {args.arrays} arrays per mount, "
        f"{args.threads} writer threads per mount; moto on 127.0.0.1"
    )
    print(
        f"{'workload':<8} {'mounts':>6} {'mode':>7} {'per s':>9} {'MB/s':>8} "
        f"{'vs off':>7} {'vs direct':>9}"
    )
    for what, count, mode, rate, _ in rows:
        off = by.get((what, count, "off"))
        direct = by.get((what, count, "direct"))
        mbps = rate * args.chunk_kib / 1024 if what == "chunks" else float("nan")
        vs_off = f"{rate / off:.2f}" if off and mode != "direct" else "-"
        vs_direct = f"{rate / direct:.2f}" if direct and mode != "direct" else "-"
        print(
            f"{what:<8} {count:>6} {mode:>7} {rate:>9.1f} {mbps:>8.1f} {vs_off:>7} {vs_direct:>9}"
        )
    # chunk writes are never conditional: what they lose is the probe and the metadata upkeep
    print("target: chunk writes with conditional=auto >= 0.9x conditional=off")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--mounts", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--chunks", type=int, default=256, help="chunks per mount")
    p.add_argument("--chunk-kib", type=int, default=64)
    p.add_argument("--arrays", type=int, default=20, help="arrays created per mount")
    p.add_argument("--threads", type=int, default=4, help="writer threads per mount")
    args = p.parse_args()
    if args.quick:
        args.chunks, args.arrays, args.mounts = 32, 4, [1, 2]
    run(args)


if __name__ == "__main__":
    main()
