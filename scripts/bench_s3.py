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
- ``find`` and ``ls -lR`` of the array;
- ``stat storm``: ``os.stat`` of ``--storm`` chunk names (2,000), one after the other, in
  array folders where half of them exist: each folder's stored chunks and as many names
  past its last one, shuffled (a reader probing which chunks are written);
- ``TensorStore n5 ...``: TensorStore's ``n5`` driver on a ``file`` kvstore at the mount
  reads a whole N5 dataset that TensorStore wrote into the bucket (``--ts-mib`` MiB of
  uint16 in 64^3 blocks, raw; and an eighth of that in 16^3 blocks, 8 KiB each), against
  TensorStore's own ``s3`` kvstore through the same proxy (the ``ts-s3`` column, the
  reference of these rows). TensorStore's default context: its file and S3 request
  concurrency, no cache pool;
- ``cp -r into rw``: ``cp -r`` of a local copy of the Zarr array into a fresh prefix of a
  read-write mount (n5fs rw, and rclone with ``--vfs-cache-mode writes``, its cache under the
  run's temporary directory): the seconds until ``cp`` returns, and until every object is in
  the bucket (listed on the moto server itself, past the proxy, every 0.25 s). Options for
  the n5fs mounts (``--n5fs-option writeback=on``) go to ``n5fs mount -o``.

Every mount is new, so no page of it is cached (there is no local backing file whose pages
``posix_fadvise`` would drop); the proxy's counters are reset once the mount answers its
root, so the mount's own first requests are not counted. A peer that is not installed is
left out with a note (rclone and s3fs from the distribution's packages are enough).
Moto's speed is not S3's: read the times as ratios between the systems of one run, and the
request counts as they are.

    python scripts/bench_s3.py                 # 0 and 25 ms, every system, 5,000 chunks
    python scripts/bench_s3.py --quick         # n5fs ro and ts-s3, 1,000 chunks, 8 blocks
    python scripts/bench_s3.py --latency 0.025 --systems n5fs-ro,rclone
    python scripts/bench_s3.py --workloads "cp -r into rw" --n5fs-option writeback=on
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
SYSTEMS = ("n5fs-ro", "n5fs-rw", "rclone", "s3fs", "ts-s3")
PEERS = ("rclone", "s3fs")
WATCHDOG = 900.0
SETTLE_TIMEOUT = 900.0  # after cp returns, for the last object to reach the bucket
TS_BLOCK, TS_SMALL = 64, 16  # the N5 datasets' block sides


@dataclass(frozen=True)
class TsSet:
    """An N5 dataset TensorStore wrote into the bucket under ``prefix``."""

    prefix: str
    shape: tuple[int, int, int]
    block: int
    total: int  # the sum of its values


@dataclass(frozen=True)
class Data:
    """What the bucket holds and what a correct read of it sees."""

    bucket: str
    upstream: str  # moto itself, past the proxy
    proxy: str  # the proxy's endpoint
    blocks: list[str]  # 4 MiB objects, in order
    block_bytes: int
    chunks: list[str]  # the array's chunk keys in grid order (row, then column)
    chunk_bytes: int
    zarr_files: int  # chunks + .zarray
    zarr_bytes: int
    zarr_entries: int  # lines of `find zarr`
    storm: list[str]  # the stat storm's names, in the order asked
    storm_present: int
    ts: dict[str, TsSet]
    local_zarr: Path  # a local copy of the array, for cp -r


def upload(
    client: object, bucket: str, blocks: int, folders: int, per_folder: int
) -> dict[str, Any]:
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
    return {
        "blocks": blocks_keys,
        "block_bytes": blocks * 4 * MiB,
        "chunks": chunks,
        "chunk_bytes": len(chunks) * CHUNK * 4,
        "zarr_files": len(chunks) + 1,
        "zarr_bytes": len(chunks) * CHUNK * 4 + len(zarray),
        "zarr_entries": 1 + 1 + folders + len(chunks),  # zarr, .zarray, the folders, the chunks
        "objects": {k: v for k, v in objects.items() if k.startswith("zarr/")},
    }


def storm_names(folders: int, per_folder: int, count: int) -> tuple[list[str], int]:
    """``count`` names in array folders, half of them stored: per folder its ``per_folder``
    chunks and as many names past them, shuffled; folders spread over the array."""
    per = 2 * per_folder
    used = max(1, min(folders, -(-count // per)))
    step = max(1, folders // used)
    rng = random.Random(7)
    names: list[str] = []
    present = 0
    for row in range(0, step * used, step):
        here = [f"zarr/{row}/{j}" for j in range(per)]
        rng.shuffle(here)
        take = here[: count - len(names)]
        present += sum(int(name.rsplit("/", 1)[1]) < per_folder for name in take)
        names += take
        if len(names) >= count:
            break
    return names, present


def write_ts(upstream: str, bucket: str, mib: int) -> dict[str, TsSet]:
    """Two N5 datasets written by TensorStore through its s3 kvstore (on moto, no proxy):
    ``mib`` MiB of uint16 in 64^3 blocks, raw, and an eighth of that in 16^3 blocks."""
    import numpy as np
    import tensorstore as ts

    sets = {}
    start = time.perf_counter()
    for label, block, nbytes in (
        ("raw 64^3", TS_BLOCK, mib * MiB),
        ("16^3", TS_SMALL, mib * MiB // 8),
    ):
        values = nbytes // 2
        side = block
        shape = [block, block, block]
        axis = 2
        while shape[0] * shape[1] * shape[2] < values:
            shape[axis] *= 2
            axis = (axis - 1) % 3
        prefix = f"ts/b{block}/"
        spec = {
            "driver": "n5",
            "kvstore": {"driver": "s3", "bucket": bucket, "path": prefix, "endpoint": upstream,
                        "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}},
            "metadata": {"dimensions": shape, "blockSize": [side] * 3, "dataType": "uint16",
                         "compression": {"type": "raw"}},
        }  # fmt: skip
        array = ts.open(spec, create=True, context=ts.Context()).result()
        rng = np.random.default_rng(11)
        data = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
        array.write(data).result()
        sets[label] = TsSet(
            prefix, (shape[0], shape[1], shape[2]), side, int(data.sum(dtype=np.uint64))
        )
    print(f"TensorStore wrote its N5 datasets in {time.perf_counter() - start:.0f} s", flush=True)
    return sets


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


def stat_storm(root: Path, data: Data) -> None:
    found = 0
    for name in data.storm:
        try:
            os.stat(root / name)
        except FileNotFoundError:
            continue
        found += 1
    if found != data.storm_present:
        raise BenchError(f"the stat storm found {found} of {data.storm_present} names")


def ts_read(kvstore: dict[str, Any], dataset: TsSet) -> None:
    """TensorStore opens the dataset and reads all of it (its default context, fresh)."""
    import numpy as np
    import tensorstore as ts

    array = ts.open({"driver": "n5", "kvstore": kvstore}, read=True, context=ts.Context())
    total = int(array.result().read().result().sum(dtype=np.uint64))
    if total != dataset.total:
        raise BenchError(f"TensorStore read a sum of {total}, not {dataset.total}")


def ts_mount(label: str) -> Callable[[Path, Data], None]:
    def run(root: Path, data: Data) -> None:
        dataset = data.ts[label]
        ts_read({"driver": "file", "path": str(root / dataset.prefix)}, dataset)

    return run


def ts_native(label: str) -> Callable[[Data], None]:
    def run(data: Data) -> None:
        dataset = data.ts[label]
        kvstore = {"driver": "s3", "bucket": data.bucket, "path": dataset.prefix,
                   "endpoint": data.proxy, "aws_region": "us-east-1",
                   "aws_credentials": {"type": "environment"}}  # fmt: skip
        ts_read(kvstore, dataset)

    return run


def copy_in(root: Path, data: Data) -> tuple[float, float]:
    """``cp -r`` of the local array into a fresh prefix: the seconds until ``cp`` returns,
    and until every object is in the bucket."""
    start = time.perf_counter()
    prefix = f"copy-{uuid.uuid4().hex[:8]}"
    (root / prefix).mkdir()
    shell(f"cp -r {data.local_zarr} {prefix}/", root)
    returned = time.perf_counter() - start
    print(f"    cp returned after {returned:.1f} s", flush=True)
    client = s3_client(data.upstream)
    pages = client.get_paginator("list_objects_v2")
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        held = sum(
            len(page.get("Contents", []))
            for page in pages.paginate(Bucket=data.bucket, Prefix=f"{prefix}/zarr/")
        )
        if held >= data.zarr_files:
            return returned, time.perf_counter() - start
        if time.monotonic() > deadline:
            raise BenchError(f"{held} of {data.zarr_files} objects in the bucket after cp")
        time.sleep(0.25)


@dataclass(frozen=True)
class Workload:
    """A row: what runs on a mount (``run``; a pair it returns is the seconds of the call and
    those until its work settled, instead of the call's own), on which systems, against
    which."""

    run: Callable[[Path, Data], tuple[float, float] | None]
    systems: tuple[str, ...] = ("n5fs-ro", "n5fs-rw", "rclone", "s3fs")
    direct: Callable[[Data], None] | None = None  # the ts-s3 column
    reference: tuple[str, ...] = PEERS
    writes: bool = False  # rclone mounted read-write with --vfs-cache-mode writes


TS_LABELS = ("raw 64^3", "16^3")
WORKLOADS: dict[str, Workload] = {
    "cat 4 MiB blocks": Workload(cat_blocks),
    "find | xargs cat": Workload(find_cat),
    "grid order": Workload(grid_order),
    "find": Workload(find),
    "ls -lR": Workload(ls_lr),
    "stat storm": Workload(stat_storm),
    **{
        f"TensorStore n5 {label}": Workload(
            ts_mount(label),
            systems=("n5fs-ro", "n5fs-rw", "rclone", "s3fs", "ts-s3"),
            direct=ts_native(label),
            reference=("ts-s3",),
        )
        for label in TS_LABELS
    },
    "cp -r into rw": Workload(copy_in, systems=("n5fs-rw", "rclone"), writes=True),
}


# == runs ==========================================================================================


@dataclass
class Cell:
    seconds: float | None = None
    requests: dict[str, int] = field(default_factory=dict)
    error: str = ""
    settled: float | None = None  # cp -r: until the last object is in the bucket


def variants(args: argparse.Namespace, source: str, bucket: str, endpoint: str,
             tmp: Path) -> dict[str, Variant]:  # fmt: skip
    """The mounts by system name; ``rclone-w`` is rclone's read-write one for writes."""
    extra = [arg for opt in args.n5fs_option for arg in ("-o", opt)]
    out: dict[str, Variant] = {}
    for name in args.systems:
        if name == "n5fs-ro":
            out[name] = n5fs_variant(name, source, "--read-only", *extra)
        elif name == "n5fs-rw":
            out[name] = n5fs_variant(name, source, *extra)
        elif name == "rclone":
            out[name] = rclone_variant("s3", bucket, endpoint)
            out["rclone-w"] = rclone_writes(out[name], tmp)
        elif name == "s3fs":
            out[name] = s3fs_variant("s3", bucket, endpoint)
        elif name == "ts-s3":
            out[name] = Variant(name)
    return out


def rclone_writes(ro: Variant, tmp: Path) -> Variant:
    """rclone mounted read-write, writes through its disk cache (``--vfs-cache-mode
    writes``: its default delay of 5 s before a written file is uploaded, 4 transfers)."""
    if ro.argv is None:
        return ro
    argv = ro.argv

    def mount(mp: Path) -> list[str]:
        out = argv(mp)
        out.remove("--read-only")
        at = out.index("--vfs-cache-mode")
        out[at + 1] = "writes"
        return [*out, "--cache-dir", str(tmp / f"rclone-cache-{mp.name}")]

    return Variant("rclone", mount, note=ro.note, env=ro.env)


def measure(mounts: Mounts, variant: Variant, proxy: object, work: Workload, data: Data) -> Cell:
    if variant.argv is None:  # TensorStore's own s3 kvstore, no mount
        assert work.direct is not None
        proxy.reset_counts()  # type: ignore[attr-defined]
        start = time.perf_counter()
        try:
            work.direct(data)
        except (BenchError, ValueError) as exc:
            return Cell(error=str(exc).splitlines()[0][:80])
        return Cell(time.perf_counter() - start, dict(proxy.counts))  # type: ignore[attr-defined]
    try:
        mount = mounts.start(variant)
    except BenchError as exc:
        return Cell(error=str(exc).splitlines()[0][:80])
    try:
        proxy.reset_counts()  # type: ignore[attr-defined]
        start = time.perf_counter()
        with mounts.guard(f"{variant.name}", WATCHDOG + (SETTLE_TIMEOUT if work.writes else 0)):
            times = work.run(mount.path, data)
        seconds, settled = times or (time.perf_counter() - start, None)
        return Cell(seconds, dict(proxy.counts), settled=settled)  # type: ignore[attr-defined]
    except (BenchError, OSError, ValueError) as exc:
        if mounts.fired:
            return Cell(error=f"> {WATCHDOG:g} s (the watchdog stopped it)")
        return Cell(error=str(exc).splitlines()[0][:80])
    finally:
        mounts.stop(mount)


def run(args: argparse.Namespace, tmp: Path) -> dict[float, dict[str, dict[str, Cell]]]:
    results: dict[float, dict[str, dict[str, Cell]]] = {}
    os.environ.update(AWS_ENV)  # TensorStore's s3 kvstore takes its credentials from there
    env = {**os.environ, "N5FS_STATE_DIR": str(tmp / "state")}
    mounts = Mounts(tmp, env)
    try:
        with moto_server() as upstream:
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            client = s3_client(upstream)
            client.create_bucket(Bucket=bucket)
            made = upload(client, bucket, args.blocks, args.folders, args.per_folder)
            local = tmp / "local" / "zarr"
            for key, body in made.pop("objects").items():
                path = tmp / "local" / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
            storm, present = storm_names(args.folders, args.per_folder, args.storm)
            wanted = [WORKLOADS[name] for name in args.workloads]
            sets = write_ts(upstream, bucket, args.ts_mib) if any(w.direct for w in wanted) else {}
            with fault_proxy(upstream) as proxy:
                data = Data(bucket, upstream, proxy.endpoint, storm=storm, storm_present=present,
                            ts=sets, local_zarr=local, **made)  # fmt: skip
                source = json.dumps({"driver": "s3", "bucket": bucket, "path": "",
                                     "endpoint": proxy.endpoint, "aws_region": "us-east-1"})  # fmt: skip
                systems = variants(args, source, bucket, proxy.endpoint, tmp)
                for name, v in systems.items():
                    if v.missing:
                        print(f"{name}: left out ({v.note})")
                    elif v.note and name in args.systems:
                        print(f"{name}: {v.note}")
                for latency in args.latency:
                    proxy.latency = latency
                    table = results[latency] = {}
                    for name in args.workloads:
                        work = WORKLOADS[name]
                        row = table[name] = {}
                        for system in args.systems:  # the systems take turns
                            if system not in work.systems:
                                continue
                            variant = systems[system]
                            if work.writes and system == "rclone":
                                variant = systems["rclone-w"]
                            if variant.missing:
                                continue
                            cell = measure(mounts, variant, proxy, work, data)
                            row[system] = cell
                            took = f"{cell.seconds:.1f} s" if cell.seconds else cell.error
                            if cell.settled is not None:
                                took += f", in the bucket after {cell.settled:.1f} s"
                            print(f"  {latency * 1000:g} ms  {name:<22} {system:<8} {took}  "
                                  f"{requests(cell.requests)}", flush=True)  # fmt: skip
    finally:
        mounts.cleanup()
    return results


def requests(counts: dict[str, int]) -> str:
    order = ("LIST", "GET", "GET range", "HEAD", "PUT", "DELETE")
    kinds = sorted(counts, key=lambda k: (order.index(k) if k in order else len(order), k))
    return ", ".join(f"{k} {counts[k]:,}" for k in kinds if counts[k]) or "-"


def report(results: dict[float, dict[str, dict[str, Cell]]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.blocks} blocks of 4 MiB; Zarr v2 {args.folders * args.per_folder:,} chunks of "
        f"1 KiB in {args.folders} folders; stat storm {args.storm:,} names (half absent); "
        f"TensorStore N5 {args.ts_mib} MiB in {TS_BLOCK}^3 blocks, {args.ts_mib / 8:g} MiB in "
        f"{TS_SMALL}^3; x best = seconds / the best peer's (rclone, s3fs; TensorStore rows: "
        "ts-s3, its own s3 kvstore; cp -r: until every object is in the bucket)"
    )
    if args.n5fs_option:
        print(f"n5fs mounted with -o {','.join(args.n5fs_option)}")
    for latency, table in results.items():
        print(f"\n### {latency * 1000:g} ms one way\n")
        print("| workload | system | seconds | x best | requests |")
        print("| --- | --- | ---: | ---: | --- |")
        for label, row in table.items():
            name = label.replace("|", "\\|")
            work = WORKLOADS[label]

            def took(cell: Cell) -> float | None:
                return cell.settled if cell.settled is not None else cell.seconds

            refs = [took(c) for s, c in row.items() if s in work.reference and took(c)]
            best = min(refs) if refs else None  # type: ignore[type-var]
            for system, cell in row.items():
                seconds = took(cell)
                if seconds is None or cell.seconds is None:
                    print(f"| {name} | {system} | failed: {cell.error} | | |")
                    continue
                shown = f"{cell.seconds:.2f}"
                if cell.settled is not None:
                    shown = f"cp {cell.seconds:.2f}, bucket {cell.settled:.2f}"
                ratio = f"{seconds / best:.2f}" if best else "-"
                print(f"| {name} | {system} | {shown} | {ratio} | {requests(cell.requests)} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="n5fs ro and ts-s3 only, 8 blocks, 1,000 chunks, 16 MiB for TensorStore")  # fmt: skip
    p.add_argument("--latency", type=float, action="append", help="one way, seconds (repeat)")
    p.add_argument("--systems", default=None, help=f"comma-separated of {','.join(SYSTEMS)}")
    p.add_argument("--workloads", default=None,
                   help=f"comma-separated of: {'; '.join(WORKLOADS)}")  # fmt: skip
    p.add_argument("--blocks", type=int, default=None, help="4 MiB objects (32; quick 8)")
    p.add_argument("--folders", type=int, default=100)
    p.add_argument("--per-folder", type=int, default=None, help="chunks a folder (50; quick 10)")
    p.add_argument("--storm", type=int, default=2000, help="names the stat storm asks")
    p.add_argument("--ts-mib", type=int, default=None,
                   help="MiB of the TensorStore dataset in 64^3 blocks (64; quick 16)")  # fmt: skip
    p.add_argument("--n5fs-option", action="append", default=[],
                   help="an option for the n5fs mounts (-o), e.g. writeback=on (repeat)")  # fmt: skip
    p.add_argument("--tmp", default=None, help="where mount points go (default: $TMPDIR)")
    args = p.parse_args(argv)
    args.latency = args.latency or [0.0, 0.025]
    default = "n5fs-ro,ts-s3" if args.quick else ",".join(SYSTEMS)
    args.systems = (args.systems or default).split(",")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}")
    args.workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}")
    args.blocks = args.blocks or (8 if args.quick else 32)
    args.per_folder = args.per_folder or (10 if args.quick else 50)
    args.ts_mib = args.ts_mib or (16 if args.quick else 64)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-s3-", dir=args.tmp)).resolve()
    os.chdir(tmp)  # ``python -m n5fs`` must not find a checkout in the working directory
    try:
        report(run(args, tmp), args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
