"""S3 under latency: n5fs read-only and read-write mounts against rclone mount and s3fs-fuse,
each reached through :mod:`n5fs.testing.s3_proxy` in front of a moto server on 127.0.0.1, at
0 and 25 ms one way (50 ms a round trip, a client in one region reading a bucket in another);
prints the seconds, the requests by kind (as the proxy counted them) and each time against
the best peer's.

Workloads, each on a fresh mount (the systems take turns, so none is measured on a warmer
server than the others):

- ``cat 4 MiB blocks``: ``cat`` of ``--blocks`` objects of 4 MiB, one after the other;
- ``find | xargs cat``: every file of a Zarr v2 array of ``--folders`` x ``--per-folder``
  small chunks (1 KiB, ``dimension_separator`` "/": one folder per row of chunks), in the
  order ``find`` lists them (per folder in listing order, folders in listing order: 0, 1, 10,
  11, ...);
- ``grid order``: the same chunks read by Python in chunk-index order along the fastest axis
  (0/0, 0/1, 0/2, ... 0/19, 1/0, ...), as a reader of the array asks them;
- ``find`` and ``ls -lR`` of the array.

Every mount is new, so no page of it is cached (there is no local backing file whose pages
``posix_fadvise`` would drop); the proxy's counters are reset once the mount answers its
root, so the mount's own first requests are not counted. A peer that is not installed is
left out with a note (rclone and s3fs from the distribution's packages are enough).
Moto's speed is not S3's: read the times as ratios between the systems of one run, and the
request counts as they are.

    python scripts/bench_s3.py                 # 0 and 25 ms, every system, 2,000 chunks
    python scripts/bench_s3.py --quick         # n5fs ro only, 1,000 chunks, 8 blocks (< 3 min)
    python scripts/bench_s3.py --latency 0.025 --systems n5fs-ro,rclone
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script: find siblings
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import Mounts, Variant, n5fs_variant, rclone_variant, s3fs_variant
from bench_workloads import AWS_ENV, BenchError, s3_client

from n5fs.testing.moto_server import moto_server
from n5fs.testing.s3_proxy import fault_proxy

if TYPE_CHECKING:
    from collections.abc import Callable

MiB = 1 << 20
CHUNK = 256  # uint32 values per chunk: 1 KiB objects
SYSTEMS = ("n5fs-ro", "n5fs-rw", "rclone", "s3fs")
PEERS = ("rclone", "s3fs")
WATCHDOG = 900.0


@dataclass(frozen=True)
class Data:
    """What the bucket holds and what a correct read of it sees."""

    blocks: list[str]  # 4 MiB objects, in order
    block_bytes: int
    chunks: list[str]  # the array's chunk keys in grid order (row, then column)
    chunk_bytes: int
    zarr_files: int  # chunks + .zarray
    zarr_bytes: int
    zarr_entries: int  # lines of `find zarr`


def upload(client: object, bucket: str, blocks: int, folders: int, per_folder: int) -> Data:
    """4 MiB blocks under ``seq/`` and a Zarr v2 array under ``zarr/``."""
    put = client.put_object  # type: ignore[attr-defined]
    meta = {
        "zarr_format": 2,
        "shape": [folders, per_folder * CHUNK],
        "chunks": [1, CHUNK],
        "dtype": "<u4",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
        "dimension_separator": "/",
    }
    zarray = json.dumps(meta).encode()
    objects: dict[str, bytes] = {"zarr/.zarray": zarray}
    blocks_keys = [f"seq/b{i:03d}" for i in range(blocks)]
    for key in blocks_keys:
        objects[key] = os.urandom(4 * MiB)
    chunks = [f"zarr/{i}/{j}" for i in range(folders) for j in range(per_folder)]
    for n, key in enumerate(chunks):
        objects[key] = n.to_bytes(4, "little") * CHUNK
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: put(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()))
    print(f"uploaded {len(objects)} objects in {time.perf_counter() - start:.0f} s", flush=True)
    return Data(
        blocks_keys,
        blocks * 4 * MiB,
        chunks,
        len(chunks) * CHUNK * 4,
        len(chunks) + 1,
        len(chunks) * CHUNK * 4 + len(zarray),
        1 + 1 + folders + len(chunks),  # zarr, .zarray, the folders, the chunks
    )


# == workloads =====================================================================================


def shell(command: str, cwd: Path) -> str:
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], cwd=cwd, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"{command!r} exited {proc.returncode}: {proc.stderr[-300:]!r}")
    return proc.stdout.decode().strip()


def cat_blocks(root: Path, data: Data) -> None:
    got = int(shell("cat " + " ".join(data.blocks) + " | wc -c", root))
    if got != data.block_bytes:
        raise BenchError(f"cat read {got} bytes of {data.block_bytes}")


def find_cat(root: Path, data: Data) -> None:
    got = int(shell("find zarr -type f -print0 | xargs -0 cat | wc -c", root))
    if got != data.zarr_bytes:
        raise BenchError(f"find | xargs cat read {got} bytes of {data.zarr_bytes}")


def grid_order(root: Path, data: Data) -> None:
    got = 0
    for key in data.chunks:
        with open(root / key, "rb", buffering=0) as f:
            got += len(f.read())
    if got != data.chunk_bytes:
        raise BenchError(f"the grid-order read saw {got} bytes of {data.chunk_bytes}")


def find(root: Path, data: Data) -> None:
    got = int(shell("find zarr | wc -l", root))
    if got != data.zarr_entries:
        raise BenchError(f"find printed {got} lines, not {data.zarr_entries}")


def ls_lr(root: Path, data: Data) -> None:
    shell("ls -lR zarr | wc -l", root)


WORKLOADS: dict[str, Callable[[Path, Data], None]] = {
    "cat 4 MiB blocks": cat_blocks,
    "find | xargs cat": find_cat,
    "grid order": grid_order,
    "find": find,
    "ls -lR": ls_lr,
}


# == runs ==========================================================================================


@dataclass
class Cell:
    seconds: float | None = None
    requests: dict[str, int] = field(default_factory=dict)
    error: str = ""


def variants(names: list[str], source: str, bucket: str, endpoint: str) -> list[Variant]:
    out = []
    for name in names:
        if name == "n5fs-ro":
            out.append(n5fs_variant(name, source, "--read-only"))
        elif name == "n5fs-rw":
            out.append(n5fs_variant(name, source))
        elif name == "rclone":
            out.append(rclone_variant("s3", bucket, endpoint))
        elif name == "s3fs":
            out.append(s3fs_variant("s3", bucket, endpoint))
    return out


def measure(
    mounts: Mounts, variant: Variant, proxy: object, work: Callable[[Path, Data], None], data: Data
) -> Cell:
    try:
        mount = mounts.start(variant)
    except BenchError as exc:
        return Cell(error=str(exc).splitlines()[0][:80])
    try:
        proxy.reset_counts()  # type: ignore[attr-defined]
        start = time.perf_counter()
        with mounts.guard(f"{variant.name}", WATCHDOG):
            work(mount.path, data)
        seconds = time.perf_counter() - start
        return Cell(seconds, dict(proxy.counts))  # type: ignore[attr-defined]
    except (BenchError, OSError) as exc:
        return Cell(error=str(exc).splitlines()[0][:80])
    finally:
        mounts.stop(mount)


def run(args: argparse.Namespace, tmp: Path) -> dict[float, dict[str, dict[str, Cell]]]:
    results: dict[float, dict[str, dict[str, Cell]]] = {}
    env = {**os.environ, **AWS_ENV, "N5FS_STATE_DIR": str(tmp / "state")}
    mounts = Mounts(tmp, env)
    try:
        with moto_server() as upstream:
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            client = s3_client(upstream)
            client.create_bucket(Bucket=bucket)
            data = upload(client, bucket, args.blocks, args.folders, args.per_folder)
            with fault_proxy(upstream) as proxy:
                source = json.dumps({"driver": "s3", "bucket": bucket, "path": "",
                                     "endpoint": proxy.endpoint, "aws_region": "us-east-1"})  # fmt: skip
                systems = variants(args.systems, source, bucket, proxy.endpoint)
                for v in systems:
                    if v.missing:
                        print(f"{v.name}: left out ({v.note})")
                    elif v.note:
                        print(f"{v.name}: {v.note}")
                systems = [v for v in systems if not v.missing]
                for latency in args.latency:
                    proxy.latency = latency
                    table = results[latency] = {}
                    for name, work in WORKLOADS.items():
                        if name not in args.workloads:
                            continue
                        row = table[name] = {}
                        for variant in systems:  # the systems take turns
                            cell = measure(mounts, variant, proxy, work, data)
                            row[variant.name] = cell
                            took = f"{cell.seconds:.1f} s" if cell.seconds else cell.error
                            print(f"  {latency * 1000:g} ms  {name:<18} {variant.name:<8} {took}",
                                  flush=True)  # fmt: skip
    finally:
        mounts.cleanup()
    return results


def requests(counts: dict[str, int]) -> str:
    order = ("LIST", "GET", "GET range", "HEAD", "PUT", "DELETE")
    kinds = sorted(counts, key=lambda k: (order.index(k) if k in order else len(order), k))
    return ", ".join(f"{k} {counts[k]}" for k in kinds if counts[k]) or "-"


def report(results: dict[float, dict[str, dict[str, Cell]]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.blocks} blocks of 4 MiB; Zarr v2 {args.folders * args.per_folder} chunks of "
        f"1 KiB in {args.folders} folders; x best = seconds / the best peer's (rclone, s3fs)"
    )
    for latency, table in results.items():
        print(f"\n### {latency * 1000:g} ms one way\n")
        print("| workload | system | seconds | x best | requests |")
        print("| --- | --- | ---: | ---: | --- |")
        for label, row in table.items():
            name = label.replace("|", "\\|")
            peers = [c.seconds for s, c in row.items() if s in PEERS and c.seconds]
            best = min(peers) if peers else None
            for system, cell in row.items():
                if cell.seconds is None:
                    print(f"| {name} | {system} | failed: {cell.error} | | |")
                    continue
                ratio = f"{cell.seconds / best:.2f}" if best else "-"
                print(f"| {name} | {system} | {cell.seconds:.2f} | {ratio} | "
                      f"{requests(cell.requests)} |")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="n5fs ro only, 8 blocks, 1,000 chunks: under three minutes")  # fmt: skip
    p.add_argument("--latency", type=float, action="append", help="one way, seconds (repeat)")
    p.add_argument("--systems", default=None, help=f"comma-separated of {','.join(SYSTEMS)}")
    p.add_argument("--workloads", default=None,
                   help=f"comma-separated of: {'; '.join(WORKLOADS)}")  # fmt: skip
    p.add_argument("--blocks", type=int, default=None, help="4 MiB objects (32; quick 8)")
    p.add_argument("--folders", type=int, default=100)
    p.add_argument("--per-folder", type=int, default=None, help="chunks a folder (20; quick 10)")
    p.add_argument("--tmp", default=None, help="where mount points go (default: $TMPDIR)")
    args = p.parse_args(argv)
    args.latency = args.latency or [0.0, 0.025]
    default = "n5fs-ro" if args.quick else ",".join(SYSTEMS)
    args.systems = (args.systems or default).split(",")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}")
    args.workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    args.blocks = args.blocks or (8 if args.quick else 32)
    args.per_folder = args.per_folder or (10 if args.quick else 20)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-s3-", dir=args.tmp))
    try:
        report(run(args, tmp), args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
