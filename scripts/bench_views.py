"""View benchmark: an N5 dataset read through ``n5fs mount --as zarr3`` by zarr-python
3 and TensorStore's zarr3 driver, against TensorStore's n5 driver on the store itself, in one
run, printed as one table of times and ratios (view time / native time; compared, never
asserted).

The dataset (TensorStore writes it: uint16, 3-D, 1 MiB blocks, ``--compression``; the shape is
not a multiple of the block, so end blocks are rebuilt by the view) lives in a temp dir,
removed at the end. Each reader reads the whole array twice: cold (a fresh mount, and every
backing file's pages dropped with ``posix_fadvise(DONTNEED)``, which touches no other user's
cache) and warm (the same mount again: the kernel keeps a read-only view's pages, and the
gateway its cached chunks). The mount runs as ``python -m n5fs mount --foreground`` under a
watchdog that kills it if a read overruns; it is always unmounted.

    python scripts/bench_views.py                  # 1 GiB (do not run on a shared machine)
    python scripts/bench_views.py --quick          # 32 MiB smoke run
    python scripts/bench_views.py --size 0.25 --compression raw
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorstore as ts
import zarr

from n5fs.fuse_front.mounts import mount_entry, unmount

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

MiB = 1 << 20
BLOCK = [128, 128, 32]  # uint16: 1 MiB per block
COMPRESSIONS = {
    "gzip": {"type": "gzip", "level": 1},
    "raw": {"type": "raw"},
    "zstd": {"type": "zstd", "level": 1},
    "blosc": {"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2},
    "bzip2": {"type": "bzip2", "blockSize": 1},
}
WATCHDOG = 600.0


def shape_for(nbytes: int) -> list[int]:
    """An N5 shape (x, y, z) of about ``nbytes`` of uint16, not a multiple of the block: most
    blocks are interior (kept as stored), the end blocks on each axis are rebuilt."""
    side = 1000 if nbytes >= 256 * MiB else 500
    planes = max(BLOCK[2] + 1, nbytes // (2 * side * side))
    return [side, side, planes]


def write_dataset(path: Path, shape: list[int], compression: dict[str, Any]) -> None:
    store = ts.open(
        {
            "driver": "n5",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "dimensions": shape,
                "blockSize": BLOCK,
                "dataType": "uint16",
                "compression": compression,
            },
        },
        create=True,
        delete_existing=True,
    ).result()
    rng = np.random.default_rng(0)
    step = BLOCK[2]
    for z in range(0, shape[2], step):  # plane by plane: bounded memory
        depth = min(step, shape[2] - z)
        noise = rng.integers(0, 64, size=(shape[0], shape[1], depth), dtype=np.uint16)
        ramp = np.arange(shape[0], dtype=np.uint16)[:, None, None]
        store[:, :, z : z + depth].write(noise + ramp).result()


def drop_pages(root: Path) -> None:
    """Forget the page cache of every backing file (ours only, unlike drop_caches)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@contextlib.contextmanager
def mounted(source: Path, mountpoint: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    mountpoint.mkdir(exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "n5fs",
        "mount",
        str(source),
        str(mountpoint),
        "--as",
        "zarr3",
        "--foreground",
    ]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while mount_entry(str(mountpoint)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the view did not mount: {log.read_text()[-600:]}")
            time.sleep(0.05)
        os.stat(mountpoint)
        yield proc
    finally:
        if mount_entry(str(mountpoint)) is not None:
            try:
                unmount(str(mountpoint))
            except Exception:  # noqa: BLE001 (a busy mount: detach it lazily)
                unmount(str(mountpoint), lazy=True)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def watchdog(proc: subprocess.Popen[bytes] | None) -> Iterator[None]:
    """Kill the mount if a read overruns: the read then fails instead of hanging."""
    timer = threading.Timer(WATCHDOG, lambda: proc and proc.send_signal(signal.SIGKILL))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def timed(read: Callable[[], np.ndarray[Any, Any]], expected_sum: int) -> float:
    start = time.perf_counter()
    values = read()
    seconds = time.perf_counter() - start
    if int(values.sum(dtype=np.uint64)) != expected_sum:
        raise RuntimeError("a reader returned other values than TensorStore's n5 driver")
    return seconds


def readers(source: Path, view: Path) -> dict[str, Callable[[], np.ndarray[Any, Any]]]:
    def tensorstore(driver: str, path: Path) -> Callable[[], np.ndarray[Any, Any]]:
        spec = {
            "driver": driver,
            "kvstore": {"driver": "file", "path": str(path)},
            "context": {"cache_pool": {"total_bytes_limit": 0}},
        }
        return lambda: np.asarray(ts.open(spec).result().read().result())

    def zarr_python() -> np.ndarray[Any, Any]:
        return np.asarray(zarr.open_array(str(view), mode="r", zarr_format=3)[...])

    return {
        "TensorStore n5 (native)": tensorstore("n5", source),
        "TensorStore zarr3 (view)": tensorstore("zarr3", view),
        "zarr-python 3 (view)": zarr_python,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=1.0, help="GiB of uint16 (default 1)")
    parser.add_argument("--quick", action="store_true", help="32 MiB: a smoke run")
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="gzip")
    parser.add_argument("--tmp", default=None, help="where the data goes (default: $TMPDIR)")
    args = parser.parse_args(argv)
    nbytes = 32 * MiB if args.quick else int(args.size * (1 << 30))
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-views-", dir=args.tmp))
    try:
        return run(tmp, shape_for(nbytes), args.compression)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp: Path, shape: list[int], compression: str) -> int:
    source, mountpoint = tmp / "src", tmp / "mnt"
    print(
        f"writing an N5 dataset {shape} uint16 ({np.prod(shape) * 2 / MiB:.0f} MiB), "
        f"blocks {BLOCK}, {compression} ...",
        flush=True,
    )
    write_dataset(source / "data", shape, COMPRESSIONS[compression])
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(source / "data")}}
    expected_sum = int(np.asarray(ts.open(spec).result().read().result()).sum(dtype=np.uint64))
    results: dict[str, tuple[float, float]] = {}
    for name in readers(source / "data", mountpoint / "data"):
        drop_pages(source)
        with mounted(source, mountpoint, tmp / "mount.log") as proc:
            read = readers(source / "data", mountpoint / "data")[name]
            with watchdog(proc):
                cold = timed(read, expected_sum)
                warm = timed(read, expected_sum)
        results[name] = (cold, warm)
    report(results, int(np.prod(shape)) * 2)
    return 0


def report(results: dict[str, tuple[float, float]], nbytes: int) -> None:
    base_cold, base_warm = results["TensorStore n5 (native)"]
    print(
        f"\n{'reader':<28}{'cold s':>9}{'MB/s':>8}{'ratio':>7}{'warm s':>9}{'MB/s':>8}{'ratio':>7}"
    )
    for name, (cold, warm) in results.items():
        print(
            f"{name:<28}{cold:>9.2f}{nbytes / cold / 1e6:>8.0f}{cold / base_cold:>7.2f}"
            f"{warm:>9.2f}{nbytes / warm / 1e6:>8.0f}{warm / base_warm:>7.2f}"
        )
    print("ratio: time / TensorStore n5 on the store itself (lower is better)")


if __name__ == "__main__":
    sys.exit(main())
