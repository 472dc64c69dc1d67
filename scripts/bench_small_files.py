"""A/B benchmark of the per-file path (the mount benchmark's "read 10k small files"): variants
take turns over one chunk tree, each round on a fresh mount, so the load of the moment hits
them alike.

Why beside ``bench_mount.py``: that script measures every row once per variant, minutes
apart, and on this 2-core VM the small-file row swings by 2x with the disk and the load
(the figures of its runs disagree more than the changes it should judge). Here the backing
files stay in the page cache (``--cold`` drops it before every round instead), so what is
timed is the FUSE calls: a lookup, an open, a read and a release per file (n5fs also sends no
FLUSH for a read-only descriptor). ``--base DIR`` adds the n5fs of another checkout (a ``git
worktree`` of the commit to compare with) as the columns ``base-ro``/``base-rw``.

    python scripts/bench_small_files.py                       # pt, pt+kc, n5fs ro and rw
    python scripts/bench_small_files.py --base /tmp/n5fs-base --rounds 5

Prints each round, then per variant the median and best time and the ratio against the
passthrough (``pt``: a bare mfusepy passthrough, the Python-FUSE ceiling; >1 is faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # imported, not run: find siblings
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import Mounts, Variant, n5fs_variant, passthrough_variant
from bench_workloads import SMALL_FILES, write_zarr


def chunk_files(root: Path, count: int) -> list[str]:
    """``count`` chunk files of the tree, spread over it, in name order (as bench_mount)."""
    chunks = sorted(
        p.relative_to(root).as_posix()
        for p in (root / "zarr").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )
    return chunks[:: max(1, len(chunks) // count)][:count]


def read_all(root: Path, names: list[str]) -> int:
    view, total = memoryview(bytearray(1 << 20)), 0
    for name in names:
        with open(root / name, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total


def variants(data: Path, base: str | None) -> list[Variant]:
    out = [
        passthrough_variant("pt", data),
        passthrough_variant("pt+kc", data, "--kernel-cache"),
        n5fs_variant("n5fs-ro", str(data), "-o", "ro"),
        n5fs_variant("n5fs-rw", str(data)),
    ]
    if base:
        env = {"PYTHONPATH": base}
        out += [
            Variant("base-ro", n5fs_variant("b", str(data), "-o", "ro").argv, env=env),
            Variant("base-rw", n5fs_variant("b", str(data)).argv, env=env),
        ]
    return out


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--files", type=int, default=SMALL_FILES)
    p.add_argument("--grid", default="40,40,32", help="stored chunks per axis of the tree")
    p.add_argument("--base", default=None, help="another checkout's root, for base-* columns")
    p.add_argument("--cold", action="store_true", help="drop the page cache before each round")
    p.add_argument("--only", default=None, help="comma-separated variant names")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-small-"))
    os.chdir(tmp)  # ``python -m n5fs`` must not find a checkout in the working directory
    mounts = Mounts(tmp, {**os.environ, "N5FS_STATE_DIR": str(tmp / "state")})
    try:
        data = tmp / "data"
        grid = tuple(int(x) for x in args.grid.split(","))
        write_zarr(data, (grid[0], grid[1], grid[2]))
        names = chunk_files(data, args.files)
        expected = read_all(data, names)
        chosen = [
            v for v in variants(data, args.base) if not args.only or v.name in args.only.split(",")
        ]
        times: dict[str, list[float]] = {v.name: [] for v in chosen}
        print(f"{len(names)} files, {expected} bytes; variants {', '.join(times)}")
        for round_ in range(args.rounds):
            for variant in chosen:
                mount = mounts.start(variant)
                try:
                    if args.cold:
                        drop_caches()
                    start = time.perf_counter()
                    seen = read_all(mount.path, names)
                    elapsed = time.perf_counter() - start
                finally:
                    mounts.stop(mount)
                if seen != expected:
                    raise SystemExit(f"{variant.name} read {seen} bytes, not {expected}")
                times[variant.name].append(elapsed)
                print(f"round {round_ + 1} {variant.name:8} {elapsed:6.2f} s", flush=True)
        ref = statistics.median(times["pt"]) if "pt" in times else None
        print(f"\n{'variant':8} {'median':>8} {'best':>8}  speed vs pt (median)")
        for name, got in times.items():
            med = statistics.median(got)
            ratio = f"{ref / med:.2f}x" if ref else ""
            print(f"{name:8} {med:7.2f}s {min(got):7.2f}s  {ratio}")
    finally:
        mounts.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
