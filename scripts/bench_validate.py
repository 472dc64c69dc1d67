"""Validation throughput: per chunk against bare decoding, and whole stores against TensorStore.

Per chunk (the default): ``Zarr2ArrayNode.validate_chunk`` (grid check, bounded decode, exact
size check) should cost at most ~1.2x a bare ``codec.decode``. Both run in this process on the
same chunks; the table reports the best of several rounds, so the ratio is what matters.

Whole store (``--store``): ``n5fs validate`` over a >= 1 GiB N5 dataset (gzip, 128^3 uint16
blocks) and a 50k-chunk Zarr v2 array (16x16 uint16, zstd), both written by TensorStore into a
temp dir, on the file store and on S3 (a moto server this script starts on 127.0.0.1, port 0,
and stops at the end), against TensorStore reading the same arrays through its own file / s3
kvstore in the same run. The temp dir is removed at the end.

    python scripts/bench_validate.py [--side 64] [--chunks 8] [--rounds 7]
    python scripts/bench_validate.py --store [--n5-gib 1] [--zarr-chunks 50000] [--jobs N]
    python scripts/bench_validate.py --store --quick      # small smoke run
    python scripts/bench_validate.py --store --stores file  # no moto server, no upload

A million small chunks (``--million``): ``n5fs validate`` from the command line over a Zarr v2
array of one-byte chunks on the file store (``--layout nested``: a folder per row, ``flat``:
one folder), this checkout against another (``--against DIR``, e.g. a checkout of main), the
two taking turns each round, each in a fresh interpreter run from a temp dir with
``PYTHONPATH`` naming its checkout. Reported: chunks/s, and peak RSS of the validate process
alone and of it with its worker processes (sampled, summed). The tree is made in a temp dir
and removed at the end; ``--tree DIR`` makes it there once and keeps it (a million files take
a minute to write). The page cache is warm after the first run: the figures are warm.

    python scripts/bench_validate.py --million [1000000] [--layout nested,flat]
        [--against /path/to/main] [--tree DIR] [--rounds 2]
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
from dataclasses import dataclass
from math import isqrt, prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import numcodecs
import numpy as np
import tensorstore as ts
from botocore.config import Config

from n5fs.detect import open_source
from n5fs.formats.zarr2 import Zarr2ArrayNode, Zarr2Format
from n5fs.testing.moto_server import moto_server
from n5fs.validate import validate_store

if TYPE_CHECKING:
    from collections.abc import Callable

CODECS = {
    "gzip(5)": {"id": "gzip", "level": 5},
    "zlib(5)": {"id": "zlib", "level": 5},
    "blosc(lz4,shuffle)": {
        "id": "blosc",
        "cname": "lz4",
        "clevel": 5,
        "shuffle": 1,
        "blocksize": 0,
    },
    "blosc(zstd,bitshuffle)": {
        "id": "blosc",
        "cname": "zstd",
        "clevel": 3,
        "shuffle": 2,
        "blocksize": 0,
    },
    "zstd(3)": {"id": "zstd", "level": 3},
}


def realistic_chunk(side: int, seed: int) -> np.ndarray[Any, Any]:
    """Smooth structure plus Poisson noise: what a microscope volume chunk looks like."""
    rng = np.random.default_rng(seed)
    z, y, x = np.meshgrid(*(np.linspace(0, 6, side),) * 3, indexing="ij")
    base = 800 + 600 * np.sin(x + seed) * np.cos(y) + 300 * np.sin(z * 1.7)
    return np.asarray(rng.poisson(np.clip(base, 10, None)), dtype="<u2")


def best(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_chunks(args: argparse.Namespace) -> None:
    side, rounds = args.side, args.rounds or 7
    chunks = [realistic_chunk(side, seed) for seed in range(args.chunks)]
    raw_mib = sum(c.nbytes for c in chunks) / 2**20
    print(
        f"{args.chunks} chunks of {side}^3 <u2 ({raw_mib:.1f} MiB decoded), "
        f"best of {rounds} rounds\n"
    )
    print(
        f"{'codec':<24}{'ratio':>7}{'decode MB/s':>13}{'validate MB/s':>15}{'validate/decode':>17}"
    )
    for name, config in CODECS.items():
        doc = {
            "zarr_format": 2,
            "shape": [side * args.chunks, side, side],
            "chunks": [side] * 3,
            "dtype": "<u2",
            "compressor": config,
            "fill_value": 0,
            "order": "C",
            "filters": None,
        }
        node = Zarr2Format().parse_metadata(".zarray", json.dumps(doc).encode())
        assert isinstance(node, Zarr2ArrayNode)
        blobs = [node.encode_chunk((i, 0, 0), c) for i, c in enumerate(chunks)]
        codec = numcodecs.get_codec(dict(config))

        def decode(blobs: list[bytes] = blobs, codec: object = codec) -> None:
            for blob in blobs:
                codec.decode(blob)  # type: ignore[attr-defined]

        def validate(blobs: list[bytes] = blobs, node: Zarr2ArrayNode = node) -> None:
            for i, blob in enumerate(blobs):
                node.validate_chunk((i, 0, 0), blob)

        validate()  # warm up and prove every chunk is valid
        t_decode, t_validate = best(decode, rounds), best(validate, rounds)
        ratio = sum(c.nbytes for c in chunks) / sum(len(b) for b in blobs)
        print(
            f"{name:<24}{ratio:>7.2f}{raw_mib * 1.048576 / t_decode:>13.0f}"
            f"{raw_mib * 1.048576 / t_validate:>15.0f}{t_validate / t_decode:>16.2f}x"
        )


# -- whole store: n5fs validate against a TensorStore read of the same arrays -----------------

N5_BLOCK = 128
ZARR_SIDE = 16
METADATA = frozenset({"attributes.json", ".zarray", ".zattrs", ".zgroup", "zarr.json"})
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass(frozen=True)
class Dataset:
    """One array TensorStore wrote: ``folder`` under the data root, and in the bucket."""

    label: str
    folder: str
    driver: str
    chunks: int
    stored: int
    decoded: int


@dataclass(frozen=True)
class Row:
    dataset: Dataset
    store: str
    jobs: int
    n5fs: float
    listing: float
    cli: float
    tensorstore: float


def smooth_poisson(
    shape: tuple[int, ...], origin: tuple[int, ...], seed: int
) -> np.ndarray[Any, Any]:
    """Structure that is smooth across the whole array plus Poisson noise, like a microscope
    image: it compresses about as well as real data (a ramp or zeros would flatter gzip)."""
    grids = np.ix_(*(np.arange(o, o + n) / 37.0 for o, n in zip(origin, shape, strict=True)))
    base = 800.0 + 400.0 * np.sin(grids[-1]) * np.cos(grids[-2] * 0.6)
    base = base + sum(250.0 * np.sin(g * (0.3 + 0.2 * k)) for k, g in enumerate(grids[:-2]))
    rng = np.random.default_rng(seed)
    return np.asarray(rng.poisson(np.clip(base, 10, None)), dtype="<u2")


def measured(root: Path, folder: str, label: str, driver: str, decoded: int) -> Dataset:
    files = [p for p in (root / folder).rglob("*") if p.is_file()]
    chunks = sum(1 for p in files if p.name not in METADATA)
    return Dataset(label, folder, driver, chunks, sum(p.stat().st_size for p in files), decoded)


def n5_shape(gib: float) -> tuple[int, int, int]:
    """A grid of ``gib`` worth of 128^3 uint16 blocks, 8x8 blocks a slab when there are enough."""
    blocks = max(1, round(gib * 2**30 / (2 * N5_BLOCK**3)))
    side = 8 if blocks >= 64 else 2 if blocks >= 4 else 1
    return (-(-blocks // side**2) * N5_BLOCK, side * N5_BLOCK, side * N5_BLOCK)


def write_n5(root: Path, gib: float) -> Dataset:
    shape = n5_shape(gib)
    metadata = {"dimensions": list(shape), "blockSize": [N5_BLOCK] * 3, "dataType": "uint16"}
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(root / "n5")}}
    spec["metadata"] = {**metadata, "compression": {"type": "gzip"}}
    array = ts.open(spec, create=True).result()
    pending: list[Any] = []
    for z in range(0, shape[0], N5_BLOCK):  # one row of whole blocks at a time: bounded memory
        for y in range(0, shape[1], N5_BLOCK):
            strip = smooth_poisson((N5_BLOCK, N5_BLOCK, shape[2]), (z, y, 0), seed=z + y * 7)
            pending.append(array[z : z + N5_BLOCK, y : y + N5_BLOCK, :].write(strip))
            while len(pending) > 2:
                pending.pop(0).result()
    for future in pending:
        future.result()
    return measured(root, "n5/", f"N5 gzip {N5_BLOCK}^3", "n5", 2 * prod(shape))


def zarr_grid(chunks: int) -> tuple[int, int]:
    """Rows x columns of chunks: exactly ``chunks`` when it has a divisor near its root."""
    root = max(1, isqrt(chunks))
    cols = next(c for c in range(root, 0, -1) if chunks % c == 0)
    if cols < root // 4:
        cols = root
    return -(-chunks // cols), cols


def write_zarr(root: Path, chunks: int) -> Dataset:
    rows, cols = zarr_grid(chunks)
    shape = (rows * ZARR_SIDE, cols * ZARR_SIDE)
    metadata = {"shape": list(shape), "chunks": [ZARR_SIDE] * 2, "dtype": "<u2"}
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(root / "zarr")}}
    spec["metadata"] = {**metadata, "compressor": {"id": "zstd", "level": 3}, "fill_value": 0}
    array = ts.open(spec, create=True).result()
    array.write(smooth_poisson(shape, (0, 0), seed=1)).result()
    label = f"Zarr2 zstd {ZARR_SIDE}x{ZARR_SIDE}"
    return measured(root, "zarr/", label, "zarr", 2 * prod(shape))


def upload(root: Path, endpoint: str, bucket: str) -> int:
    """Every file under ``root`` as an object of the same relative name, 16 PUTs at a time."""
    config = Config(max_pool_connections=32)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)
    client.create_bucket(Bucket=bucket)
    files = [p for p in root.rglob("*") if p.is_file()]

    def put(path: Path) -> None:
        key = path.relative_to(root).as_posix()
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        for _ in pool.map(put, files):
            pass
    return len(files)


def run_n5fs(source: dict[str, Any], jobs: int | None, dataset: Dataset) -> tuple[float, int]:
    """Seconds for open + detect + list + validate, as the CLI does it; and the jobs used."""
    used: list[int] = []
    start = time.perf_counter()
    with open_source(source, read_only=True).store as store:
        report = validate_store(store, jobs=jobs, on_start=lambda v: used.append(v.jobs))
    elapsed = time.perf_counter() - start
    if not report.ok or report.chunks != dataset.chunks:
        raise RuntimeError(f"{dataset.label}: unexpected report {report.to_json()}")
    return elapsed, used[0]


def run_cli(source: dict[str, Any], jobs: int | None, dataset: Dataset) -> float:
    """Seconds for ``n5fs validate --json`` in a fresh interpreter (imports included)."""
    argv = [sys.executable, "-m", "n5fs", "validate", "--json", json.dumps(source)]
    argv += ["--jobs", str(jobs)] if jobs else []
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{dataset.label}: n5fs validate exited {proc.returncode}: {proc.stderr}"
        )
    checked = json.loads(proc.stdout)["checked"]["chunks"]
    if checked != dataset.chunks:
        raise RuntimeError(f"{dataset.label}: the CLI checked {checked} of {dataset.chunks} chunks")
    return elapsed


def run_listing(source: dict[str, Any], dataset: Dataset) -> float:
    """Seconds for the one listing n5fs needs and TensorStore does not (it reads by key)."""
    with open_source(source, read_only=True).store as store:
        start = time.perf_counter()
        listed = len(store.list("", delimiter=None).keys)
        elapsed = time.perf_counter() - start
    if listed < dataset.chunks:
        raise RuntimeError(f"{dataset.label}: listed {listed} of {dataset.chunks} chunks")
    return elapsed


def run_tensorstore(source: dict[str, Any], dataset: Dataset) -> float:
    """Seconds for TensorStore to open the array and read all of it (no cache pool)."""
    start = time.perf_counter()
    spec = {"driver": dataset.driver, "kvstore": source}
    array = ts.open(spec, read=True, context=ts.Context()).result()
    values = array.read().result()
    elapsed = time.perf_counter() - start
    if values.nbytes != dataset.decoded:
        raise RuntimeError(f"{dataset.label}: TensorStore read {values.nbytes} bytes")
    return elapsed


def bench_row(store: str, source: dict[str, Any], dataset: Dataset, args: Any) -> Row:
    """Alternate TensorStore and n5fs each round (so drift hits both), keep the best."""
    ts_times, n5_times, jobs = [], [], 0
    for _ in range(args.rounds):
        ts_times.append(run_tensorstore(source, dataset))
        elapsed, jobs = run_n5fs(source, args.jobs, dataset)
        n5_times.append(elapsed)
    cli, listing = run_cli(source, args.jobs, dataset), run_listing(source, dataset)
    row = Row(dataset, store, jobs, min(n5_times), listing, cli, min(ts_times))
    rounds = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(n5_times, ts_times, strict=True))
    print(f"  {dataset.label} on {store}: n5fs/TS s by round {rounds}; CLI {cli:.2f} s", flush=True)
    return row


def print_table(rows: list[Row], rounds: int) -> None:
    print(
        f"\nwhole store, best of {rounds} rounds; MB = stored bytes (1e6). n5fs = validate_store()"
        " in-process (open, detect,\nlist, validate); list = of that, the listing alone; CLI = "
        "`n5fs validate --json` once (interpreter start\nincluded); TS = TensorStore open + read "
        "of the whole array. Ratios: time / TensorStore time.\n"
    )
    print(
        f"{'dataset':<20}{'store':<6}{'chunks':>7}{'MB':>6}{'jobs':>5}{'n5fs s':>8}{'list s':>7}"
        f"{'MB/s':>6}{'chunk/s':>8}{'TS s':>7}{'MB/s':>6}{'chunk/s':>8}{'n5fs/TS':>8}"
        f"{'CLI s':>7}{'CLI/TS':>7}"
    )
    for r in rows:
        d, mb = r.dataset, r.dataset.stored / 1e6
        print(
            f"{d.label:<20}{r.store:<6}{d.chunks:>7}{mb:>6.0f}{r.jobs:>5}{r.n5fs:>8.2f}"
            f"{r.listing:>7.2f}{mb / r.n5fs:>6.0f}{d.chunks / r.n5fs:>8.0f}{r.tensorstore:>7.2f}"
            f"{mb / r.tensorstore:>6.0f}{d.chunks / r.tensorstore:>8.0f}"
            f"{r.n5fs / r.tensorstore:>7.2f}x{r.cli:>7.2f}{r.cli / r.tensorstore:>6.2f}x"
        )


def bench_stores(args: argparse.Namespace) -> None:
    os.environ.update(AWS_ENV)  # the moto server's fake credentials, for boto3 and TensorStore
    root = Path(tempfile.mkdtemp(prefix="n5fs-bench-validate-"))
    try:
        start = time.perf_counter()
        datasets = [write_n5(root, args.n5_gib), write_zarr(root, args.zarr_chunks)]
        for d in datasets:
            print(
                f"wrote {d.label}: {d.chunks} chunks, {d.stored / 1e6:.0f} MB stored, "
                f"{d.decoded / 2**20:.0f} MiB decoded"
            )
        print(f"  ({time.perf_counter() - start:.0f} s)")
        rows = [
            bench_row("file", {"driver": "file", "path": str(root / d.folder)}, d, args)
            for d in datasets
            if "file" in args.stores
        ]
        if "s3" not in args.stores:
            print_table(rows, args.rounds)
            return
        with moto_server() as endpoint:
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            start = time.perf_counter()
            count = upload(root, endpoint, bucket)
            print(f"uploaded {count} objects to moto in {time.perf_counter() - start:.0f} s")
            for d in datasets:
                s3 = {
                    "driver": "s3",
                    "bucket": bucket,
                    "path": d.folder,
                    "endpoint": endpoint,
                    "aws_region": "us-east-1",
                    "aws_credentials": {"type": "environment"},
                }
                rows.append(bench_row("s3", s3, d, args))
        print_table(rows, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- a million small chunks: n5fs validate of this checkout against another ------------------


def make_small_tree(root: Path, chunks: int, layout: str) -> Path:
    """A Zarr v2 array of one-byte uint8 chunks (no compressor) at ``root/layout``, on a grid of
    1000 columns; written once (kept if it is there). Bare ``os.open``/``os.write``."""
    array = root / layout
    doc_path = array / ".zarray"
    cols = min(chunks, 1000)
    rows = -(-chunks // cols)
    sep = "/" if layout == "nested" else "."
    zarray = {"zarr_format": 2, "shape": [rows, cols], "chunks": [1, 1], "dtype": "|u1",
              "compressor": None, "fill_value": 0, "order": "C", "filters": None,
              "dimension_separator": sep}  # fmt: skip
    if doc_path.exists() and json.loads(doc_path.read_text()) == zarray:
        return array
    array.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    start = time.perf_counter()
    for index in range(chunks):
        row, col = divmod(index, cols)
        if sep == "/" and col == 0:
            (array / str(row)).mkdir(exist_ok=True)
        fd = os.open(f"{array}/{row}{sep}{col}", flags, 0o644)
        os.write(fd, bytes([index & 0xFF]))
        os.close(fd)
    doc_path.write_text(json.dumps(zarray))  # last: a tree cut short is made again
    print(f"wrote {chunks} chunks ({layout}) in {time.perf_counter() - start:.0f} s", flush=True)
    return array


def tree_rss_kib(pid: int) -> int:
    """RSS of ``pid`` and every process below it (``/proc``), KiB; 0 once it is gone."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next((int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmRSS:")), 0)  # fmt: skip
    return total


