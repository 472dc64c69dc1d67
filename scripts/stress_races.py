"""Races and memory of a read-write n5fs mount, measured from outside the daemon.

The script starts its own mounts (``python -m n5fs mount SOURCE MNT --foreground``) of a file
store, runs five bounded measurements against them, always unmounts, and prints one table:

1. renames      -- ``--threads`` threads each write ``name.<uuid>.partial`` and ``os.replace``
                   it into one folder (what zarr-python's LocalStore and dask do), ``--renames``
                   in all; counts the renames that fail (ENOENT was the race) and other errors.
2. readdir      -- writer threads commit files into a folder of ``--folder-files`` files while
                   lister threads list it; counts listings that fail (EIO was "dictionary
                   changed size during iteration" in the gateway).
3. zarr runs    -- ``--runs`` times, zarr-python 3 writes a fresh Zarr v2 array of 1,024 chunks
                   (256x256 uint8, 8x8 chunks) with ``--threads`` workers each writing a slab
                   (dask's to_zarr); a run fails on any exception or if the data reads back
                   different (through the mount or from the backing directory).
4. O_TRUNC RSS  -- a fresh mount (``--cache-size``) of a folder holding a ``--big-size`` file;
                   ``open(O_WRONLY|O_TRUNC)``, 10 bytes, close; the daemon's peak RSS (VmHWM)
                   before and after, and how long the open took.
5. truncate     -- ``truncate -s --truncate-size`` (the coreutils tool) of a new file in a fresh
                   mount; the backing file's size and allocated bytes (st_blocks * 512).

Mounts use ``--cache-ttl --ttl`` (default 1 s: listings expire during the runs, where the
rename race was). The daemons run with the lock-order checks on (``N5FS_DEBUG_LOCKS=1``,
:mod:`n5fs.locking`; ``--no-debug-locks`` turns them off); a last row counts the violations
their logs report (0 is the only good answer). Each measurement runs under a watchdog that kills the daemon if it overruns
(``--watchdog``), so a hung mount fails the calls instead of hanging the script.

Which n5fs runs is whatever ``python -m n5fs`` imports in the daemon's environment: this
interpreter, this environment (PYTHONPATH included), started in a neutral working directory.
The first line printed says which package file that is. To measure another checkout of the
code (e.g. the code before a fix):

    git -C /work/main worktree add /tmp/n5fs-before <commit>     # or: git archive | tar -x
    PYTHONPATH=/tmp/n5fs-before .venv/bin/python scripts/stress_races.py

Examples:

    python scripts/stress_races.py                          # all five, defaults (~2-4 min)
    python scripts/stress_races.py --only renames,readdir --renames 15000
    python scripts/stress_races.py --ttl 5 --runs 10 --source-dir /scratch/n5fs-stress
    python scripts/stress_races.py --only truncate --truncate-size 2G

Needs /dev/fuse and fusermount3, zarr-python 3 and numpy (the ``test`` extra), and free disk
for ``--truncate-size`` (an old daemon writes real zeros) in ``--source-dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1 << 20
MEASUREMENTS = ("renames", "readdir", "zarr", "rss", "truncate")
SHAPE, CHUNKS = (256, 256), (8, 8)  # 1,024 chunks


def parse_size(text: str) -> int:
    """``64M``, ``1G``, ``8G``, ``4096`` -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def vm_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field_name:
            return int(value.split()[0])
    raise RuntimeError(f"no {field_name} for pid {pid}")


