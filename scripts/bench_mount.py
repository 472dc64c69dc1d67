"""Mount benchmark: n5fs against direct access, a bare mfusepy passthrough
and the peers (fsspec's FUSE, rclone mount, s3fs-fuse), on the file store and on S3 (a moto
server on 127.0.0.1, port 0), in one run.

Every figure is measured in this run and printed as one table of ratios with n5fs's
targets beside them (compared, never asserted). Columns: ``direct`` (the backing directory;
boto3 or TensorStore's s3 driver on S3), ``pt`` and ``pt+kc`` (a minimal multithreaded
mfusepy passthrough on libfuse 3, without and with ``kernel_cache``; same attr/entry/negative
timeouts as n5fs), ``n5fs`` (``-o ro``: kernel_cache), ``n5fs-rw``, and the peers ``fsspec``
(in ``--peer-python``), ``rclone`` and ``s3fs`` (S3 only), mounted read-only with the flags
scripts/bench_peers.py lists and explains; a peer that cannot run says why in its cells.
Where the target is against "the best peer", the ratio is against the fastest peer that
ran on that row, named in the ratio cell. Cold = a fresh mount after ``echo 3 >
/proc/sys/vm/drop_caches`` (or, without root, ``posix_fadvise(DONTNEED)`` on every backing
file); warm = best of ``--rounds`` repeats on the same mount. Each measured call runs under a
watchdog (``--timeout``; ``--peer-timeout`` for the peers) that kills the mount daemons when
it overruns, so a hung or slow mount fails the call with ENOTCONN and its cell reads "> N s"
instead of hanging the script; every mount is unmounted at the end, and the generated data
(a temp dir) removed. The data and workloads live in scripts/bench_workloads.py.

    python scripts/bench_mount.py                 # full size (~1.6 GiB of data)
    python scripts/bench_mount.py --quick         # small smoke run
    python scripts/bench_mount.py --only read --skip-s3
    python scripts/bench_mount.py --peer-python /path/to/venv/bin/python   # fsspec + s3fs there
    python scripts/bench_mount.py --skip-file --only list,stat --columns direct,n5fs --gib 0.02
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

if str(Path(__file__).resolve().parent) not in sys.path:  # imported, not run: find siblings
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import (
    PEERS,
    Mount,
    Mounts,
    Variant,
    n5fs_variant,
    passthrough_variant,
    peer_variants,
    status_kib,
)
from bench_workloads import (
    AWS_ENV,
    BenchError,
    Data,
    MiB,
    Workload,
    drop_caches,
    file_workloads,
    make_data,
    parse_grid,
    read_files,
    run_tool,
    s3_client,
    s3_workloads,
    upload,
)

from n5fs.fuse_front.options import parse_size
from n5fs.testing.moto_server import moto_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

GROUPS = ("read", "list", "stat", "tensorstore", "write", "rss")


# == measuring =====================================================================================


@dataclass
class Bench:
    args: argparse.Namespace
    mounts: Mounts
    cells: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (row, store, col)
    seconds: dict[tuple[str, str, str], float] = field(default_factory=dict)
    cache_note: str = ""

    def record(self, row: str, store: str, col: str, value: float, nbytes: int) -> None:
        self.seconds[(row, store, col)] = value
        self.cells[(row, store, col)] = (
            f"{nbytes / value / 1e6:.0f} MB/s" if nbytes else f"{value:.3g} s"
        )

    def limit(self, col: str) -> float:
        """The watchdog's time for one call of the column ``col``."""
        return float(self.args.peer_timeout if col in PEERS else self.args.timeout)

    def failed(self, row: str, store: str, col: str, exc: BenchError) -> None:
        """A watchdog overrun is a lower bound on the time (ratios then read "> x")."""
        if str(exc).startswith("watchdog"):
            self.seconds[(row, store, col)] = self.limit(col)
            self.cells[(row, store, col)] = f"> {self.limit(col):g} s"
        else:
            self.cells[(row, store, col)] = "failed"

    def timed(self, what: str, call: Callable[[], int], expect: int | None,
              seconds: float | None = None) -> float:  # fmt: skip
        seconds = self.args.timeout if seconds is None else seconds
        with self.mounts.guard(what, seconds):
            start = time.perf_counter()
            try:
                got = call()
            except Exception as exc:  # any failure is a cell of the table, not the end
                fired = self.mounts.fired
                why = f"watchdog > {seconds:g} s" if fired else f"{type(exc).__name__}: {exc}"
                raise BenchError(why) from exc
            elapsed = time.perf_counter() - start
        if expect is not None and got != expect:
            raise BenchError(f"{what}: wrong answer {got}, want {expect}")
        return elapsed

    @contextlib.contextmanager
    def mounted(self, variant: Variant, direct_root: Path) -> Iterator[Mount]:
        if variant.argv is None:
            yield Mount(direct_root)
            return
        mount = self.mounts.start(variant)
        try:
            yield mount
        finally:
            self.mounts.stop(mount)

    def workload(self, load: Workload, store: str, variants: list[Variant], data: Data) -> None:
        cold, warm = f"{load.label} · cold", f"{load.label} · warm"
        for variant in variants:
            if variant.missing:
                for row in (cold, warm) if load.warm else (cold,):
                    self.cells[(row, store, variant.name)] = variant.missing
                continue
            what = f"{store} {load.label} via {variant.name}"
            timed = partial(self.timed, what, expect=load.expect, seconds=self.limit(variant.name))
            try:
                with self.mounted(variant, data.root) as mount:
                    call = load.direct if variant.argv is None and load.direct else None
                    run = call or partial(load.run, mount.path)
                    self.cache_note = drop_caches(data)
                    self.record(cold, store, variant.name, timed(run), load.nbytes)
                    if load.warm:
                        rounds = self.args.rounds if store == "file" else self.args.s3_rounds
                        best = min(timed(run) for _ in range(rounds))
                        self.record(warm, store, variant.name, best, load.nbytes)
            except BenchError as exc:
                self.failed(cold, store, variant.name, exc)
                print(f"  {what}: {exc}", flush=True)
            print(f"  {what}: cold {self.cells.get((cold, store, variant.name))}"
                  f", warm {self.cells.get((warm, store, variant.name), '-')}", flush=True)  # fmt: skip

    def writes(self, data: Data, tmp: Path) -> None:
        """``cp -r`` of each N5 dataset into an empty backing directory, directly or through
        a read-write mount, the variants taking turns each round (so drift hits all alike);
        each copy is compared byte for byte with its source afterwards."""
        variants = [
            Variant("direct"),
            passthrough_variant("pt", tmp / "w-pt"),
            passthrough_variant("pt+fsync", tmp / "w-pt+fsync", "--durable"),
            n5fs_variant("n5fs-rw", str(tmp / "w-n5fs-rw")),
        ]
        plain = plain_files(data)
        sets = (("n5raw", data.raw_bytes, data.raw), ("n5gzip", data.gzip_bytes, data.gzip),
                ("plain", sum((data.root / f).stat().st_size for f in plain), plain))  # fmt: skip
        for name, nbytes, files in sets:
            row = f"cp -r {len(files)} plain files" if name == "plain" else (
                f"cp -r N5 {name[2:]} (validated)")  # fmt: skip
            read_files(data.root, files)  # source warm
            backs = {v.name: tmp / f"w-{v.name}" for v in variants}
            times: dict[str, list[float]] = {v.name: [] for v in variants}
            try:
                with contextlib.ExitStack() as stack:
                    for v in variants:
                        backs[v.name].mkdir()
                    mounts = {v.name: stack.enter_context(self.mounted(v, backs[v.name]))
                              for v in variants}  # fmt: skip
                    for r in range(self.args.rounds):
                        for v in variants:
                            self.copy_once(row, v.name, mounts[v.name], name, r, data, times)
                    stats = self.mount_stats(mounts["n5fs-rw"])
                for v in variants:
                    if times[v.name]:
                        self.check_copy(data.root / name, backs[v.name], len(times[v.name]))
                        self.record(row, "file", v.name, min(times[v.name]), nbytes)
                print(f"  file {row}: "
                      + ", ".join(f"{v.name} {self.cells.get((row, 'file', v.name))}"
                                  for v in variants) + f" {stats}", flush=True)  # fmt: skip
            except BenchError as exc:
                print(f"  file {row}: {exc}", flush=True)
            finally:
                for back in backs.values():
                    shutil.rmtree(back, ignore_errors=True)
        shutil.rmtree(data.root / "plain", ignore_errors=True)  # not part of any other workload

    def copy_once(self, row: str, col: str, mount: Mount, name: str, r: int, data: Data,
                  times: dict[str, list[float]]) -> None:  # fmt: skip
        cp = partial(run_tool, "cp", "-r", str(data.root / name), str(mount.path / f"{name}-{r}"))
        os.sync()  # no dirty backlog of an earlier copy throttles this one
        try:
            times[col].append(self.timed(f"{row} via {col}", cp, None))
        except BenchError as exc:
            self.failed(row, "file", col, exc)
            print(f"  file {row} via {col}: {exc}", flush=True)

    @staticmethod
    def mount_stats(mount: Mount) -> str:
        path = mount.path / ".n5fs" / "stats.json"
        if mount.proc is None or not path.exists():
            return ""
        stats = json.loads(path.read_text())
        return f"(commits {stats['commits']}, rejections {stats['rejections']})"

    @staticmethod
    def check_copy(src: Path, back: Path, copies: int) -> None:
        for r in range(copies):
            dst = back / f"{src.name}-{r}"
            for path in src.rglob("*"):
                if path.is_file() and not filecmp.cmp(path, dst / path.relative_to(src), False):
                    raise BenchError(f"{dst} differs from {src} at {path.relative_to(src)}")

    def rss(self, data: Data, store: str, source: str, sizes: list[str]) -> None:
        """Peak RSS of the daemon over a sequential then a 4-thread read of both N5 datasets."""
        for size in sizes:
            row = f"peak RSS, --cache-size {size}"
            variant = n5fs_variant("n5fs", source, "-o", "ro", "--cache-size", size)
            try:
                with self.mounted(variant, data.root) as mount:
                    assert mount.proc is not None
                    base = status_kib(mount.proc.pid)["VmRSS"]
                    both = data.raw + data.gzip
                    expect = data.raw_bytes + data.gzip_bytes
                    drop_caches(data)
                    self.timed(row, partial(read_files, mount.path, both), expect)
                    drop_caches(data)
                    self.timed(row, partial(read_files, mount.path, both, 4), expect)
                    peak = status_kib(mount.proc.pid)["VmHWM"]
                limit = parse_size(size) / MiB + 150
                self.cells[(row, store, "n5fs")] = f"{peak / 1024:.0f} MiB"
                self.cells[(row, store, "ratio")] = f"start {base / 1024:.0f} MiB"
                self.cells[(row, store, "target")] = f"<= {limit:.0f} MiB"
                self.cells[(row, store, "met")] = "yes" if peak / 1024 <= limit else "NO"
            except BenchError as exc:
                self.cells[(row, store, "n5fs")] = "failed"
                print(f"  {store} {row}: {exc}", flush=True)
            print(f"  {store} {row}: {self.cells.get((row, store, 'n5fs'))}", flush=True)


