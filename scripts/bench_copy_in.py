"""Where a validated copy-in spends its time (the mount benchmark's "validated cp -r gzip N5" row):
per file, the writes against the ``close()`` that waits for the chunk's check, and the
daemon's CPU, n5fs against the bare mfusepy passthrough, variants taking turns on fresh
mounts.

Why beside ``bench_mount.py``: that script gives one MB/s figure per variant; to judge a
change of the streaming check (``n5fs/gateway/commit/prevalidate.py``) one needs to know whether the
check kept pace with the writes (``close`` then waits for the last piece only) or fell behind
(``close`` waits for most of the decode), and whether the daemon was short of CPU (its CPU
seconds near the wall time: one core's worth, shared by the FUSE threads and the check).

The blocks are the ones ``bench_mount.py`` copies (TensorStore-written gzip N5 blocks of
noisy uint16); the backing folder is on ``/dev/shm`` when it exists, so the disk plays no
part. Each file is written the way ``cp`` writes it: create, sequential writes of
``--write-size`` bytes, close.

    python scripts/bench_copy_in.py                  # 0.25 GiB of gzip blocks, 3 rounds
    python scripts/bench_copy_in.py --raw --gib 0.5  # the raw blocks instead

Prints each round, then per variant the median MB/s, the write and close time per file and
the daemon's CPU seconds per wall second, and n5fs's speed against the passthrough's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # imported, not run: find siblings
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import Mounts, Variant, n5fs_variant, passthrough_variant
from bench_workloads import write_n5_pair


@dataclass
class Round:
    seconds: float
    write_ms: float  # per file
    close_ms: float  # per file
    cpu_per_wall: float  # the daemon's CPU seconds per wall second

    def mb_per_s(self, total: int) -> float:
        return total / 1e6 / self.seconds


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def copy_in(blocks: list[Path], src: Path, dst: Path, write_size: int, pid: int) -> Round:
    """Copy ``blocks`` (below ``src``) to the same names below ``dst``; the metadata files are
    copied first, untimed, so each block lands in a known dataset."""
    for attrs in src.rglob("attributes.json"):
        target = dst / attrs.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(attrs, target)
    datas = [(dst / b.relative_to(src), b.read_bytes()) for b in blocks]
    for path, _ in datas:
        path.parent.mkdir(parents=True, exist_ok=True)
    writing = closing = 0.0
    cpu0, start = process_cpu(pid), time.perf_counter()
    for path, data in datas:
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        view = memoryview(data)
        for offset in range(0, len(data), write_size):
            piece = view[offset : offset + write_size]
            while piece:  # a short write goes on where it stopped
                piece = piece[os.write(fd, piece) :]
        t1 = time.perf_counter()
        os.close(fd)  # n5fs: the commit, after the chunk's check
        closing += time.perf_counter() - t1
        writing += t1 - t0
    seconds = time.perf_counter() - start
    cpu = process_cpu(pid) - cpu0
    n = len(datas)
    return Round(seconds, writing / n * 1e3, closing / n * 1e3, cpu / seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=0.25, help="decoded size of the N5 dataset")
    p.add_argument("--raw", action="store_true", help="copy the raw blocks, not the gzip ones")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--write-size", type=int, default=128 << 10, help="bytes per write(2)")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-copy-"))
    shm = Path("/dev/shm")
    backing_root = Path(
        tempfile.mkdtemp(prefix="n5fs-bench-copy-", dir=shm if shm.is_dir() else tmp)
    )
    os.chdir(tmp)  # ``python -m n5fs`` must not find a checkout in the working directory
    mounts = Mounts(tmp, {**os.environ, "N5FS_STATE_DIR": str(tmp / "state")})
    try:
        src = tmp / "src"
        write_n5_pair(src, args.gib)
        dataset = src / ("n5raw" if args.raw else "n5gzip")
        blocks = sorted(
            b for b in dataset.rglob("*") if b.is_file() and b.name != "attributes.json"
        )
        total = sum(b.stat().st_size for b in blocks)
        print(
            f"{len(blocks)} {dataset.name} blocks, {total / 1e6:.0f} MB, writes of {args.write_size} B"
        )
        results: dict[str, list[Round]] = {"pt": [], "n5fs": []}
        for round_ in range(args.rounds):
            for name, rounds in results.items():
                backing = backing_root / f"{name}-{round_}"
                backing.mkdir()
                variant: Variant = (
                    passthrough_variant("pt", backing)
                    if name == "pt"
                    else n5fs_variant("n5fs", str(backing))
                )
                mount = mounts.start(variant)
                try:
                    assert mount.proc is not None
                    got = copy_in(blocks, src, mount.path, args.write_size, mount.proc.pid)
                finally:
                    mounts.stop(mount)
                    shutil.rmtree(backing, ignore_errors=True)
                rounds.append(got)
                print(
                    f"round {round_ + 1} {name:5} {got.mb_per_s(total):6.0f} MB/s  write "
                    f"{got.write_ms:5.1f} ms/file  close {got.close_ms:5.1f} ms/file  "
                    f"daemon {got.cpu_per_wall:.2f} CPU s/s",
                    flush=True,
                )
        print(f"\n{'variant':7} {'MB/s':>6} {'write ms':>9} {'close ms':>9} {'CPU s/s':>8}")
        medians = {}
        for name, rounds in results.items():
            medians[name] = statistics.median(r.mb_per_s(total) for r in rounds)
            print(
                f"{name:7} {medians[name]:6.0f} "
                f"{statistics.median(r.write_ms for r in rounds):9.1f} "
                f"{statistics.median(r.close_ms for r in rounds):9.1f} "
                f"{statistics.median(r.cpu_per_wall for r in rounds):8.2f}"
            )
        print(f"\nn5fs / pt: {medians['n5fs'] / medians['pt']:.2f}x (median MB/s)")
    finally:
        mounts.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(backing_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
