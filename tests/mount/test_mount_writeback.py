"""Write-back on a real S3 mount (moto behind the fault proxy): close() returns once the file is
journaled, reads see it at once, other mounts once it is uploaded, and a daemon killed with
uploads pending loses nothing: the next mount uploads them.

Uploads are held back deterministically by the proxy answering every PUT with 503 until the
test clears the fault; no test asserts a duration.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from n5fs.cli.daemon import read_state, state_path
from n5fs.testing.s3_proxy import Fault, FaultProxy, fault_proxy
from tests.bucket import held, source, validate_clean
from tests.mounting import real_mount, wait_until

pytestmark = [pytest.mark.s3, *real_mount(300)]


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint, seed=5) as running:
        yield running


@pytest.fixture
def stored(s3_server: Any, s3_bucket: str) -> Any:
    client = s3_server.client()
    return lambda key: held(client, s3_bucket, key)


def uploads_refused(proxy: FaultProxy) -> None:
    proxy.inject(Fault("status", method="PUT", status=503, code="SlowDown", probability=1.0))


def zarr_tree(root: Path, chunks: int) -> dict[str, bytes]:
    meta = {"zarr_format": 2, "shape": [chunks * 8], "chunks": [8], "dtype": "<u8",
            "compressor": None, "fill_value": 0, "order": "C", "filters": None}  # fmt: skip
    files = {".zarray": json.dumps(meta).encode()}
    rng = random.Random(chunks)
    files.update({str(i): rng.randbytes(64) for i in range(chunks)})
    root.mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def test_kill_9_with_uploads_pending_loses_nothing(
    mounter: Any, proxy: FaultProxy, s3_server: Any, s3_bucket: str, tmp_path: Path, stored: Any
) -> None:
    files = zarr_tree(tmp_path / "src", 200)
    mp = mounter.daemon(source(proxy.endpoint, s3_bucket))  # write-back: S3's default
    done = subprocess.run(["cp", "-r", str(tmp_path / "src" / "."), str(mp / "arr")], check=False)
    assert done.returncode == 0
    # .zarray was written through (a document); the chunks are journaled, uploads running
    uploads_refused(proxy)
    (mp / "late").write_bytes(b"accepted while S3 refuses")  # journaled, cannot land
    assert (mp / "late").read_bytes() == b"accepted while S3 refuses"  # read your writes
    os.kill(mounter.pid(mp), signal.SIGKILL)
    subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=False)
    assert stored("late") is None
    journal = tmp_path / "state" / "writeback"
    assert any(journal.glob("*/*.log"))
    status = mounter.cli("status")
    assert "not uploaded yet" in status.stdout, status.stdout  # the journal no mount holds
    proxy.clear()
    again = mounter.daemon(source(proxy.endpoint, s3_bucket), name="mnt2")
    assert (again / "late").read_bytes() == b"accepted while S3 refuses"
    synced = mounter.cli("sync", str(again))
    assert synced.returncode == 0, synced.stderr
    assert stored("late") == b"accepted while S3 refuses"
    assert {name: stored(f"arr/{name}") for name in files} == files
    validate_clean(s3_server.endpoint, s3_bucket)
    stats = json.loads((again / ".n5fs" / "stats.json").read_text())
    assert stats["writeback_replayed"] >= 1
    assert stats["writeback_pending_files"] == 0
    unmounted = mounter.cli("unmount", str(again))
    assert unmounted.returncode == 0, unmounted.stderr
    assert not any(journal.glob("*/*.log"))  # the journal is empty afterwards


def test_other_mounts_see_a_file_once_uploaded(
    mounter: Any, proxy: FaultProxy, s3_bucket: str, stored: Any
) -> None:
    writer = mounter.daemon(source(proxy.endpoint, s3_bucket))
    reader = mounter.daemon(
        source(proxy.endpoint, s3_bucket), "--consistency", "strict", "--read-only", name="ro"
    )
    uploads_refused(proxy)
    (writer / "f.bin").write_bytes(b"new")
    assert (writer / "f.bin").read_bytes() == b"new"
    assert not (reader / "f.bin").exists()  # not in the bucket yet
    status = mounter.cli("status")
    assert "uploads pending" in status.stdout, status.stdout
    proxy.clear()
    synced = mounter.cli("sync", str(writer))
    assert synced.returncode == 0, synced.stderr
    assert stored("f.bin") == b"new"
    wait_until(lambda: (reader / "f.bin").exists(), "the other mount sees the upload")
    assert (reader / "f.bin").read_bytes() == b"new"


def test_sigterm_waits_for_uploads_and_stays_while_they_fail(
    mounter: Any, proxy: FaultProxy, s3_bucket: str, stored: Any
) -> None:
    mp = mounter.daemon(source(proxy.endpoint, s3_bucket))
    pid = mounter.pid(mp)
    uploads_refused(proxy)
    (mp / "f.bin").write_bytes(b"must land")
    os.kill(pid, signal.SIGTERM)
    state = read_state(state_path(str(mp)))
    assert state is not None
    log = Path(state["log_file"])
    wait_until(lambda: "stays mounted" in log.read_text(), "the daemon refuses to stop")
    assert (mp / "f.bin").read_bytes() == b"must land"  # still mounted, still serving
    proxy.clear()
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not os.path.ismount(mp), "the daemon stops once uploads land")
    assert stored("f.bin") == b"must land"


def test_writeback_off_commits_at_close(mounter: Any, proxy: FaultProxy, s3_bucket: str) -> None:
    mp = mounter.daemon(source(proxy.endpoint, s3_bucket), "-o", "writeback=off")
    uploads_refused(proxy)
    with pytest.raises(OSError):
        (mp / "f.bin").write_bytes(b"refused")
    stats = json.loads((mp / ".n5fs" / "stats.json").read_text())
    assert "writeback_pending_files" not in stats
