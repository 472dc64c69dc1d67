"""List throughput of one chunk folder, as the gateway lists it (one level, ``/`` delimiter).

Measures the file store and the S3 store (on a moto server this script starts on 127.0.0.1,
port 0, and stops at the end), each beside direct access in the same run (``os.scandir`` +
``stat``; a bare boto3 paginator), so the table shows what the store layer costs.

    /work/venv/bin/python scripts/bench_list.py [--keys 2500] [--repeat 5]

``--array AxBx...`` measures the gateway instead, on S3 (moto): a Zarr v2 array with
dimension_separator "/" and a chunk grid of A x B x ... (one chunk folder per position of
all but the last index); a stat of every chunk key (in grid order) and a ``find``-like walk
of ``readdir`` calls (in name order), each on a fresh gateway, with array walks (one flat
listing of the array) and without (one LIST per folder), and the requests each made (pages
of a walk). Indicative: moto answers every LIST by scanning the whole bucket, and a stat of
a file on S3 is a HEAD besides (the kept mtime).

    /work/venv/bin/python scripts/bench_list.py --array 400x32
    /work/venv/bin/python scripts/bench_list.py --array 40x40x32   # 51,200 chunks, 1,641 folders

``--cpu`` measures this process's CPU (``time.process_time``; moto runs in its own process)
per LIST of one folder of ``--keys`` keys (one page at 1,000) through ``S3Store.list``: on
the lean path (:mod:`n5fs.kvstore.s3.leanlist`) and on botocore's (the same store with the
lean path refused), taking turns, ``--repeat`` rounds of 10 LISTs each, with a bare boto3
``list_objects_v2`` and ElementTree's parse of the same answer for reference.

    /work/venv/bin/python scripts/bench_list.py --cpu --keys 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3

from n5fs.kvstore.s3 import S3Store
from n5fs.kvstore.spec import S3Spec
from n5fs.testing.moto_server import moto_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from n5fs.kvstore.base import KeyInfo, Listing

try:
    from n5fs.kvstore.file import FileStore
except ImportError:  # the file driver is younger than this script
    FileStore = None  # type: ignore[assignment,misc]

Results = dict[str, tuple[list[float], int]]  # what -> (seconds per run, keys listed)

FOLDER = "vol/c/"
VALUE = b"\x00" * 64


def chunk_names(n: int) -> list[str]:
    side = max(1, int(n**0.5))
    return [f"{i // side}.{i % side}" for i in range(n)]


def timed(calls: dict[str, Callable[[], int]], repeat: int) -> Results:
    """Round-robin over ``calls`` so drift (server state, caches) hits each one alike."""
    for call in calls.values():
        call()  # warm up: imports, connections, directory cache
    out: Results = {what: ([], 0) for what in calls}
    for _ in range(repeat):
        for what, call in calls.items():
            start = time.perf_counter()
            count = call()
            out[what][0].append(time.perf_counter() - start)
            out[what] = (out[what][0], count)
    return out


def bench_file(names: list[str], repeat: int) -> Results:
    if FileStore is None:
        return {}
    root = Path(tempfile.mkdtemp(prefix="n5fs-bench-"))
    try:
        folder = root / FOLDER
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_bytes(VALUE)
        store = FileStore(root)

        def direct() -> int:
            with os.scandir(folder) as entries:
                return len([(e.name, e.stat().st_size) for e in entries])

        return timed(
            {
                "file: os.scandir+stat": direct,
                "file: FileStore.list": lambda: len(store.list(FOLDER).keys),
            },
            repeat,
        )
    finally:
        shutil.rmtree(root)


def bench_s3(names: list[str], repeat: int) -> Results:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda n: client.put_object(Bucket=bucket, Key=FOLDER + n, Body=VALUE), names
                )
            )
        store = S3Store(S3Spec(bucket=bucket, endpoint=endpoint, aws_region="us-east-1"))
        paginator = client.get_paginator("list_objects_v2")

        def direct() -> int:
            pages = paginator.paginate(Bucket=bucket, Prefix=FOLDER, Delimiter="/")
            return sum(len(page.get("Contents", ())) for page in pages)

        try:
            return timed(
                {
                    "s3 (moto): boto3 paginator": direct,
                    "s3 (moto): S3Store.list": lambda: len(store.list(FOLDER).keys),
                },
                repeat,
            )
        finally:
            store.close()


def bench_cpu(names: list[str], repeat: int) -> None:
    """CPU per LIST, lean path against botocore's (module docstring)."""
    from xml.etree import ElementTree

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        upload(client, bucket, {FOLDER + name: VALUE for name in names})
        spec = S3Spec(bucket=bucket, endpoint=endpoint, aws_region="us-east-1")
        lean, botocore = S3Store(spec), S3Store(spec)
        botocore._lean_lists.refused = "the reference"
        bodies: list[bytes] = []
        client.meta.events.register(
            "before-parse.s3.ListObjectsV2",
            lambda response_dict, **_: bodies.append(response_dict["body"]),
        )
        client.list_objects_v2(Bucket=bucket, Prefix=FOLDER, Delimiter="/")
        body = bodies[-1]
        calls: dict[str, Callable[[], int]] = {
            "S3Store.list, lean LIST": lambda: len(lean.list(FOLDER).keys),
            "S3Store.list, botocore": lambda: len(botocore.list(FOLDER).keys),
            "boto3 list_objects_v2": lambda: len(
                client.list_objects_v2(Bucket=bucket, Prefix=FOLDER, Delimiter="/")["Contents"]
            ),
            "ElementTree parse alone": lambda: len(ElementTree.fromstring(body)),
        }
        for call in calls.values():
            call()  # learns the lean route and checks its parse
        assert lean._lean_lists.ready, lean._lean_lists.refused
        cpu = dict.fromkeys(calls, 0.0)
        for _ in range(repeat):
            for what, call in calls.items():
                start = time.process_time()
                for _ in range(10):
                    call()
                cpu[what] += time.process_time() - start
        lean.close()
        botocore.close()
    runs = 10 * repeat
    print(f"\nCPU of this process per LIST of {len(names)} keys (one folder), {runs} each")
    base = cpu["S3Store.list, botocore"] / runs
    for what, seconds in cpu.items():
        per = seconds / runs
        print(f"{what:28} {per * 1e3:8.2f} ms  {per / base:6.2f}x botocore's store path")


