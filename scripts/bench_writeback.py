"""Writes at real latency: n5fs write-back (``-o writeback=on``, S3's default) against
synchronous commits (``-o writeback=off``) and rclone mount ``--vfs-cache-mode writes``, through
:mod:`n5fs.testing.s3_proxy` in front of a moto server on 127.0.0.1, at 25 ms one way (50 ms a
round trip) and at 0 ms.

Workloads, each on a fresh mount and a fresh prefix:

- ``cp -r`` of a Zarr v2 array of ``--chunks`` chunks of 1 KiB (20 per folder) from local disk
  into the mount: when ``cp`` returns, and when every object is in the bucket (polled directly
  at moto, behind the proxy's back, every 50 ms); every object is then compared byte for byte;
- zarr-python 3 writing an array of ``--chunks`` chunks of 1 KiB from 8 threads, until every
  chunk is in the bucket (for write-back: the writes, then ``n5fs sync``);
- ``kill -9``: the ``cp -r`` again, the daemon killed 1 s (and 0 s) after ``cp`` returned, a new mount
  of the same source (same state directory): every object in the bucket byte-exact afterwards,
  the journal empty, ``n5fs validate`` of the bucket clean;
- faults: the ``cp -r`` while the proxy resets connections, answers 503 and cuts PUT bodies
  short (answered 200); ``n5fs sync`` until it succeeds; acknowledged files lost and corrupt.

Moto's speed is not S3's: read the times as ratios between the systems of one run.

    python scripts/bench_writeback.py                  # 1,000 chunks, everything
    python scripts/bench_writeback.py --chunks 200     # a quick look
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
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script: find siblings
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import RCLONE_FLAGS, Mounts, Variant, n5fs_variant, rclone_variant
from bench_workloads import AWS_ENV, BenchError, s3_client

from n5fs.testing.moto_server import moto_server
from n5fs.testing.s3_proxy import Fault, fault_proxy

CHUNK = 1024
PER_FOLDER = 20


def make_array(root: Path, chunks: int) -> dict[str, bytes]:
    """A Zarr v2 array of ``chunks`` chunks of 1 KiB (uint8, "/" separator) under ``root``;
    returns relative path -> bytes."""
    rows = -(-chunks // PER_FOLDER)
    meta = {"zarr_format": 2, "shape": [rows * 32, PER_FOLDER * 32], "chunks": [32, 32],
            "dtype": "|u1", "compressor": None, "fill_value": 0, "order": "C",
            "filters": None, "dimension_separator": "/"}  # fmt: skip
    files = {".zarray": json.dumps(meta).encode()}
    for n in range(chunks):
        files[f"{n // PER_FOLDER}/{n % PER_FOLDER}"] = os.urandom(CHUNK)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def bucket_count(client: Any, bucket: str, prefix: str) -> int:
    count = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        count += sum(1 for o in page.get("Contents", []) if "/.n5fs" not in o["Key"])
    return count


def wait_in_bucket(client: Any, bucket: str, prefix: str, n: int, limit: float) -> float:
    """Seconds until ``n`` objects are under ``prefix`` (polled), from now."""
    start = time.perf_counter()
    while bucket_count(client, bucket, prefix) < n:
        if time.perf_counter() - start > limit:
            raise BenchError(f"only {bucket_count(client, bucket, prefix)} of {n} landed")
        time.sleep(0.05)
    return time.perf_counter() - start


def compare(client: Any, bucket: str, prefix: str, files: dict[str, bytes]) -> tuple[int, int]:
    """(lost, corrupt) of ``files`` under ``prefix``."""
    lost = corrupt = 0

    def one(item: tuple[str, bytes]) -> int:
        try:
            body = client.get_object(Bucket=bucket, Key=prefix + item[0])["Body"].read()
        except client.exceptions.NoSuchKey:
            return 1
        return 0 if body == item[1] else 2

    with ThreadPoolExecutor(16) as pool:
        for verdict in pool.map(one, files.items()):
            lost += verdict == 1
            corrupt += verdict == 2
    return lost, corrupt


def n5fs_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "n5fs", *args], env=env, capture_output=True,
                          text=True, check=False, timeout=900)  # fmt: skip


def rclone_writes(bucket: str, endpoint: str, cache: Path) -> Variant:
    base = rclone_variant("s3", bucket, endpoint)
    if base.argv is None:
        return base
    exe = shutil.which("rclone") or "rclone"
    flags = [f for f in RCLONE_FLAGS if f not in ("off", "--vfs-cache-mode", "--read-only")]
    argv = [exe, "mount", f"moto:{bucket}", "", *flags, "--vfs-cache-mode", "writes",
            "--cache-dir", str(cache)]  # fmt: skip
    return Variant("rclone writes", lambda mp: [*argv[:3], str(mp), *argv[4:]], note=base.note,
                   env=base.env)  # fmt: skip


def cp_run(mounts: Mounts, variant: Variant, src: Path, prefix: str, client: Any, bucket: str,
           files: dict[str, bytes], env: dict[str, str]) -> dict[str, float]:  # fmt: skip
    mount = mounts.start(variant)
    try:
        start = time.perf_counter()
        with mounts.guard(f"cp -r into {variant.name}", 900):
            done = subprocess.run(["cp", "-r", str(src), str(mount.path / prefix)], check=False)
        cp = time.perf_counter() - start
        if done.returncode != 0:
            raise BenchError(f"cp -r into {variant.name} exited {done.returncode}")
        landed = cp + wait_in_bucket(client, bucket, prefix + "/", len(files), 900)
        lost, corrupt = compare(client, bucket, prefix + "/", files)
        return {"cp": cp, "all": landed, "lost": lost, "corrupt": corrupt}
    finally:
        mounts.stop(mount)


def zarr_run(mounts: Mounts, variant: Variant, prefix: str, chunks: int, env: dict[str, str],
             client: Any, bucket: str) -> float:  # fmt: skip
    import numpy as np
    import zarr

    rows = -(-chunks // PER_FOLDER)
    values = np.random.default_rng(7).integers(0, 255, (rows * 32, PER_FOLDER * 32), "uint8")
    mount = mounts.start(variant)
    try:
        start = time.perf_counter()
        with mounts.guard(f"zarr-python into {variant.name}", 900):
            arr = zarr.create_array(str(mount.path / prefix), shape=values.shape,
                                    chunks=(32, 32), dtype="uint8", zarr_format=2,
                                    compressors=None)  # fmt: skip

            def band(i: int) -> None:
                arr[i * 32 : (i + 1) * 32, :] = values[i * 32 : (i + 1) * 32, :]

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(band, range(rows)))
            if "writeback=on" in " ".join(variant.argv(mount.path) if variant.argv else []):
                synced = n5fs_cli("sync", str(mount.path), env=env)
                if synced.returncode != 0:
                    raise BenchError(f"n5fs sync: {synced.stderr[-300:]}")
        took = time.perf_counter() - start
        if bucket_count(client, bucket, prefix + "/") < rows * PER_FOLDER:
            raise BenchError("zarr-python: not every chunk is in the bucket")
        return took
    finally:
        mounts.stop(mount)


def kill_run(mounts: Mounts, variant: Variant, src: Path, prefix: str, client: Any, bucket: str,
             files: dict[str, bytes], env: dict[str, str], state: Path, source: str,
             after: float) -> dict[str, Any]:  # fmt: skip
    mount = mounts.start(variant)
    done = subprocess.run(["cp", "-r", str(src), str(mount.path / prefix)], check=False)
    if done.returncode != 0:
        raise BenchError(f"cp -r exited {done.returncode}")
    time.sleep(after)
    landed_before = bucket_count(client, bucket, prefix + "/")
    assert mount.proc is not None
    mount.proc.kill()
    mount.proc.wait()
    subprocess.run(["fusermount3", "-u", "-z", str(mount.path)], check=False)
    mounts.live.remove(mount)
    journaled = sum(p.stat().st_size for p in (state / "writeback").glob("*/*.log"))
    again = mounts.start(variant)
    try:
        synced = n5fs_cli("sync", str(again.path), env=env)
        if synced.returncode != 0:
            raise BenchError(f"n5fs sync after the restart: {synced.stderr[-300:]}")
    finally:
        mounts.stop(again)
    lost, corrupt = compare(client, bucket, prefix + "/", files)
    left = sum(1 for _ in (state / "writeback").glob("*/*.log"))
    spec = json.loads(source)
    spec["path"] = prefix
    checked = n5fs_cli("validate", json.dumps(spec), "--json", env=env)
    invalid = len(json.loads(checked.stdout).get("invalid", [])) if checked.stdout else -1
    return {"landed before the kill": landed_before, "journal bytes at the kill": journaled,
            "lost": lost, "corrupt": corrupt, "journal segments left": left, "invalid stored": invalid,
            "validate exit": checked.returncode}  # fmt: skip


def fault_run(mounts: Mounts, variant: Variant, src: Path, prefix: str, client: Any, bucket: str,
              files: dict[str, bytes], env: dict[str, str], proxy: Any) -> dict[str, Any]:  # fmt: skip
    mount = mounts.start(variant)
    try:
        proxy.reset_counts()
        proxy.inject(Fault("reset_before", method="PUT", probability=0.05),
                     Fault("reset_after", method="PUT", probability=0.05),
                     Fault("status", method="PUT", status=503, code="SlowDown", probability=0.05),
                     Fault("truncate", method="PUT", probability=0.05))  # fmt: skip
        done = subprocess.run(["cp", "-r", str(src), str(mount.path / prefix)], check=False)
        syncs = 0
        while True:
            syncs += 1
            if n5fs_cli("sync", str(mount.path), env=env).returncode == 0 or syncs > 30:
                break
        proxy.clear()
        injected = dict(proxy.injected)
    finally:
        proxy.clear()
        mounts.stop(mount)
    lost, corrupt = compare(client, bucket, prefix + "/", files)
    return {"cp exit": done.returncode, "syncs": syncs, "lost": lost, "corrupt": corrupt,
            "faults injected": sum(injected.values())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--chunks", type=int, default=1000)
    p.add_argument("--latency", type=float, default=0.025, help="one way, seconds")
    p.add_argument("--skip", default="", help="comma-separated: cp,zarr,kill,faults")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-wb-"))
    state = tmp / "state"
    env = {**os.environ, **AWS_ENV, "N5FS_STATE_DIR": str(state)}
    mounts = Mounts(tmp, env)
    src = tmp / "src"
    files = make_array(src, args.chunks)
    out: dict[str, Any] = {}
    try:
        with moto_server() as upstream:
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            client = s3_client(upstream)
            client.create_bucket(Bucket=bucket)
            with fault_proxy(upstream) as proxy:
                source = json.dumps({"driver": "s3", "bucket": bucket, "path": "",
                                     "endpoint": proxy.endpoint, "aws_region": "us-east-1"})  # fmt: skip
                on = n5fs_variant("n5fs write-back", source, "-o", "writeback=on")
                off = n5fs_variant("n5fs sync commits", source, "-o", "writeback=off")
                rclone = rclone_writes(bucket, proxy.endpoint, tmp / "rclone-cache")
                n = iter(range(1000))

                def fresh() -> str:
                    return f"run{next(n)}"

                if "cp" not in skip:
                    for latency in (args.latency, 0.0):
                        proxy.latency = latency
                        for v in (on, off, rclone):
                            if v.missing or (latency == 0.0 and v is rclone):
                                continue
                            cell = cp_run(mounts, v, src, fresh(), client, bucket, files, env)
                            out[f"cp -r, {latency * 1000:g} ms, {v.name}"] = cell
                            print(f"cp -r {latency * 1000:g} ms {v.name}: {cell}", flush=True)
                proxy.latency = args.latency
                if "zarr" not in skip:
                    for v in (on, off):
                        took = zarr_run(mounts, v, fresh(), args.chunks, env, client, bucket)
                        out[f"zarr-python 8 threads, {v.name}"] = took
                        print(f"zarr-python {v.name}: {took:.1f} s", flush=True)
                if "kill" not in skip:
                    for after in (1.0, 0.0):
                        cell = kill_run(mounts, on, src, fresh(), client, bucket, files, env,
                                        state, source, after)  # fmt: skip
                        out[f"kill -9 {after:g} s after cp -r returned"] = cell
                        print(f"kill -9 after {after:g} s: {cell}", flush=True)
                if "faults" not in skip:
                    proxy.latency = 0.0
                    cell = fault_run(mounts, on, src, fresh(), client, bucket, files, env, proxy)
                    out["faults during uploads"] = cell
                    print(f"faults: {cell}", flush=True)
    finally:
        mounts.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