def run_validate_cli(checkout: Path, array: Path, chunks: int) -> tuple[float, int, int]:
    """Seconds, peak RSS of the validate process alone, and summed with its workers (MiB)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, "-m", "n5fs", "validate", "--json", str(array)]
    with tempfile.TemporaryDirectory() as cwd:  # no checkout in the current directory
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        with proc.stdout:
            out = b""
            peak = 0
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                peak = max(peak, tree_rss_kib(proc.pid))
                time.sleep(0.05)
            elapsed = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            out = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"n5fs validate ({checkout}) exited {proc.returncode}")
    checked = json.loads(out)["checked"]["chunks"]
    if checked != chunks:
        raise RuntimeError(f"n5fs validate ({checkout}) checked {checked} of {chunks} chunks")
    return elapsed, usage.ru_maxrss // 1024, max(peak, usage.ru_maxrss) // 1024


def bench_million(args: argparse.Namespace) -> None:
    here = Path(__file__).resolve().parent.parent
    checkouts = {"this": here}
    if args.against:
        checkouts = {"against": args.against.resolve(), **checkouts}
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-million-"))
    root = args.tree or tmp / "tree"
    print(f"load before: {os.getloadavg()[0]:.2f}; checkouts: "
          + ", ".join(f"{k}={v}" for k, v in checkouts.items()), flush=True)  # fmt: skip
    try:
        results: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
        for layout in args.layout.split(","):
            array = make_small_tree(root, args.million, layout)
            run_validate_cli(here, array, args.million)  # warm the page cache, not timed
            for _ in range(args.rounds or 2):
                for name, checkout in checkouts.items():
                    got = run_validate_cli(checkout, array, args.million)
                    results.setdefault((layout, name), []).append(got)
                    print(f"  {layout:<7}{name:<8}{got[0]:7.2f} s  {args.million / got[0]:8.0f} "
                          f"chunks/s  RSS {got[1]} MiB, with workers {got[2]}",
                          flush=True)  # fmt: skip
        print(
            f"\n{args.million} one-byte Zarr v2 chunks, `n5fs validate --json` from the command "
            f"line, best of {args.rounds or 2} rounds (load after: {os.getloadavg()[0]:.2f})"
        )
        print(f"{'layout':<8}{'code':<9}{'s':>7}{'chunks/s':>10}{'RSS MiB':>9}"
              f"{'+workers':>10}{'ratio':>7}")  # fmt: skip
        for layout in args.layout.split(","):
            base = min(r[0] for r in results.get((layout, "against"), [(0.0, 0, 0)]))
            for name in checkouts:
                runs = results[(layout, name)]
                best = min(r[0] for r in runs)
                own, rss = max(r[1] for r in runs), max(r[2] for r in runs)
                ratio = f"{base / best:6.2f}x" if base else ""
                print(f"{layout:<8}{name:<9}{best:>7.2f}{args.million / best:>10.0f}{own:>9}"
                      f"{rss:>10}{ratio:>7}")  # fmt: skip
        print(
            "peak RSS: of the validate process (its rusage); +workers: it and its worker "
            "processes, summed (sampled every 50 ms); ratio: the other checkout's time over "
            "this one's"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=64, help="per chunk: chunk side")
    parser.add_argument("--chunks", type=int, default=8, help="per chunk: how many chunks")
    parser.add_argument("--rounds", type=int, default=None, help="best of (7 per chunk, 2 store)")
    parser.add_argument("--store", action="store_true", help="benchmark whole stores instead")
    parser.add_argument("--n5-gib", type=float, default=1.0, help="decoded size of the N5 array")
    parser.add_argument(
        "--zarr-chunks", type=int, default=50_000, help="chunks of the Zarr v2 array"
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="n5fs validate --jobs (default: its own)"
    )
    parser.add_argument("--quick", action="store_true", help="small store run (smoke test)")
    parser.add_argument(
        "--stores",
        type=lambda text: set(text.split(",")),
        default={"file", "s3"},
        help="which stores to time, comma-separated (default: file,s3)",
    )
    parser.add_argument(
        "--million",
        type=int,
        nargs="?",
        const=1_000_000,
        default=None,
        metavar="CHUNKS",
        help="validate CHUNKS (a million) one-byte chunks from the command line",
    )
    parser.add_argument(
        "--layout", default="nested,flat", help="--million: nested (a folder per row), flat"
    )
    parser.add_argument("--against", type=Path, help="--million: the checkout to compare with")
    parser.add_argument("--tree", type=Path, help="--million: make the tree here once, keep it")
    args = parser.parse_args()
    if args.million:
        bench_million(args)
        return
    if not args.store:
        bench_chunks(args)
        return
    if args.quick:
        args.n5_gib, args.zarr_chunks = 1 / 32, 2_000
    args.rounds = args.rounds or 2
    bench_stores(args)


if __name__ == "__main__":
    main()
