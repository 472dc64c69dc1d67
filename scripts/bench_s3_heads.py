"""What a reader of many small files pays on an S3 mount, read-only against read-write: the
requests by kind and the time of ``find MNT -type f | xargs cat`` over ``--files`` chunks of
1 KiB (a Zarr v2 array, ``--folders`` chunk folders, read in listing order; ``--plain``: plain
folders, each of which a lookup also probes for metadata, five small GETs), through
:mod:`n5fs.testing.s3_proxy` at each ``--latency`` (one way: 0.025 is a 50 ms round trip).

Rows, each on a fresh mount of one bucket (so no cache of the kernel or of n5fs helps):

- ``ro``: a read-only mount (its times come from the listing);
- ``rw``: a read-write mount of objects no one set a time on (``aws s3 cp``, a pipeline);
- ``rw, times set``: a read-write mount after another mount set every object's time
  (``touch -d``, as ``rsync -a`` or ``cp -a`` into a mount does).

Every run gets a moto server on 127.0.0.1: its own speed is not S3's, so read the times as
ratios between rows of one run, and the request counts as they are. ``PYTHONPATH`` picks the
n5fs that mounts: point it at a ``git worktree`` of another commit to compare.

    python scripts/bench_s3_heads.py                      # 1,000 files, 0 and 25 ms
    python scripts/bench_s3_heads.py --files 200 --latency 0.025
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import boto3

from n5fs.testing.moto_server import moto_server
from n5fs.testing.s3_proxy import fault_proxy
from n5fs.testing.soak import mounted, source_of

PATH = "tree/"
KEPT = "@1000000000"  # the time `touch -d` sets on every object in the "times set" row


def fill(endpoint: str, files: int, folders: int, *, plain: bool) -> str:
    """A fresh bucket with ``files`` objects of 1 KiB, straight to the server (no mount)."""
    bucket = f"heads-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    per = max(1, files // folders)
    if not plain:
        zarray = {
            "zarr_format": 2,
            "shape": [folders, per * 1024],
            "chunks": [1, 1024],
            "dtype": "|u1",
            "compressor": None,
            "fill_value": 0,
            "order": "C",
            "filters": None,
            "dimension_separator": "/",
        }
        client.put_object(Bucket=bucket, Key=f"{PATH}arr/.zarray", Body=json.dumps(zarray))
    for i in range(files):
        name = f"d{i // per:03d}/f{i % per:04d}" if plain else f"arr/{i // per}/{i % per}"
        client.put_object(Bucket=bucket, Key=PATH + name, Body=bytes([i % 251]) * 1024)
    return bucket


def set_times(endpoint: str, bucket: str, work: Path) -> None:
    """Every object's time set through a read-write mount (no proxy: not counted)."""
    mp, state = work / f"touch-{bucket}", work / f"state-touch-{bucket}"
    with mounted(source_of(endpoint, bucket, PATH), mp, state):
        subprocess.run(
            f"find {mp} -type f -print0 | xargs -0 touch -d {KEPT}", shell=True, check=True
        )


def read_all(
    endpoint: str, bucket: str, work: Path, latency: float, *args: str
) -> tuple[float, dict[str, int], int]:
    """Seconds, requests by kind and files read by ``find | xargs cat`` on a fresh mount."""
    with fault_proxy(endpoint) as proxy:
        mp = work / f"mnt-{uuid.uuid4().hex[:8]}"
        with mounted(source_of(proxy.endpoint, bucket, PATH), mp, work / "state", *args):
            proxy.latency = latency
            proxy.reset_counts()
            start = time.perf_counter()
            done = subprocess.run(
                f"find {mp} -type f -size 1k -print0 | xargs -0 cat | wc -c",
                shell=True,
                check=True,
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - start
            counts = dict(proxy.counts)
            proxy.latency = 0.0
    return seconds, counts, int(done.stdout.strip()) // 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--folders", type=int, default=10)
    parser.add_argument("--plain", action="store_true", help="plain folders, not an array")
    parser.add_argument(
        "--cache-ttl", help="the mounts' --cache-ttl (a run longer than it lists folders again)"
    )
    parser.add_argument(
        "--latency", type=float, action="append", help="one-way delay, seconds (repeatable)"
    )
    args = parser.parse_args()
    latencies = args.latency or [0.0, 0.025]
    # moto's fake credentials, never a real account's (the mounts inherit them)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="n5fs-heads-") as tmp:
        work = Path(tmp)
        untimed = fill(endpoint, args.files, args.folders, plain=args.plain)
        timed = fill(endpoint, args.files, args.folders, plain=args.plain)
        set_times(endpoint, timed, work)
        ttl = ("--cache-ttl", args.cache_ttl) if args.cache_ttl else ()
        rows = [
            ("ro", untimed, ("--read-only", *ttl)),
            ("rw", untimed, ttl),
            ("rw, times set", timed, ttl),
        ]
        tree = "plain folders" if args.plain else "chunk folders of a Zarr array"
        print(f"find | xargs cat of {args.files} files of 1 KiB in {args.folders} {tree}")
        if args.cache_ttl:
            print(f"mounts with --cache-ttl {args.cache_ttl}")
        print("| mount | one-way latency | seconds | files read | requests per file | requests |")
        print("| --- | --- | --- | --- | --- | --- |")
        for latency in latencies:
            for name, bucket, extra in rows:
                seconds, counts, read = read_all(endpoint, bucket, work, latency, *extra)
                total = sum(counts.values())
                kinds = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                print(
                    f"| {name} | {latency * 1000:.0f} ms | {seconds:.1f} | {read} | "
                    f"{total / max(read, 1):.3f} | {kinds} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