# == the table =====================================================================================

COLUMNS = ("direct", "pt", "pt+kc", "pt+fsync", "n5fs", "n5fs-rw", *PEERS)
BEST_PEER = "best peer"  # a reference column: the fastest of the peers that ran on the row
#: (reference column, speed-up target t_ref / t_n5fs, n5fs's time limit in seconds)
Target = tuple[str, float | None, float | None]
#: row prefix -> store -> target; "read N5" rows are told apart by cold/warm in target_of
TARGETS: dict[str, dict[str, Target]] = {
    "read N5": {"s3": (BEST_PEER, 1.3, None)},
    "read ": {"file": ("pt", 1.0, None), "s3": (BEST_PEER, 1.5, None)},  # small files
    "find": {"file": ("pt", 1.0, None), "s3": (BEST_PEER, 10.0, 10.0)},
    "ls -lR": {"file": ("pt", 1.0, None), "s3": (BEST_PEER, 10.0, 10.0)},
    "stat storm": {"file": (BEST_PEER, None, None), "s3": (BEST_PEER, None, 5.0)},
    "TensorStore": {"file": ("direct", None, None), "s3": ("direct", None, None)},
    "cp -r N5 raw": {"file": ("pt", 0.8, None)},
    "cp -r N5 gzip": {"file": ("pt", 0.5, None)},
    "cp -r": {"file": ("pt", 0.8, None)},  # plain files
}


