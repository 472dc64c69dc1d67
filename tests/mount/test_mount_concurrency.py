"""Concurrency and memory through real mounts: zarr-python 3 writing a Zarr v2 array
of 1,024 chunks with its own concurrency, six threads renaming temp files into one folder, and
the daemon's memory when a huge file is truncated by ``open(O_TRUNC)`` or ``truncate -s 8G``.

Every mount runs in its own process and is always unmounted (tests/mounting.py). A short
``--cache-ttl`` (1 s) makes listings expire during the runs, which is where the rename races were.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

from n5fs.kvstore import open_store
from n5fs.validate import validate_store
from tests.mounting import real_mount

# the daemons check every lock against the gateway's lock order (tests/mounting.py)
pytestmark = [*real_mount(240), pytest.mark.debug_locks]

MiB = 1 << 20
SHAPE, CHUNKS = (256, 256), (8, 8)  # 32 x 32 = 1,024 chunks
TTL = ("--cache-ttl", "1")


def values(seed: int, shape: tuple[int, int] = SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


def write_v2(path: Path, data: np.ndarray, *, workers: int) -> None:
    """zarr-python 3 (LocalStore: ``name.<uuid>.partial`` + os.replace per chunk). ``workers``
    0: one ``array[...] = data`` (zarr's own async concurrency); else that many threads, each
    writing a slab of whole chunk rows, as dask's to_zarr does."""
    array = zarr.open_array(
        str(path), mode="w", shape=data.shape, chunks=CHUNKS, dtype="uint8", zarr_format=2
    )
    if not workers:
        array[...] = data
        return
    rows = data.shape[0] // CHUNKS[0]
    bounds = [CHUNKS[0] * (rows * k // workers) for k in range(workers + 1)]

    def slab(k: int) -> None:
        array[bounds[k] : bounds[k + 1], :] = data[bounds[k] : bounds[k + 1], :]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(slab, range(workers)))


def read_v2(path: Path | str) -> np.ndarray:
    return zarr.open_array(str(path), mode="r", zarr_format=2)[...]


def chunk_names(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if not p.name.startswith(".")}


def validate_cli(mounter, source: str, chunks: int) -> None:
    """``n5fs validate SOURCE`` exits 0, having judged ``chunks`` chunks."""
    result = mounter.cli("validate", "--json", source, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["invalid"] == [], report["invalid"]
    assert report["checked"]["chunks"] == chunks


# == a: zarr-python 3, 1,024 chunks, its own concurrency ============================================


def test_zarr_python_v2_array_of_1024_chunks(mounter, tmp_path):
    """Three runs, each a fresh array: zarr's own async concurrency, then twice six threads
    writing slabs (dask's to_zarr; it failed 4 runs in 5 at --cache-ttl 1 on the old code)."""
    backing = tmp_path / "backing"
    backing.mkdir()
    mp = mounter.foreground(str(backing), *TTL)
    for run, workers in enumerate((0, 6, 6)):
        data = values(run)
        name = f"run{run}.zarr"
        write_v2(mp / name, data, workers=workers)  # raises on any EINVAL/ENOENT/EIO
        assert np.array_equal(read_v2(mp / name), data)
        assert np.array_equal(read_v2(backing / name), data)
        chunks = chunk_names(backing / name)
        assert len(chunks) == 1024, sorted(chunks)[:5]  # and no .partial left behind
        assert not [n for n in os.listdir(mp / name) if n.endswith(".partial")]
    assert json.loads((mp / ".n5fs" / "stats.json").read_text())["rejections"] == 0
    validate_cli(mounter, str(backing), chunks=3 * 1024)


@pytest.mark.s3
def test_zarr_python_v2_array_on_s3(mounter, s3_server, s3_bucket):
    """The same on S3 (moto), smaller: 256 chunks, six threads (each commit is several HTTP
    round trips: a PUT of the temp file, then a server-side copy and a delete)."""
    source = json.dumps(
        {"driver": "s3", "bucket": s3_bucket, "path": "z/", "endpoint": s3_server.endpoint}
    )
    mp = mounter.foreground(source, *TTL)
    data = values(7, (128, 128))
    write_v2(mp / "a.zarr", data, workers=6)
    assert np.array_equal(read_v2(mp / "a.zarr"), data)
    # a read-write S3 mount uploads behind close() (write-back): the bucket is read directly
    # below, so wait for the uploads first, as a workflow handing the files on would
    synced = mounter.cli("sync", str(mp))
    assert synced.returncode == 0, synced.stderr
    store = open_store(source)
    keys = [info.key for info in store.list("a.zarr/", delimiter=None).keys]
    assert len([k for k in keys if not k.rsplit("/", 1)[1].startswith(".")]) == 256
    assert not [k for k in keys if k.endswith(".partial")]
    report = validate_store(store)
    store.close()
    assert report.ok, report.invalid
    assert report.chunks == 256


# == b: six threads, .partial + os.replace into one folder ==========================================


def test_six_threads_replace_partial_files_into_one_folder(mounter, tmp_path):
    backing = tmp_path / "backing"
    (backing / "d").mkdir(parents=True)
    mp = mounter.foreground(str(backing), *TTL)
    folder = mp / "d"
    threads, renames = 6, 300
    errors: list[str] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for i in range(renames):
            name = f"c_{t}_{i % 250}"  # the last 50 replace an existing name, as rewrites do
            tmp = folder / f"{name}.{uuid.uuid4().hex}.partial"
            data = f"{t}:{i}".encode() * 8
            try:
                with open(tmp, "xb") as f:
                    f.write(data)
                os.replace(tmp, folder / name)
            except OSError as exc:
                with lock:
                    errors.append(f"{name} (#{i}): {exc!r}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(writer, range(threads)))
    assert not errors, f"{len(errors)} of {threads * renames} failed: {errors[:5]}"
    expected = {f"c_{t}_{i}" for t in range(threads) for i in range(250)}
    assert set(os.listdir(folder)) == expected
    assert set(os.listdir(backing / "d")) == expected
    for t in range(threads):
        last = f"{t}:{renames - 1}".encode() * 8
        assert (folder / f"c_{t}_{(renames - 1) % 250}").read_bytes() == last


# == c: memory and sparseness ======================================================================


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_o_trunc_of_a_1gib_file_keeps_the_daemon_small(mounter, tmp_path):
    """Opening a 1 GiB file with O_TRUNC must not read it: the daemon's peak RSS stays under
    --cache-size + 150 MiB (it was 1 GiB more on the old code)."""
    backing = tmp_path / "backing"
    backing.mkdir()
    big = backing / "big.bin"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
        for offset in (0, 300 * MiB, 700 * MiB):  # real data, not only holes
            f.seek(offset)
            f.write(os.urandom(4 * MiB))
    mp = mounter.foreground(str(backing), "--cache-size", "64M", "--staging-size", "64M", *TTL)
    pid = mounter.procs[-1].pid
    assert os.stat(mp / "big.bin").st_size == 1 << 30
    before = vm_kib(pid, "VmHWM")
    fd = os.open(mp / "big.bin", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"0123456789")
    finally:
        os.close(fd)
    peak = vm_kib(pid, "VmHWM")
    assert big.stat().st_size == 10
    assert big.read_bytes() == b"0123456789"
    assert os.stat(mp / "big.bin").st_size == 10
    budget = (64 + 150) * 1024
    assert peak < budget, f"daemon peak RSS {peak // 1024} MiB (before: {before // 1024} MiB)"


def test_truncate_8g_stays_sparse_on_a_file_store(mounter, tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    mp = mounter.foreground(str(backing), "--cache-size", "64M", *TTL)
    pid = mounter.procs[-1].pid
    subprocess.run(["truncate", "-s", "8G", str(mp / "huge.bin")], check=True, timeout=120)
    st = (backing / "huge.bin").stat()
    assert st.st_size == 8 << 30
    assert st.st_blocks * 512 < MiB, f"{st.st_blocks * 512} bytes allocated"
    assert os.stat(mp / "huge.bin").st_size == 8 << 30
    assert vm_kib(pid, "VmHWM") < (64 + 150) * 1024