def errname(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    if code:
        return errno.errorcode.get(code, str(code))
    return type(exc).__name__


# -- mounts --------------------------------------------------------------------------------------


@dataclass
class Mount:
    source: Path
    path: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Mounter:
    """Starts foreground mounts in a neutral cwd with this interpreter and environment; kills
    them when a watchdog fires; always unmounts."""

    work: Path
    ttl: str
    debug_locks: bool = True
    live: list[Mount] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "N5FS_STATE_DIR": str(self.work / "state")}
        if self.debug_locks:
            env["N5FS_DEBUG_LOCKS"] = "1"  # every lock checked against the lock order
        return env

    def lock_violations(self) -> Row:
        """What the daemons' logs say of the lock order (checked when ``debug_locks``)."""
        if not self.debug_locks:
            return Row("lock-order violations", "unchecked", "--no-debug-locks")
        logs = sorted(self.work.glob("*.log"))
        found = [
            line
            for log in logs
            for line in log.read_text(errors="replace").splitlines()
            if "LockOrderError" in line
        ]
        detail = found[0][:200] if found else f"N5FS_DEBUG_LOCKS=1 in {len(logs)} daemons"
        return Row("lock-order violations", str(len(found)), detail)

    def which_n5fs(self) -> str:
        """The n5fs package a daemon started by this script imports."""
        out = subprocess.run(
            [sys.executable, "-c", "import n5fs; print(n5fs.__file__)"],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def mount(self, source: Path, name: str, *opts: str) -> Mount:
        path = self.work / name
        path.mkdir()
        log = self.work / f"{name}.log"
        argv = [sys.executable, "-m", "n5fs", "mount", str(source), str(path), "--foreground"]
        argv += ["--cache-ttl", self.ttl, *opts]
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                argv, cwd=self.work, env=self.env, stdout=subprocess.DEVNULL, stderr=err
            )
        mount = Mount(source, path, proc, log)
        self.live.append(mount)
        deadline = time.monotonic() + 60
        while not mounted(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mount of {source} failed: {log.read_text()[-2000:]}")
            time.sleep(0.02)
        os.stat(path)
        return mount

    def unmount(self, mount: Mount) -> None:
        if mount.proc.poll() is None:
            mount.proc.send_signal(signal.SIGTERM)  # the daemon commits and unmounts
            try:
                mount.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                mount.proc.kill()
                mount.proc.wait()
        if mounted(mount.path):
            subprocess.run(["fusermount3", "-u", "-z", str(mount.path)], check=False, timeout=30)
        with contextlib.suppress(ValueError):
            self.live.remove(mount)

    def kill_all(self) -> None:
        for mount in self.live:
            if mount.proc.poll() is None:
                mount.proc.send_signal(signal.SIGKILL)

    def cleanup(self) -> None:
        for mount in list(self.live):
            self.unmount(mount)


@contextlib.contextmanager
def watchdog(mounter: Mounter, seconds: float):
    timer = threading.Timer(seconds, mounter.kill_all)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@dataclass
class Row:
    what: str
    result: str
    detail: str = ""


# -- 1. renames ----------------------------------------------------------------------------------


def measure_renames(folder: Path, threads: int, renames: int) -> Row:
    folder.mkdir()
    per_thread = max(1, renames // threads)
    failed: Counter[str] = Counter()
    other: Counter[str] = Counter()
    first: list[str] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for i in range(per_thread):
            name = f"c_{t}_{i % 500}"  # past 500, each replaces an earlier name
            tmp = folder / f"{name}.{uuid.uuid4().hex}.partial"
            try:
                with open(tmp, "xb") as f:
                    f.write(b"%d:%d" % (t, i))
            except OSError as exc:
                with lock:
                    other[f"write {errname(exc)}"] += 1
                continue
            try:
                os.replace(tmp, folder / name)
            except OSError as exc:
                with lock:
                    failed[errname(exc)] += 1
                    if len(first) < 3:
                        first.append(f"{name}: {exc.strerror}")

    start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(writer, range(threads)))
    took = time.monotonic() - start
    total = per_thread * threads
    expected = {f"c_{t}_{i}" for t in range(threads) for i in range(min(per_thread, 500))}
    missing = len(expected - set(os.listdir(folder)))
    bad = sum(failed.values())
    detail = ", ".join(f"{k} {v}" for k, v in sorted(failed.items())) or "none failed"
    if other:
        detail += "; other: " + ", ".join(f"{k} {v}" for k, v in sorted(other.items()))
    if missing:
        detail += f"; {missing} final names not listed"
    if first:
        detail += f"; e.g. {first[0]}"
    return Row(
        f"renames failing ({threads} threads)",
        f"{bad} of {total}",
        f"{detail}; {took:.1f} s ({total / took:.0f} renames/s)",
    )


# -- 2. readdir while committing -----------------------------------------------------------------


def measure_readdir(folder: Path, files: int, threads: int) -> Row:
    """Listers list a big folder (filled before the mount started: listing it takes a while)
    while writers commit new files into it."""
    writers, listers = max(1, threads - 2), 2
    per_writer = 400
    errors: Counter[str] = Counter()
    first: list[str] = []
    listings = [0]
    lock = threading.Lock()
    done = threading.Event()

    def writer(t: int) -> None:
        for i in range(per_writer):
            with contextlib.suppress(OSError):
                (folder / f"new_{t}_{i}").write_bytes(b"n")

    def lister() -> None:
        while not done.is_set():
            try:
                os.listdir(folder)
            except OSError as exc:
                with lock:
                    errors[errname(exc)] += 1
                    if not first:
                        first.append(str(exc))
            with lock:
                listings[0] += 1

    with ThreadPoolExecutor(writers + listers) as pool:
        watching = [pool.submit(lister) for _ in range(listers)]
        list(pool.map(writer, range(writers)))
        done.set()
        for future in watching:
            future.result()
    bad = sum(errors.values())
    detail = ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none failed"
    detail += f"; {writers} writers x {per_writer} commits into a folder of {files} files"
    return Row("readdir errors while committing", f"{bad} of {listings[0]}", detail)


# -- 3. zarr-python runs -------------------------------------------------------------------------


def zarr_run(path: Path, backing: Path, seed: int, workers: int) -> str | None:
    """None if the run wrote and read back equal, else what went wrong."""
    import numpy as np
    import zarr

    data = np.random.default_rng(seed).integers(0, 255, SHAPE, dtype=np.uint8)
    try:
        array = zarr.open_array(
            str(path), mode="w", shape=SHAPE, chunks=CHUNKS, dtype="uint8", zarr_format=2
        )
        rows = SHAPE[0] // CHUNKS[0]
        bounds = [CHUNKS[0] * (rows * k // workers) for k in range(workers + 1)]

        def slab(k: int) -> None:
            array[bounds[k] : bounds[k + 1], :] = data[bounds[k] : bounds[k + 1], :]

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(slab, range(workers)))
        if not np.array_equal(zarr.open_array(str(path), mode="r")[...], data):
            return "reads back different through the mount"
        if not np.array_equal(zarr.open_array(str(backing), mode="r")[...], data):
            return "reads back different from the backing directory"
    except Exception as exc:  # noqa: BLE001 (any failure of the run is the figure)
        return describe(exc)
    return None


def describe(exc: BaseException) -> str:
    """``ENOENT on 20.<uuid>.partial -> 20.2``: short enough for a table cell."""
    if isinstance(exc, OSError) and exc.errno:
        names = [os.path.basename(str(n)) for n in (exc.filename, exc.filename2) if n]
        return f"{errname(exc)} on {' -> '.join(names)}" if names else errname(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:160]


def measure_zarr(mount: Mount, runs: int, workers: int) -> Row:
    failures: list[str] = []
    start = time.monotonic()
    for run in range(runs):
        name = f"zarr_run{run}.zarr"
        why = zarr_run(mount.path / name, mount.source / name, run, workers)
        if why is not None:
            failures.append(f"run {run}: {why}")
    took = time.monotonic() - start
    detail = failures[0] if failures else "all read back equal"
    return Row(
        f"zarr v2 1,024-chunk runs failing ({workers} workers)",
        f"{len(failures)} of {runs}",
        f"{detail}; {took / max(runs, 1):.1f} s per run",
    )


# -- 4. O_TRUNC of a big file --------------------------------------------------------------------


def make_big_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for k in range(4):  # some real data, not only holes
            f.seek(size * k // 4)
            f.write(os.urandom(min(4 * MiB, size // 4)))


def measure_rss(mounter: Mounter, source: Path, big_size: int, cache_size: str) -> list[Row]:
    source.mkdir()
    make_big_file(source / "big.bin", big_size)
    mount = mounter.mount(source, "mnt-rss", "--cache-size", cache_size)
    try:
        os.stat(mount.path / "big.bin")
        base = vm_kib(mount.pid, "VmHWM")
        start = time.monotonic()
        fd = os.open(mount.path / "big.bin", os.O_WRONLY | os.O_TRUNC)
        opened = time.monotonic() - start
        try:
            os.write(fd, b"0123456789")
        finally:
            os.close(fd)
        took = time.monotonic() - start
        peak = vm_kib(mount.pid, "VmHWM")
        size = (source / "big.bin").stat().st_size
    finally:
        mounter.unmount(mount)
    budget = parse_size(cache_size) // MiB + 150
    return [
        Row(
            f"daemon peak RSS, O_TRUNC of {big_size / (1 << 30):g} GiB",
            f"{peak // 1024} MiB",
            f"{base // 1024} MiB before the open; target < --cache-size {cache_size} + 150 MiB "
            f"= {budget} MiB",
        ),
        Row(
            "O_TRUNC open / open+write+close time",
            f"{opened:.2f} s / {took:.2f} s",
            f"file is {size} bytes afterwards (want 10)",
        ),
    ]


# -- 5. truncate -s ------------------------------------------------------------------------------


def measure_truncate(mounter: Mounter, source: Path, size_text: str, cache_size: str) -> list[Row]:
    source.mkdir()
    mount = mounter.mount(source, "mnt-truncate", "--cache-size", cache_size)
    try:
        start = time.monotonic()
        result = subprocess.run(
            ["truncate", "-s", size_text, str(mount.path / "huge.bin")],
            capture_output=True,
            text=True,
            check=False,
        )
        took = time.monotonic() - start
        peak = vm_kib(mount.pid, "VmHWM")
        st = (source / "huge.bin").stat() if (source / "huge.bin").exists() else None
    finally:
        mounter.unmount(mount)
        with contextlib.suppress(FileNotFoundError):
            (source / "huge.bin").unlink()  # an old daemon wrote real zeros: free the disk
    if st is None:
        return [Row(f"truncate -s {size_text}", "failed", result.stderr.strip()[:200])]
    return [
        Row(
            f"truncate -s {size_text}: allocated in the store",
            f"{st.st_blocks * 512 / MiB:.1f} MiB",
            f"size {st.st_size} bytes; want 0 allocated (sparse); exit {result.returncode}",
        ),
        Row(
            f"truncate -s {size_text}: time / daemon peak RSS",
            f"{took:.2f} s / {peak // 1024} MiB",
            result.stderr.strip()[:120],
        ),
    ]


# -- main ----------------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    w1 = max(len(r.what) for r in rows)
    w2 = max(len(r.result) for r in rows)
    print(f"{'measurement':<{w1}}  {'result':>{w2}}  detail")
    print(f"{'-' * w1}  {'-' * w2}  {'-' * 40}")
    for r in rows:
        print(f"{r.what:<{w1}}  {r.result:>{w2}}  {r.detail}")


def print_progress(*rows: Row) -> None:
    for r in rows:
        print(f"  {r.what}: {r.result}  ({r.detail})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--source-dir",
        type=Path,
        help="where the backing file stores are made (a fresh sub-folder, removed at the end "
        "unless --keep); default: a temp dir",
    )
    parser.add_argument("--runs", type=int, default=5, help="zarr-python runs (default 5)")
    parser.add_argument(
        "--renames", type=int, default=6000, help="renames in all, over --threads (default 6000)"
    )
    parser.add_argument("--ttl", default="1", help="--cache-ttl of the mounts, seconds (default 1)")
    parser.add_argument("--threads", type=int, default=6, help="threads / workers (default 6)")
    parser.add_argument(
        "--folder-files",
        type=int,
        default=5000,
        help="files in the folder the readdir measurement lists (default 5000)",
    )
    parser.add_argument(
        "--big-size", default="1G", help="file opened with O_TRUNC (default 1G; sparse)"
    )
    parser.add_argument("--truncate-size", default="8G", help="truncate -s SIZE (default 8G)")
    parser.add_argument(
        "--cache-size", default="64M", help="--cache-size of the RSS/truncate mounts (64M)"
    )
    parser.add_argument(
        "--only",
        default=",".join(MEASUREMENTS),
        help=f"comma-separated subset of {','.join(MEASUREMENTS)} (default: all)",
    )
    parser.add_argument(
        "--watchdog",
        type=float,
        default=600,
        help="seconds a measurement may take before its daemon is killed (default 600)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated stores")
    parser.add_argument(
        "--no-debug-locks",
        dest="debug_locks",
        action="store_false",
        help="run the daemons without the lock-order checks (N5FS_DEBUG_LOCKS)",
    )
    args = parser.parse_args(argv)
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = sorted(set(only) - set(MEASUREMENTS))
    if unknown:
        parser.error(f"unknown measurement(s) {unknown}; choose from {MEASUREMENTS}")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        print("needs /dev/fuse and fusermount3", file=sys.stderr)
        return 2

    base = args.source_dir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="n5fs-stress-", dir=base))
    mounter = Mounter(work, args.ttl, debug_locks=args.debug_locks)
    rows: list[Row] = []
    try:
        print(f"n5fs imported by the daemons: {mounter.which_n5fs()}")
        print(f"python {sys.version.split()[0]} at {sys.executable}; work dir {work}")
        checks = "on" if args.debug_locks else "off"
        print(f"--cache-ttl {args.ttl}; {args.threads} threads; lock checks {checks}\n", flush=True)
        if {"renames", "readdir", "zarr"} & set(only):
            source = work / "store"
            (source / "readdir").mkdir(parents=True)
            if "readdir" in only:
                for i in range(args.folder_files):
                    (source / "readdir" / f"old_{i:06d}").write_bytes(b"o")
            mount = mounter.mount(source, "mnt")
            try:
                with watchdog(mounter, args.watchdog):
                    if "renames" in only:
                        rows.append(
                            measure_renames(mount.path / "renames", args.threads, args.renames)
                        )
                        print_progress(rows[-1])
                    if "readdir" in only:
                        rows.append(
                            measure_readdir(mount.path / "readdir", args.folder_files, args.threads)
                        )
                        print_progress(rows[-1])
                    if "zarr" in only:
                        rows.append(measure_zarr(mount, args.runs, args.threads))
                        print_progress(rows[-1])
            finally:
                mounter.unmount(mount)
        if "rss" in only:
            with watchdog(mounter, args.watchdog):
                rows += measure_rss(
                    mounter, work / "store-rss", parse_size(args.big_size), args.cache_size
                )
            print_progress(*rows[-2:])
        if "truncate" in only:
            with watchdog(mounter, args.watchdog):
                rows += measure_truncate(
                    mounter, work / "store-truncate", args.truncate_size, args.cache_size
                )
            print_progress(*rows[-2:])
    finally:
        mounter.cleanup()
        rows.append(mounter.lock_violations())
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
