"""A zip archive's rewrite that cannot complete: a full disk beside the archive or in the temp
dir, a daemon killed mid-rewrite. Real parts: a 2 MiB tmpfs that really fills up, real FUSE
mounts in child processes (tests/mounting.py), the moto S3 server.

What must hold: the call that triggers the rewrite (``fsync``, ``n5fs unmount``, SIGTERM, the
final unmount) fails with the reason; the old archive stays whole; the staged changes stay for
a retry, which succeeds once there is room; a killed rewrite's temp archive is swept.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from n5fs.cli.daemon import process_alive
from n5fs.errors import NoSpace, errno_of
from n5fs.fuse_front.mounts import mount_entry
from n5fs.kvstore.base import KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.spec import S3Spec
from n5fs.kvstore.zip import ZipStore
from n5fs.kvstore.zip import rewrite as ziprewrite
from tests.mounting import NEEDS_FUSE, wait_until

pytestmark = pytest.mark.timeout(120)

ARCHIVE = "arch/a.zip"
ROOM = 300_000  # what the filler leaves free on the small disk
BIG = 600_000  # an incompressible value that cannot fit in ROOM

SERVE_ZIP = """
import logging
import sys
from n5fs.fuse_front._lib import LIBFUSE_VERSION
from n5fs.fuse_front.mount import serve
from n5fs.fuse_front.options import MountOptions, fuse_options
from n5fs.gateway import Gateway
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.zip import ZipStore

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
options = fuse_options(MountOptions(), read_only=False, ttl=5.0, fsname="zip",
                       libfuse_major=LIBFUSE_VERSION[0])
refused = lambda why: print("STATUS=" + why, file=sys.stderr, flush=True)
serve(Gateway(ZipStore(FileStore(sys.argv[1]), "a.zip")), sys.argv[2], options,
      on_stop_refused=refused)
