"""Arrays of a million chunks on a local file store: ``ls`` of one flat chunk folder and
``find`` over a nested chunk tree, through n5fs (read-only and read-write mounts) beside plain
access and the bare mfusepy passthrough (the Python-FUSE ceiling, ``bench_peers.py``), in one
run; the daemon's peak RSS after each; and the bytes one cached listing entry costs.

The tree (made in a temp dir, deleted at the end; ``--tree DIR`` reuses one and keeps it):
two Zarr v2 arrays of one-byte chunks, each of ``--chunks`` chunks on a square grid: ``flat``
(dimension_separator ".": every chunk in one folder) and ``nested`` ("/": one folder per row,
``sqrt(N)`` folders of ``sqrt(N)`` chunks each).

Each mount is fresh (nothing cached) and runs, in order: ``ls -f flat`` (no sort),
``ls flat`` (sorted; the second listing, within the cache TTL), ``find nested`` (cold),
then reads the daemon's ``VmHWM`` from ``/proc/<pid>/status``. Plain access runs first and
last, and the best of the two is the reference, so page-cache warmth favours nobody.

The bytes per cached entry are measured in process (``tracemalloc``): a gateway lists the
flat folder, and what it still holds once the listing is cached, over the entries held.

    PYTHONPATH=. python scripts/bench_million.py [--chunks 1000000] [--tree DIR]

To measure another checkout, run from outside any checkout with PYTHONPATH naming it: the
daemons run ``python -m n5fs``, which imports from the current directory first.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # find the sibling scripts
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import Mounts, Variant, n5fs_variant, passthrough_variant, status_kib
from bench_workloads import BenchError

ARRAYS = ("flat", "nested")
#: every measured call gets this long before the watchdog kills the daemons
GUARD = 900.0


def make_tree(root: Path, chunks: int) -> int:
    """Both arrays under ``root`` (a square grid of at least ``chunks`` chunks each); returns
    the chunks per array. Written with bare ``os.open``/``os.write``: a million files take a
    minute, not ten."""
    side = max(1, round(chunks**0.5))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for name, sep in (("flat", "."), ("nested", "/")):
        arr = root / name
        arr.mkdir(parents=True, exist_ok=True)
        zarray = {"zarr_format": 2, "shape": [side, side], "chunks": [1, 1], "dtype": "|u1",
                  "compressor": None, "fill_value": 0, "order": "C", "filters": None,
                  "dimension_separator": sep}  # fmt: skip
        (arr / ".zarray").write_text(json.dumps(zarray))
        for i in range(side):
            if sep == "/":
                (arr / str(i)).mkdir(exist_ok=True)
            head = f"{arr}/{i}{sep}"
            for j in range(side):
                fd = os.open(f"{head}{j}", flags, 0o644)
                os.write(fd, b"\x01")
                os.close(fd)
    return side * side


def run(argv: list[str], cwd: Path) -> tuple[float, int]:
    """Seconds ``argv`` took in ``cwd``, and the lines it printed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, check=True)
    seconds = time.perf_counter() - start
    return seconds, proc.stdout.count(b"\n")


WORKLOADS = (
    ("ls -f flat", ["ls", "-f", "flat"]),
    ("ls flat", ["ls", "flat"]),
    ("find nested", ["find", "nested"]),
)


def measure(mounts: Mounts, variant: Variant, root: Path) -> dict[str, float]:
    """The workloads through one fresh mount (or on ``root`` itself); seconds per workload,
    and ``rss_mb`` (the daemon's peak)."""
    mount = mounts.start(variant) if variant.argv is not None else None
    where = mount.path if mount is not None else root
    out: dict[str, float] = {}
    try:
        for what, argv in WORKLOADS:
            with mounts.guard(f"{what} on {variant.name}", GUARD):
                seconds, lines = run(argv, where)
            if mounts.fired:
                raise BenchError(f"{what} on {variant.name} overran {GUARD:g} s")
            out[what] = seconds
            print(f"  {variant.name:10} {what:12} {seconds:8.2f} s  ({lines} lines)", flush=True)
        if mount is not None and mount.proc is not None:
            out["rss_mb"] = status_kib(mount.proc.pid)["VmHWM"] / 1024
    finally:
        if mount is not None:
            mounts.stop(mount)
    return out


def bytes_per_entry(root: Path) -> tuple[float, int]:
    """What a gateway holds per entry of the flat folder's cached listing (tracemalloc)."""
    from n5fs.gateway import Gateway, GatewayConfig
    from n5fs.kvstore.file import FileStore

    gw = Gateway(FileStore(root), GatewayConfig(read_only=True))
    try:
        gw.stat("/flat")  # the root's listing and the detection of the array: not counted
        gc.collect()
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        listing = gw.view.entries("flat/")
        entries = len(listing.files) + len(listing.dirs)
        del listing
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert gw.view.listings.get("flat/") is not None, "the listing was not cached"
        return (after - before) / entries, entries
    finally:
        gw.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=1_000_000, help="chunks per array")
    parser.add_argument("--tree", type=Path, help="use (or make) the tree here and keep it")
    parser.add_argument("--only", default="", help="comma-separated columns to run")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-million-"))
    root = args.tree or tmp / "tree"
    mounts = Mounts(tmp, dict(os.environ))
    try:
        if not (root / "nested" / ".zarray").exists():
            start = time.perf_counter()
            chunks = make_tree(root, args.chunks)
            print(f"made 2 x {chunks} chunks in {time.perf_counter() - start:.0f} s")
        per_entry, entries = bytes_per_entry(root)
        print(f"cached listing: {per_entry:.1f} bytes per entry ({entries} entries)")
        source = str(root)
        variants = [
            Variant("plain"),
            passthrough_variant("pt", root),
            n5fs_variant("n5fs-ro", source, "--read-only"),
            n5fs_variant("n5fs-rw", source),
            Variant("plain2"),
        ]
        if args.only:
            wanted = set(args.only.split(","))
            variants = [v for v in variants if v.name in wanted]
        results = {v.name: measure(mounts, v, root) for v in variants}
        report(results, per_entry)
    finally:
        mounts.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(results: dict[str, dict[str, float]], per_entry: float) -> None:
    plains = [results[p] for p in ("plain", "plain2") if p in results]
    if plains:
        results["plain"] = {w: min(p[w] for p in plains) for w, _ in WORKLOADS}
    results.pop("plain2", None)
    pt = results.get("pt")
    print(f"\n{'':10}" + "".join(f"{w:>20}" for w, _ in WORKLOADS) + f"{'peak RSS':>10}")
    for name, row in results.items():
        cells = []
        for what, _ in WORKLOADS:
            ratio = f" ({row[what] / pt[what]:4.1f}x)" if pt and name != "pt" else ""
            cells.append(f"{row[what]:9.2f} s{ratio}".rjust(20))
        rss = f"{row['rss_mb']:7.0f} MB" if "rss_mb" in row else ""
        print(f"{name:10}" + "".join(cells) + f"{rss:>10}")
    print(f"ratios are against the passthrough (pt); cached listing: {per_entry:.1f} B/entry")


if __name__ == "__main__":
    raise SystemExit(main())
