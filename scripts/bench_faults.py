"""Fault benchmark: two fault-related figures through real FUSE mounts of an S3 bucket (a moto
server on 127.0.0.1, port 0, started here), for the current code and an old code tree, in one
run, printed as one table (old | new | speedup = old time / new time).

(a) ``mv MNT/src MNT/dst`` of a Zarr v2 array of ``--chunks`` chunks (uploaded with boto3, not
    through the mount): median wall time of ``--repeats`` moves (back and forth), and keys/s.
(b) A silent endpoint: the mount talks to moto through a TCP proxy (a thread here) which, once
    switched to silent, forwards nothing on any connection, old or new, but keeps every socket
    open. Then ``os.stat(MNT/absent-name)`` or ``os.listdir(MNT/folder)`` (never listed), each
    on a fresh mount (``--cache-ttl 0``), under a watchdog: the errno and seconds, or "> W s".

Each tree runs as ``python -m n5fs mount`` with PYTHONPATH set to it and a cwd outside both
trees. The old tree (``--old``) defaults to /tmp/n5fs-old, extracted once from commit c17c6d4.
Every mount is unmounted (``fusermount3 -u -z`` as a fallback) and moto stopped, even on error.

    python scripts/bench_faults.py            # 1,000 chunks, 3 moves; (b) may take ~10 min
    python scripts/bench_faults.py --quick    # 200 chunks; old code's (b) capped at 90 s
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3

from n5fs.testing.moto_server import moto_server

if TYPE_CHECKING:
    from collections.abc import Callable

NEW = Path(__file__).resolve().parent.parent
OLD_COMMIT = "c17c6d4"
Done = subprocess.CompletedProcess[str]
Outcome = tuple[str, float | None]  # (errno name, seconds), or (">", None): watchdog ran out
Silent = dict[str, Outcome]
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
AWS_ENV = {**AWS, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class SilencingProxy:
    """Forwards TCP to moto while open; silent: swallows every byte, keeps every socket open."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.silent = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            self.sockets.append(client)
            if not self.silent.is_set():  # else: held open, never answered
                upstream = socket.create_connection(self.target)
                self.sockets.append(upstream)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:  # one direction
        with contextlib.suppress(OSError):
            while (data := src.recv(65536)) and not self.silent.is_set():
                dst.sendall(data)

    def close(self) -> None:
        """Close every socket: calls still waiting on the silent endpoint then fail at once."""
        for sock in (self.server, *self.sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # close() alone leaves a blocked recv() waiting
            sock.close()


class Tree:
    """One code tree's mounts: ``python -m n5fs`` with PYTHONPATH=root, cwd outside the trees."""

    def __init__(self, name: str, root: Path, tmp: Path) -> None:
        self.name, self.root, self.tmp = name, root, tmp / name
        self.tmp.mkdir()
        state = str(self.tmp / "state")
        self.env = {**os.environ, **AWS_ENV, "PYTHONPATH": str(root), "N5FS_STATE_DIR": state}
        self.mounted: list[Path] = []
        where = self.cli("-c", "import n5fs; print(n5fs.__file__)", module=False).stdout
        if not Path(where.strip()).is_relative_to(root):
            raise SystemExit(f"{name}: n5fs imported from {where.strip()}, not from {root}")

    def cli(self, *args: str, module: bool = True, timeout: float = 120) -> Done:
        argv = [sys.executable, *(("-m", "n5fs") if module else ()), *args]
        run = partial(subprocess.run, env=self.env, cwd=self.tmp, capture_output=True, text=True)
        return run(argv, timeout=timeout, check=False)

    def mount(self, spec: dict[str, str], name: str, *args: str) -> Path:
        mp = self.tmp / name
        mp.mkdir()
        self.mounted.append(mp)
        done = self.cli("mount", json.dumps(spec), str(mp), *args)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: mount failed: {done.stderr.strip()}")
        return mp

    def unmount_all(self) -> None:
        for mp in reversed(self.mounted):
            if f" {mp} " not in Path("/proc/self/mounts").read_text():
                continue  # the mount failed, or is gone already
            try:
                done = self.cli("unmount", str(mp), timeout=60)
                why = done.stderr.strip() if done.returncode else ""
            except subprocess.TimeoutExpired:
                why = "no answer in 60 s"
            if why or f" {mp} " in Path("/proc/self/mounts").read_text():
                print(f"  {self.name}: n5fs unmount {mp.name}: {why}; fusermount3 -u -z")
                subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=False)
        self.mounted.clear()


def zarr_array(prefix: str, n: int) -> dict[str, bytes]:
    meta = {"zarr_format": 2, "shape": [16 * n], "chunks": [16], "dtype": "<u1", "order": "C"}
    meta |= {"compressor": None, "fill_value": 0, "filters": None}
    keys = {f"{prefix}/{i}": bytes([i % 256]) * 16 for i in range(n)}
    return {f"{prefix}/.zarray": json.dumps(meta).encode(), **keys}


def count_keys(s3: Any, bucket: str, prefix: str) -> int:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(page.get("KeyCount", 0) for page in pages)


def bench_move(tree: Tree, s3: Any, endpoint: str, n: int, repeats: int) -> list[float]:
    bucket = f"move-{tree.name}"
    s3.create_bucket(Bucket=bucket)
    with ThreadPoolExecutor(16) as pool:
        objs = zarr_array("data/src", n).items()
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objs))
    mp = tree.mount({"driver": "s3", "bucket": bucket, "path": "data/", "endpoint": endpoint}, "mv")
    times, names = [], ("src", "dst")
    for r in range(repeats):
        a, b = names[r % 2], names[1 - r % 2]
        start = time.monotonic()
        subprocess.run(["mv", str(mp / a), str(mp / b)], check=True, timeout=3600)
        times.append(time.monotonic() - start)
        moved = (count_keys(s3, bucket, f"data/{a}/"), count_keys(s3, bucket, f"data/{b}/"))
        if moved != (0, n + 1):
            raise RuntimeError(f"{tree.name}: after mv {a} {b}, keys (src, dst) = {moved}")
        print(f"  {tree.name}: mv {a} {b}: {times[-1]:.2f} s", flush=True)
    return times