"""


def make_zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as out:
        for name, value in entries.items():
            out.writestr(name, value)
    return buf.getvalue()


def unzip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as src:
        assert src.testzip() is None
        return {name: src.read(name) for name in src.namelist()}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a disk that really runs out of space."""
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave: int = ROOM) -> Path:
    """A file that leaves ``leave`` bytes free on ``disk``."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(bytes(st.f_bavail * st.f_frsize - leave))
    return filler


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_errno(path: Path) -> int:
    with pytest.raises(OSError) as info:
        fsync_path(path)
    return info.value.errno or 0


# == store level: the temp dir of a zip over S3 or memory fills up ================================


@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.s3)])
def remote(request: pytest.FixtureRequest) -> KvStore:
    """A base that is not a local directory: the new archive is written in the temp dir."""
    if request.param == "memory":
        return MemoryStore()
    from n5fs.kvstore.s3 import S3Store

    server: Any = request.getfixturevalue("s3_server")
    bucket: str = request.getfixturevalue("s3_bucket")
    return S3Store(S3Spec(bucket=bucket, path="", endpoint=server.endpoint))


def test_full_temp_dir_refuses_the_rewrite_before_writing(remote: KvStore, disk: Path) -> None:
    old = make_zip({"keep": b"kept"})
    remote.set(ARCHIVE, old)
    filler = fill(disk)
    store = ZipStore(remote, ARCHIVE, tmp_dir=str(disk))
    big = os.urandom(BIG)
    store.set("big", big)
    store.set("small", b"s")
    with pytest.raises(NoSpace) as info:
        store.flush()
    assert errno_of(info.value) == errno.ENOSPC
    message = str(info.value)
    assert repr(ARCHIVE) in message
    assert str(disk) in message
    assert "needs up to" in message
    assert "are free" in message
    assert "2 staged change(s) stay pending" in message
    assert remote.get(ARCHIVE) == old
    assert os.listdir(disk) == ["filler"]  # no partial temp archive
    assert store.get("big") == big  # still staged
    filler.unlink()
    store.flush()
    assert unzip(remote.get(ARCHIVE) or b"") == {"keep": b"kept", "big": big, "small": b"s"}
    assert os.listdir(disk) == []


def test_space_running_out_mid_write_is_no_space_and_leaves_nothing(
    remote: KvStore, disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = make_zip({"keep": b"kept"})
    remote.set(ARCHIVE, old)
    filler = fill(disk)
    monkeypatch.setattr(ziprewrite, "size_bound", lambda *args: 0)  # the check is fooled
    store = ZipStore(remote, ARCHIVE, tmp_dir=str(disk))
    big = os.urandom(BIG)
    store.set("big", big)
    with pytest.raises(NoSpace) as info:
        store.flush()
    assert f"ran out of space in {disk}" in str(info.value)
    assert "1 staged change(s) stay pending" in str(info.value)
    assert remote.get(ARCHIVE) == old
    assert os.listdir(disk) == ["filler"]
    filler.unlink()
    store.flush()
    assert unzip(remote.get(ARCHIVE) or b"") == {"keep": b"kept", "big": big}


# == real mounts: the disk under the archive fills up =============================================


def zip_on(disk: Path) -> tuple[Path, bytes, str]:
    archive = disk / "a.zip"
    archive.write_bytes(make_zip({"keep.txt": b"keep\n"}))
    return archive, archive.read_bytes(), f"file://{archive}|zip:"


@NEEDS_FUSE
@pytest.mark.fuse
def test_full_disk_fails_fsync_and_unmount_keeps_the_mount_until_there_is_room(
    mounter: Any, disk: Path
) -> None:
    archive, old, source = zip_on(disk)
    mp = mounter.daemon(source)
    filler = fill(disk)
    big = os.urandom(BIG)
    (mp / "big.bin").write_bytes(big)  # close() accepts it: staged in the daemon
    (mp / "notes").mkdir()
    (mp / "notes" / "n.txt").write_bytes(b"note\n")
    assert fsync_errno(mp / "big.bin") == errno.ENOSPC
    assert fsync_errno(mp / ".n5fs" / "stats.json") == errno.ENOSPC  # no node: the store only
    assert archive.read_bytes() == old
    assert unzip(old) == {"keep.txt": b"keep\n"}
    assert sorted(os.listdir(disk)) == ["a.zip", "filler"]

    refused = mounter.cli("unmount", str(mp))
    assert refused.returncode == 1, refused.stderr
    assert f"n5fs unmount: {mp} is still mounted: " in refused.stderr
    assert "not enough space" in refused.stderr
    assert str(disk) in refused.stderr
    assert "free space and run n5fs unmount again" in refused.stderr
    assert f"n5fs unmount --discard {mp}" in refused.stderr
    assert mount_entry(str(mp)) is not None
    assert (mp / "big.bin").read_bytes() == big  # still served, still staged
    assert archive.read_bytes() == old

    filler.unlink()
    done = mounter.cli("unmount", str(mp))
    assert done.returncode == 0, done.stderr
    assert mount_entry(str(mp)) is None
    assert unzip(archive.read_bytes()) == {
        "keep.txt": b"keep\n",
        "big.bin": big,
        "notes/n.txt": b"note\n",
    }
    assert sorted(os.listdir(disk)) == ["a.zip"]


@NEEDS_FUSE
@pytest.mark.fuse
def test_unmount_discard_skips_the_flush(mounter: Any, disk: Path) -> None:
    archive, old, source = zip_on(disk)
    mp = mounter.daemon(source)
    fill(disk)
    (mp / "big.bin").write_bytes(os.urandom(BIG))
    result = mounter.cli("unmount", "--discard", str(mp))
    assert result.returncode == 0, result.stderr
    assert mount_entry(str(mp)) is None
    assert archive.read_bytes() == old  # the daemon could not write it at exit either
    assert sorted(os.listdir(disk)) == ["a.zip", "filler"]


@NEEDS_FUSE
@pytest.mark.fuse
def test_sigterm_stays_mounted_while_the_rewrite_fails_and_a_second_one_retries(
    mounter: Any, disk: Path
) -> None:
    archive, old, _ = zip_on(disk)
    mp, proc = mounter.script(SERVE_ZIP, str(disk))
    filler = fill(disk)
    big = os.urandom(BIG)
    (mp / "big.bin").write_bytes(big)
    log = mounter.tmp / f"{mp.name}.stderr"
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "STATUS=still mounted" in log.read_text(), "the stop-refused hook")
    said = log.read_text()
    assert "ERROR n5fs.fuse_front.mount: SIGTERM: " in said
    assert "stays mounted" in said
    assert "not enough space" in said
    assert "1 staged change(s) stay pending" in said
    assert proc.poll() is None
    assert mount_entry(str(mp)) is not None
    assert (mp / "big.bin").read_bytes() == big
    assert archive.read_bytes() == old

    filler.unlink()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert mount_entry(str(mp)) is None
    assert unzip(archive.read_bytes()) == {"keep.txt": b"keep\n", "big.bin": big}


@NEEDS_FUSE
@pytest.mark.fuse
def test_a_rewrite_failing_at_the_final_unmount_exits_non_zero(mounter: Any, disk: Path) -> None:
    archive, old, source = zip_on(disk)
    mp = mounter.foreground(source)
    proc = mounter.procs[-1]
    fill(disk)
    (mp / "big.bin").write_bytes(os.urandom(BIG))
    subprocess.run(["fusermount3", "-u", str(mp)], check=True, timeout=30)  # no flush first
    assert proc.wait(timeout=30) == 2
    said = (mounter.tmp / f"{mp.name}.stderr").read_text()
    assert "is unmounted, but what was staged could not be written and is lost" in said
    assert "not enough space" in said
    assert archive.read_bytes() == old
    assert unzip(old) == {"keep.txt": b"keep\n"}
    assert sorted(os.listdir(disk)) == ["a.zip", "filler"]


# == a daemon killed mid-rewrite ===================================================================


@NEEDS_FUSE
@pytest.mark.fuse
def test_a_daemon_killed_mid_rewrite_leaves_the_old_archive_and_a_temp_the_sweep_removes(
    mounter: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    archive = folder / "a.zip"
    archive.write_bytes(make_zip({"keep.txt": b"keep\n"}))
    old = archive.read_bytes()
    source = f"file://{archive}|zip:"
    mp = mounter.daemon(source)
    pid = mounter.pid(mp)
    (mp / "big.bin").write_bytes(os.urandom(32 << 20))  # deflating it takes a while

    def temps() -> list[Path]:
        return [p for p in folder.iterdir() if p.name.startswith(".a.zip.n5fs~")]

    def flush() -> None:
        with contextlib.suppress(OSError):  # ENOTCONN once the daemon is killed
            fsync_path(mp / ".n5fs" / "stats.json")

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    wait_until(lambda: any(p.stat().st_size for p in temps()), "the rewrite's temp archive")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not process_alive(pid), "the daemon dies")
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the dead daemon is reaped")
    flusher.join(timeout=30)
    [temp] = temps()
    assert archive.read_bytes() == old  # never a broken archive

    result = mounter.cli("unmount", str(mp))  # stale: detached without a flush
    assert result.returncode == 0, result.stderr
    # Gateway.sweep_leftovers does this once at mount; here straight on the store
    store = ZipStore(FileStore(folder), "a.zip")
    [leftover] = store.leftovers()
    assert leftover.path == temp.name
    assert leftover.what == "temp archive"
    assert leftover.dead
    assert f"pid {pid}" in leftover.writer
    assert store.sweep() == (leftover,)
    assert not temp.exists()
    assert os.listdir(folder) == ["a.zip"]

    again = mounter.daemon(source, name="again")
    assert not (again / "big.bin").exists()
    assert (again / "keep.txt").read_bytes() == b"keep\n"