def upload(client: Any, bucket: str, items: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                      items.items()))  # fmt: skip


def bench_array(grid: tuple[int, ...]) -> None:
    """The gateway over a nested Zarr v2 array on moto: walks on and off (module docstring)."""
    from n5fs.gateway import EntryKind, Gateway, GatewayConfig
    from n5fs.kvstore.wrappers import ForwardingStore

    class Counting(ForwardingStore):
        requests = 0
        lock = threading.Lock()  # walks run on the gateway's workers

        def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
            with self.lock:
                self.requests += 1
            return super().list(prefix, delimiter)

        def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
            for n, info in enumerate(super().walk(prefix)):
                if n % 1000 == 0:  # a page a request
                    with self.lock:
                        self.requests += 1
                yield info

    zarray = {"zarr_format": 2, "shape": list(grid), "chunks": [1] * len(grid), "dtype": "|u1",
              "compressor": None, "fill_value": 0, "order": "C", "filters": None,
              "dimension_separator": "/"}  # fmt: skip
    positions = itertools.product(*(range(n) for n in grid))
    items = {"arr/" + "/".join(map(str, p)): b"\x01" for p in positions}
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        upload(client, bucket, {"arr/.zarray": json.dumps(zarray).encode(), **items})
        spec = S3Spec(bucket=bucket, endpoint=endpoint, aws_region="us-east-1")

        def stat_all(gw: Gateway) -> int:
            return sum(gw.stat("/" + key).kind is EntryKind.FILE for key in items)

        def find(gw: Gateway, path: str = "/arr") -> int:
            entries = gw.readdir(path)
            subs = [f"{path}/{n}" for n, attr in entries if attr.kind is EntryKind.DIR]
            return len(entries) + sum(find(gw, sub) for sub in subs)

        shape = "x".join(map(str, grid))
        print(f"\nZarr v2 array on moto: grid {shape}, {len(items)} chunks (fresh gateway each)")
        print(f"{'what':28} {'walks':>6} {'seconds':>9} {'requests':>9}")
        for what, run in (("stat every chunk", stat_all), ("find (readdir walk)", find)):
            for budget in (100_000, 0):
                store = Counting(S3Store(spec))
                gw = Gateway(store, GatewayConfig(read_only=True, flat_list_keys=budget))
                start = time.perf_counter()
                run(gw)
                seconds = time.perf_counter() - start
                walks = "on" if budget else "off"
                print(f"{what:28} {walks:>6} {seconds:9.2f} {store.requests:9d}")
                gw.close()


def report(results: Results, keys: int, repeat: int) -> None:
    print(f"\nlisting one folder of {keys} keys with delimiter '/', best and median of {repeat}")
    print(
        f"{'what':30} {'keys':>6} {'best ms':>9} {'median ms':>10} {'keys/s (best)':>14}"
        f" {'vs direct':>10}"
    )
    direct_best = 0.0
    for what, (seconds, count) in results.items():
        best, median = min(seconds), statistics.median(seconds)
        ratio = f"{best / direct_best:9.2f}x" if "direct" not in what and direct_best else ""
        if "scandir" in what or "paginator" in what:
            direct_best, ratio = best, "  (direct)"
        print(
            f"{what:30} {count:6d} {best * 1e3:9.2f} {median * 1e3:10.2f}"
            f" {count / best:14,.0f} {ratio:>10}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2500)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cpu", action="store_true",
                        help="CPU per LIST, lean path against botocore's")  # fmt: skip
    parser.add_argument("--array", metavar="AxBx...",
                        help="measure the gateway over a nested array on S3 instead")  # fmt: skip
    args = parser.parse_args()
    if args.array:
        bench_array(tuple(int(n) for n in args.array.lower().split("x")))
        return 0
    names = chunk_names(args.keys)
    if args.cpu:
        bench_cpu(names, args.repeat)
        return 0
    results = bench_file(names, args.repeat)
    if not results:
        print("n5fs.kvstore.file is not there yet: measuring S3 only")
    results.update(bench_s3(names, args.repeat))
    report(results, args.keys, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
