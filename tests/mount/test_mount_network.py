"""A read-write S3 mount through the faults of a real network (n5fs.testing.s3_proxy between
the daemon and the session's moto server): real writers and readers through a real mount,
then what the bucket holds, read behind the proxy's back, against what the mount said.

No test asserts a duration; every call is bounded by the mount's watchdog.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from n5fs.testing.s3_proxy import Fault, FaultProxy, fault_proxy
from n5fs.testing.soak import SoakConfig, run_soak
from tests.bucket import held, source, validate_clean
from tests.mounting import real_mount

pytestmark = [pytest.mark.s3, pytest.mark.slow, *real_mount(400)]


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint, seed=3) as running:
        yield running


@pytest.fixture
def mounted(mounter: Any, proxy: FaultProxy, s3_bucket: str) -> Path:
    return mounter.daemon(source(proxy.endpoint, s3_bucket))  # type: ignore[no-any-return]


@pytest.fixture
def stored(s3_server: Any, s3_bucket: str) -> Any:
    client = s3_server.client()
    return lambda key: held(client, s3_bucket, key)


@pytest.mark.parametrize(
    ("faults", "chunks"),
    [
        pytest.param(
            lambda: [
                Fault("reset_before", method="PUT", probability=0.05),
                Fault("reset_after", method="PUT", probability=0.05),
                Fault("reset_before", method="GET", probability=0.05),
                Fault("reset_mid_body", method="GET", probability=0.05),
            ],
            128,
            id="10%-resets",
        ),
        pytest.param(
            lambda: [Fault("status", status=503, code="SlowDown", probability=0.2)],
            64,  # a throttled mount is slow by design: fewer chunks, the same interleavings
            id="20%-slowdown",
        ),
    ],
)
def test_zarr_python_writes_and_tensorstore_reads_through_faults(
    mounter: Any,
    mounted: Path,
    proxy: FaultProxy,
    s3_server: Any,
    s3_bucket: str,
    faults: Any,
    chunks: int,
) -> None:
    """zarr-python 3 writes ``chunks`` chunks of 8 x 8 from 8 threads, TensorStore reads them
    back: not one call fails, and the bucket holds exactly the values (scripts/bench_network.py
    goes to 512 chunks)."""
    values = np.random.default_rng(1).integers(0, 60000, (chunks // 8 * 8, 64), "uint16")
    arr = zarr.create_array(
        str(mounted / "arr"), shape=values.shape, chunks=(8, 8), dtype="uint16", zarr_format=2
    )
    proxy.inject(*faults())

    band = len(values) // 8

    def rows(i: int) -> None:
        arr[i * band : (i + 1) * band, :] = values[i * band : (i + 1) * band, :]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(rows, range(8)))  # re-raises the first failure
    read = ts.open(
        {"driver": "zarr", "kvstore": {"driver": "file", "path": str(mounted / "arr")}}
    ).result()
    assert np.array_equal(read.read().result(), values)
    # the uploads behind the writes go through the faults too; n5fs sync waits for them
    # (it answers 1 when an attempt failed after it began: the upload is tried again)
    synced = []
    while 0 not in synced and len(synced) < 5:
        synced.append(mounter.cli("sync", str(mounted)).returncode)
    assert 0 in synced, synced
    assert sum(proxy.injected.values()) > 0
    proxy.clear()
    validate_clean(s3_server.endpoint, s3_bucket)
    behind = zarr.open_array(str(mounted / "arr"), mode="r")  # cached pages aside: re-read
    assert np.array_equal(behind[...], values)


def test_bodies_cut_short_and_answered_200_are_never_acknowledged(
    mounter: Any, mounted: Path, proxy: FaultProxy, tmp_path: Path, stored: Any
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    made = {}
    for i in range(64):
        data = random.Random(i).randbytes(4096)
        (src / f"{i}.bin").write_bytes(data)
        made[f"{i}.bin"] = data
    proxy.inject(Fault("truncate", method="PUT", probability=0.1))
    done = subprocess.run(["cp", "-r", str(src), str(mounted / "copy")], check=False)
    assert done.returncode == 0
    synced = mounter.cli("sync", str(mounted))  # the uploads behind close() landed
    assert synced.returncode == 0, synced.stderr
    assert proxy.injected["truncate"] > 0
    assert {name: stored(f"copy/{name}") for name in made} == made


def test_one_key_whose_every_put_fails_fails_alone_at_close(
    mounter: Any, proxy: FaultProxy, s3_bucket: str, stored: Any
) -> None:
    """Synchronous commits: the failing key's close() fails, the others' do not."""
    mounted = mounter.daemon(source(proxy.endpoint, s3_bucket), "-o", "writeback=off")
    proxy.inject(Fault("reset_before", method="PUT", key="cursed"))
    with pytest.raises(OSError) as failed:
        (mounted / "cursed.bin").write_bytes(b"never")
    assert failed.value.errno == errno.EIO
    for i in range(16):  # at once, one after the other: none fails
        (mounted / f"fine{i}.bin").write_bytes(b"%d" % i)
    assert all(stored(f"fine{i}.bin") == b"%d" % i for i in range(16))
    assert stored("cursed.bin") is None
    assert not (mounted / "cursed.bin").exists()
    stats = json.loads((mounted / ".n5fs" / "stats.json").read_text())
    assert stats["s3_retries"] == proxy.injected["reset_before"] - 1  # 10 attempts, 9 retries
    assert stats.get("s3_failed_fast", 0) == 0


def test_one_key_whose_every_put_fails_fails_alone_at_fsync(
    mounter: Any, mounted: Path, proxy: FaultProxy, stored: Any
) -> None:
    """Write-back: the failing key's close() is accepted (it is journaled); its fsync, and
    n5fs sync, answer the failure; the other keys land, and the failing one is kept, shown
    and retried, never dropped."""
    proxy.inject(Fault("reset_before", method="PUT", key="cursed"))
    (mounted / "cursed.bin").write_bytes(b"kept")
    fd = os.open(mounted / "cursed.bin", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as failed:
            os.fsync(fd)
    finally:
        os.close(fd)
    assert failed.value.errno == errno.EIO
    for i in range(16):
        path = mounted / f"fine{i}.bin"
        path.write_bytes(b"%d" % i)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)  # its own upload only: the cursed one does not hold it up
        os.close(fd)
    assert all(stored(f"fine{i}.bin") == b"%d" % i for i in range(16))
    synced = mounter.cli("sync", "--timeout", "60", str(mounted))
    assert synced.returncode == 1
    assert "cursed.bin" in synced.stderr
    assert (mounted / "cursed.bin").read_bytes() == b"kept"  # read from the journal
    stats = json.loads((mounted / ".n5fs" / "stats.json").read_text())
    assert stats["writeback_failing"] == 1
    assert stats["writeback_pending_files"] == 1
    proxy.clear()  # the network heals: the next attempt lands
    synced = mounter.cli("sync", str(mounted))
    assert synced.returncode == 0, synced.stderr
    assert stored("cursed.bin") == b"kept"


def test_fifteen_seconds_of_mixed_faults_lose_and_corrupt_nothing(
    s3_server: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak of scripts/soak.py, for 15 s: files, zarr-python arrays and cp -r written
    and read through a mount under resets, 5xx, SlowDown, stalls, cut and damaged bodies
    (2,000 to 4,500 files and some 250 faults; the drain and the checks cost as long again,
    and grow with the run: every acknowledged file is read back)."""
    monkeypatch.setenv("N5FS_STATE_DIR", str(tmp_path / "state"))
    report = run_soak(s3_server.endpoint, s3_bucket, tmp_path, SoakConfig(seconds=15.0))
    print(report.table())  # shown with -s: what the run did, faults injected among it
    assert report.failures() == [], report.table()
    assert report.acknowledged_files > 100, report.table()
    assert report.acknowledged_arrays > 0, report.table()
    assert sum(report.injected.values()) > 100, report.table()