def plain_files(data: Data) -> list[str]:
    """The raw N5 blocks as plain files (hard links in ``plain/``, no ``attributes.json``):
    what a mount commits unvalidated, as a passthrough would."""
    folder = data.root / "plain"
    folder.mkdir(exist_ok=True)
    names = []
    for i, rel in enumerate(f for f in data.raw if not f.endswith("attributes.json")):
        link = folder / f"block-{i:05d}.bin"
        if not link.exists():
            os.link(data.root / rel, link)
        names.append(f"plain/{link.name}")
    return names


def target_of(row: str, store: str) -> Target | None:
    if row.startswith("read N5") and store == "file":
        return ("pt+kc", 0.9, None) if row.endswith("cold") else ("direct", 0.5, None)
    spec = next((spec for prefix, spec in TARGETS.items() if row.startswith(prefix)), {})
    return spec.get(store)


def reference(bench: Bench, row: str, store: str, ref: str) -> tuple[str, float] | None:
    """The column to compare with and its seconds; for BEST_PEER, the fastest peer that ran
    (a peer the watchdog stopped counts with its time limit, a lower bound)."""
    refs = PEERS if ref == BEST_PEER else (ref,)
    ran = [(bench.seconds[(row, store, c)], c) for c in refs if (row, store, c) in bench.seconds]
    if not ran:
        return None
    seconds, col = min(ran)
    return col, seconds


