"""Faults of a real network against a read-write S3 mount, one table: for each fault mix, a
zarr-python 3 array of ``--chunks`` chunks written from 8 threads through the mount, then
read back through it by TensorStore; failed calls, what the bucket holds, time (and the time
against the run with no faults), requests and faults injected. A last row: one key whose
every PUT is reset, then 16 writes of other keys right after it (how many fail).

Every run gets a fresh mount of a fresh bucket on a moto server on 127.0.0.1, behind
:mod:`n5fs.testing.s3_proxy`. Moto's own speed is not S3's: read the times as ratios between
rows of one run, and the request counts as they are.

    python scripts/bench_network.py              # 512 chunks
    python scripts/bench_network.py --chunks 128 --latency 0.025
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import numpy as np
import tensorstore as ts
import zarr

from n5fs.testing.moto_server import moto_server
from n5fs.testing.s3_proxy import Fault, fault_proxy
from n5fs.testing.soak import N5FS, mounted, source_of

if TYPE_CHECKING:
    from collections.abc import Callable

MIXES: dict[str, Callable[[], list[Fault]]] = {
    "no faults": list,
    "10% resets, PUT and GET": lambda: [
        Fault("reset_before", method="PUT", probability=0.05),
        Fault("reset_after", method="PUT", probability=0.05),
        Fault("reset_before", method="GET", probability=0.05),
        Fault("reset_mid_body", method="GET", probability=0.05),
    ],
    "10% PUTs cut short, 200": lambda: [Fault("truncate", method="PUT", probability=0.1)],
    "20% 503 SlowDown": lambda: [Fault("status", status=503, code="SlowDown", probability=0.2)],
}


def new_bucket(endpoint: str) -> str:
    name = f"net-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


def array_run(endpoint: str, work: Path, name: str, chunks: int, latency: float) -> dict[str, Any]:
    """One row: write, read back, check the bucket."""
    rows = chunks // 16 * 8  # 16 chunks of 8 x 8 a band of 8 rows
    values = np.random.default_rng(1).integers(0, 60000, (rows, 128), "uint16")
    bucket = new_bucket(endpoint)
    state = work / f"state-{bucket}"
    failed = 0
    with fault_proxy(endpoint, seed=1) as proxy:
        proxy.latency = latency
        with mounted(source_of(proxy.endpoint, bucket), work / f"mnt-{bucket}", state) as _pid:
            mp = work / f"mnt-{bucket}"
            arr = zarr.create_array(
                str(mp / "arr"), shape=values.shape, chunks=(8, 8), dtype="uint16", zarr_format=2
            )
            proxy.reset_counts()
            proxy.inject(*MIXES[name]())
            band = rows // 8

            def write(i: int) -> int:
                try:
                    arr[i * band : (i + 1) * band, :] = values[i * band : (i + 1) * band, :]
                except Exception:  # noqa: BLE001 - a failed write is counted, not fatal
                    return 1
                return 0

            start = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                failed = sum(pool.map(write, range(8)))
            wrote = time.monotonic() - start
            start = time.monotonic()
            try:
                spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(mp / "arr")}}
                read_ok = np.array_equal(ts.open(spec).result().read().result(), values)
            except Exception:  # noqa: BLE001 - a failed read is counted, not fatal
                read_ok = False
            read = time.monotonic() - start
            proxy.clear()
            counts, injected = dict(proxy.counts), sum(proxy.injected.values())
    check = subprocess.run(
        [*N5FS, "validate", source_of(endpoint, bucket)],
        capture_output=True,
        text=True,
        check=False,
    )
    with mounted(source_of(endpoint, bucket), work / f"chk-{bucket}", state, "--read-only") as _:
        try:
            stored = zarr.open_array(str(work / f"chk-{bucket}" / "arr"), mode="r")[...]
        except OSError:  # damaged bytes in the bucket: a checked read refuses them
            stored = None
    return {
        "failed": failed,
        "read": "equal" if read_ok else "WRONG/failed",
        "stored": "exact"
        if stored is not None and np.array_equal(stored, values) and check.returncode == 0
        else f"BAD (validate exit {check.returncode}{', unreadable' if stored is None else ''})",
        "write_s": wrote,
        "read_s": read,
        "injected": injected,
        "requests": counts,
    }


def one_bad_key(endpoint: str, work: Path) -> tuple[int, int]:
    bucket = new_bucket(endpoint)
    with fault_proxy(endpoint) as proxy:
        mp = work / f"mnt-{bucket}"
        with mounted(source_of(proxy.endpoint, bucket), mp, work / f"state-{bucket}"):
            proxy.inject(Fault("reset_before", method="PUT", key="cursed"))
            bad = 0
            try:
                (mp / "cursed.bin").write_bytes(b"x")
            except OSError:
                bad = 1
            others = sum(not _wrote(mp / f"ok{i}.bin") for i in range(16))
    return bad, others


def _wrote(path: Path) -> bool:
    try:
        path.write_bytes(b"y")
    except OSError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=512)
    parser.add_argument("--latency", type=float, default=0.0, help="one-way delay, seconds")
    args = parser.parse_args()
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="n5fs-net-") as tmp:
        work = Path(tmp)
        results = {
            name: array_run(endpoint, work, name, args.chunks, args.latency) for name in MIXES
        }
        bad, others = one_bad_key(endpoint, work)
    base = results["no faults"]["write_s"]
    print(f"zarr-python 3, {args.chunks} chunks from 8 threads, then TensorStore reading back")
    print(
        "| faults | failed writes | read back | bucket | write s (x no faults) | read s | injected | requests |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        reqs = ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items()))
        print(
            f"| {name} | {r['failed']} of 8 | {r['read']} | {r['stored']} | "
            f"{r['write_s']:.1f} ({r['write_s'] / base:.2f}x) | {r['read_s']:.1f} | "
            f"{r['injected']} | {reqs} |"
        )
    print(
        f"one key whose every PUT resets: its write failed {bad} of 1; 16 writes right after: {others} failed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