def timed(call: Callable[[], object], watchdog: float, release: Callable[[], None]) -> Outcome:
    """(errno name or "answered", seconds), or (">", None) when the watchdog ran out; then
    ``release()`` and a wait for the call to return, so that the mount can be unmounted."""
    out: list[tuple[str, float]] = []

    def run() -> None:
        start = time.monotonic()
        try:
            call()
            code = "answered"
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        out.append((code, time.monotonic() - start))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(watchdog)
    if worker.is_alive():
        release()
        worker.join(60)
        return (">", None)
    return out[0]


def bench_silent(tree: Tree, s3: Any, endpoint: str, watchdog: float) -> Silent:
    """Each call on a fresh mount whose endpoint has just gone silent (so a call never meets
    the new code's fail-fast cooldown started by the call before it)."""
    bucket = f"silent-{tree.name}"
    s3.create_bucket(Bucket=bucket)
    for key in ("idle/folder/k", "idle/other/k"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    calls: dict[str, Callable[[Path], object]] = {
        "stat absent name": lambda mp: os.stat(mp / "absent-name"),
        "listdir unlisted folder": lambda mp: os.listdir(mp / "folder"),
    }
    result: Silent = {}
    for i, (row, call) in enumerate(calls.items()):
        proxy = SilencingProxy(endpoint)
        try:
            spec = {"driver": "s3", "bucket": bucket, "path": "idle/", "endpoint": proxy.endpoint}
            mp = tree.mount(spec, f"silent{i}", "--cache-ttl", "0")
            proxy.silent.set()
            result[row] = timed(partial(call, mp), watchdog, proxy.close)
            print(f"  {tree.name}: {row} on a silent endpoint: {result[row]}", flush=True)
        finally:
            proxy.close()  # a call the watchdog gave up on now fails at once
            tree.unmount_all()
    return result


def old_tree(path: Path) -> Path:
    if not path.exists():
        path.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(NEW), "archive", OLD_COMMIT], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path.resolve()


def cell(code: str, seconds: float | None, watchdog: float) -> str:
    return f"> {watchdog:g} s" if seconds is None else f"{code} in {seconds:.1f} s"


def print_table(args: argparse.Namespace, n: int, watchdogs: dict[str, float],
                moves: dict[str, list[float]], silent: dict[str, Silent]) -> None:  # fmt: skip
    old_s, new_s = statistics.median(moves["old"]), statistics.median(moves["new"])
    speedup = f"{old_s / new_s:.2f}x"
    table = [
        ["measurement", "old", "new", "speedup (old time / new)"],
        [f"mv of a {n}-chunk Zarr v2 array, s", f"{old_s:.2f}", f"{new_s:.2f}", speedup],
        ["  the same in keys/s", f"{(n + 1) / old_s:.0f}", f"{(n + 1) / new_s:.0f}", speedup],
    ]
    for row in silent["new"]:
        (oc, os_), (nc, ns) = silent["old"][row], silent["new"][row]
        bound = "> " if os_ is None else ""
        ratio = "" if ns is None else f"{bound}{(os_ or watchdogs['old']) / max(ns, 1e-3):.1f}x"
        old, new = cell(oc, os_, watchdogs["old"]), cell(nc, ns, watchdogs["new"])
        table.append([f"{row}, silent endpoint", old, new, ratio])
    quick = " (--quick cap)" if args.quick else ""
    print(f"\nold = {args.old} ({OLD_COMMIT}), new = {NEW}; moto on 127.0.0.1")
    print(f"mv: median of {args.repeats} moves, {n + 1} keys each; silent-endpoint calls each on a"
          f" fresh mount (--cache-ttl 0), watchdog old {watchdogs['old']:g} s{quick},"
          f" new {watchdogs['new']:g} s\n")  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for line in table:
        print("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200 chunks; old (b) watchdog 90 s")
    p.add_argument("--old", type=Path, default=Path("/tmp/n5fs-old"), help="old code tree")
    p.add_argument("--chunks", type=int, default=None, help="chunks of the moved array")
    p.add_argument("--repeats", type=int, default=3, help="moves (median of)")
    p.add_argument("--watchdog", type=float, default=600, help="seconds per silent call")
    args = p.parse_args(argv)
    n = args.chunks or (200 if args.quick else 1_000)
    watchdogs = {"old": 90.0 if args.quick else args.watchdog, "new": args.watchdog}
    began = time.monotonic()
    os.environ.update(AWS_ENV)  # for boto3 here
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks still run
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-faults-"))
    moves: dict[str, list[float]] = {}
    silent: dict[str, Silent] = {}
    try:
        with moto_server() as endpoint:
            s3 = boto3.client("s3", endpoint_url=endpoint)
            for tree in (Tree("old", old_tree(args.old), tmp), Tree("new", NEW, tmp)):
                try:
                    moves[tree.name] = bench_move(tree, s3, endpoint, n, args.repeats)
                    silent[tree.name] = bench_silent(tree, s3, endpoint, watchdogs[tree.name])
                finally:
                    tree.unmount_all()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(args, n, watchdogs, moves, silent)
    print(f"\ntotal {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