def fill_ratios(bench: Bench, rows: list[tuple[str, str]]) -> None:
    for row, store in rows:
        spec = target_of(row, store)
        if spec is None:
            continue
        ref, target, limit = spec
        mine = bench.seconds.get((row, store, "n5fs-rw" if row.startswith("cp") else "n5fs"))
        found = reference(bench, row, store, ref)
        if mine is None or found is None:
            continue
        col, theirs = found
        ratio = theirs / mine
        bound = "> " if bench.cells.get((row, store, col), "").startswith(">") else ""
        bench.cells[(row, store, "ratio")] = f"{bound}{ratio:.2f}x vs {col}"
        wanted = [f">= {target:g}x {ref}"] if target is not None else []
        met = target is None or ratio >= target
        if limit is not None:
            wanted.append(f"<= {limit:g} s")
            met = met and mine <= limit
        if wanted:
            bench.cells[(row, store, "target")] = ", ".join(wanted)
            bench.cells[(row, store, "met")] = "yes" if met else "NO"


def print_table(bench: Bench) -> None:
    rows: list[tuple[str, str]] = []
    for row, store, _ in bench.cells:
        if (row, store) not in rows:
            rows.append((row, store))
    fill_ratios(bench, rows)
    heads = ("workload", "store", *COLUMNS, "n5fs ratio", "target", "met")
    table = [
        [row, store, *(bench.cells.get((row, store, c), "") for c in (*COLUMNS, "ratio", "target", "met"))]
        for row, store in rows
    ]  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(heads, *table, strict=True)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rounds = f"{bench.args.rounds} (S3: {bench.args.s3_rounds})"
    print(f"\ncold = fresh mount after {bench.cache_note}; warm = best of {rounds}")
    print(f"{os.cpu_count()} CPUs, load average now {load} (other work on the machine skews)")
    print("ratios are speeds (t_ref / t_n5fs; cp -r uses n5fs-rw); RSS rows show VmHWM\n")
    for line in (heads, *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


# == main ==========================================================================================


def variants_for(group: str, store: str, source: str, data: Data, peers: list[Variant]
                 ) -> list[Variant]:  # fmt: skip
    direct, ro = Variant("direct"), n5fs_variant("n5fs", source, "-o", "ro")
    if store == "s3":
        return [direct, ro, *peers]
    pt = passthrough_variant("pt", data.root)
    if group == "read":
        kc = passthrough_variant("pt+kc", data.root, "--kernel-cache")
        return [direct, pt, kc, ro, n5fs_variant("n5fs-rw", source), *peers]
    return [direct, pt, ro, *peers]


def chosen(args: argparse.Namespace, group: str) -> bool:
    return args.only is None or group in args.only


def wanted(args: argparse.Namespace, variants: list[Variant]) -> list[Variant]:
    return [v for v in variants if args.columns is None or v.name in args.columns]


def run_store(bench: Bench, store: str, data: Data, loads: list[Workload], source: str,
              peers: list[Variant]) -> None:  # fmt: skip
    args = bench.args
    if peers:
        print(f"peers on {store}: " + "; ".join(f"{v.name}: {v.note}" for v in peers), flush=True)
    for load in loads:
        if chosen(args, load.group):
            variants = wanted(args, variants_for(load.group, store, source, data, peers))
            bench.workload(load, store, variants, data)
    if chosen(args, "rss") and wanted(args, [Variant("n5fs")]):
        sizes = args.cache_sizes.split(",") if store == "file" else ["256M"]
        bench.rss(data, store, source, sizes)


def groups(text: str) -> set[str]:
    chosen = set(text.split(","))
    if chosen - set(GROUPS):
        raise argparse.ArgumentTypeError(f"not a group: {sorted(chosen - set(GROUPS))}")
    return chosen


def columns(text: str) -> set[str]:
    chosen = set(text.split(","))
    if chosen - set(COLUMNS):
        raise argparse.ArgumentTypeError(f"not a column: {sorted(chosen - set(COLUMNS))}")
    return chosen


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--skip-file", action="store_true", help="measure S3 only")
    p.add_argument("--only", type=groups, default=None,
                   help=f"workload groups, comma-separated: {','.join(GROUPS)}")  # fmt: skip
    p.add_argument("--columns", type=columns, default=None,
                   help=f"columns of the non-write rows, comma-separated (default all): {','.join(COLUMNS)}")  # fmt: skip
    p.add_argument("--gib", type=float, default=1.0, help="size of each N5 dataset (decoded)")
    p.add_argument("--zarr-grid", type=parse_grid, default=(40, 40, 32),
                   help="the Zarr2 chunk tree's stored chunks per axis (default: 51,200 chunks "
                   "in 1 + 40 + 1,600 folders)")  # fmt: skip
    p.add_argument("--storm-keys", type=int, default=10_000, help="stat storm keys, 90%% absent")
    p.add_argument("--sparse-side", type=int, default=100, help="grid side: side^2 keys")
    p.add_argument("--s3-gib", type=float, default=None, help="scale the S3 N5 data down")
    p.add_argument("--s3-zarr-grid", type=parse_grid, default=None,
                   help="scale the S3 chunk tree down")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="warm repeats (best of)")
    p.add_argument("--s3-rounds", type=int, default=1, help="warm repeats on S3 (slow on moto)")
    p.add_argument("--timeout", type=float, default=600, help="watchdog per measured call, s")
    p.add_argument("--peer-timeout", type=float, default=None,
                   help="watchdog per call of a peer, s (default: --timeout)")  # fmt: skip
    p.add_argument("--cache-sizes", default="64M,256M,1G", help="--cache-size values for RSS")
    p.add_argument("--peer-python", default=sys.executable, help="interpreter for fsspec FUSE")
    p.add_argument("--tmp", default=None, help="where the temp dir goes (default: system tmp)")
    args = p.parse_args(argv)
    if args.quick:
        args.gib, args.zarr_grid, args.sparse_side = 1 / 16, (8, 8, 32), 30
        args.storm_keys = 1_000
        args.rounds, args.timeout, args.cache_sizes = 2, 120, "64M"
    if args.peer_timeout is None:
        args.peer_timeout = args.timeout
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-mount-", dir=args.tmp))
    env = {**os.environ, **AWS_ENV, "N5FS_STATE_DIR": str(tmp / "state")}
    os.environ.update(AWS_ENV)  # for TensorStore's s3 driver in this process
    bench = Bench(args, Mounts(tmp, env))
    try:
        data = make_data(tmp / "data", args.gib, args.zarr_grid, args.sparse_side, args.storm_keys)
        if not args.skip_file and args.only != {"write"}:
            peers = wanted(args, peer_variants(args.peer_python, "file", str(data.root)))
            run_store(bench, "file", data, file_workloads(data), str(data.root), peers)
        if chosen(args, "write") and not args.skip_file:
            bench.writes(data, tmp)
        if not args.skip_s3 and args.only != {"write"}:
            run_s3(bench, data, tmp)
        print_table(bench)
    finally:
        bench.mounts.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def run_s3(bench: Bench, data: Data, tmp: Path) -> None:
    args = bench.args
    gib, grid = args.s3_gib or args.gib, args.s3_zarr_grid or args.zarr_grid
    if (gib, grid) != (args.gib, args.zarr_grid):
        print(f"S3 runs scaled down: N5 {gib:g} GiB, Zarr2 chunk tree {grid}")
        data = make_data(tmp / "s3data", gib, grid, args.sparse_side, args.storm_keys)
    with moto_server() as endpoint:
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        upload(data, s3_client(endpoint), bucket)
        source = json.dumps({"driver": "s3", "bucket": bucket, "path": "", "endpoint": endpoint,
                             "aws_region": "us-east-1"})  # fmt: skip
        peers = wanted(args, peer_variants(args.peer_python, "s3", bucket, endpoint))
        run_store(bench, "s3", data, s3_workloads(data, endpoint, bucket), source, peers)


if __name__ == "__main__":
    raise SystemExit(main())
