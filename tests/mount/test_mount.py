"""Real mounts: POSIX tools on the front, the errno table, locks, and the ``n5fs mount /
unmount / status`` daemon life cycle (real writers through a mount: test_mount_formats.py).

Every mount runs in its own process and is always unmounted (tests/mounting.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from n5fs.cli.daemon import process_alive, state_path
from n5fs.cli.demo import demo_store
from n5fs.fuse_front.mounts import is_stale, mount_entry
from n5fs.kvstore.tempnames import writer_of
from tests.mounting import real_mount, wait_until

pytestmark = real_mount(120)

SERVE_FAULTY = """
import os
import sys
from n5fs.fuse_front._lib import LIBFUSE_VERSION
from n5fs.fuse_front.mount import serve
from n5fs.fuse_front.options import MountOptions, fuse_options
from n5fs.gateway import Gateway
from n5fs.kvstore.file import FileStore
from n5fs.testing.doubles import FaultyStore

store = FaultyStore(FileStore(sys.argv[1]))
broken = os.path.join(sys.argv[1], "BROKEN")  # while it exists, reading flaky.txt fails
store.fail("get", times=None, when=lambda key: key.endswith("flaky.txt") and os.path.exists(broken))
options = fuse_options(MountOptions(), read_only=False, ttl=5.0, fsname="faulty",
                       libfuse_major=LIBFUSE_VERSION[0])
serve(Gateway(store), sys.argv[2], options)
"""


#: mfusepy's own create asks inspect.signature of the operation at every call; n5fs's glue
#: must not (it cost a tenth of the daemon's time in a cp -r of small chunks)
SERVE_NO_SIGNATURE = """
import sys
import mfusepy
from n5fs.fuse_front._lib import LIBFUSE_VERSION
from n5fs.fuse_front.mount import serve
from n5fs.fuse_front.options import MountOptions, fuse_options
from n5fs.gateway import Gateway
from n5fs.kvstore.file import FileStore

class NoSignature:
    @staticmethod
    def signature(*args, **kwargs):
        raise AssertionError("inspect.signature asked on the hot path")

mfusepy.inspect = NoSignature
options = fuse_options(MountOptions(), read_only=False, ttl=5.0, fsname="nosig",
                       libfuse_major=LIBFUSE_VERSION[0])
serve(Gateway(FileStore(sys.argv[1])), sys.argv[2], options)
"""


@pytest.fixture
def backing(tmp_path) -> Path:
    store = tmp_path / "store"
    (store / "plain").mkdir(parents=True)
    (store / "plain" / "hello.txt").write_bytes(b"hello\n")
    return store


def errno_of_call(call) -> int:
    with pytest.raises(OSError) as info:
        call()
    return info.value.errno


# == the front: tools on a mounted store ===========================================================


def test_ls_stat_cat_find_on_the_demo(mounter):
    mp = mounter.foreground("demo:")
    store = demo_store()
    keys = {info.key: info.size for info in store.list("", delimiter=None).keys}
    found = subprocess.run(
        ["find", str(mp), "-type", "f"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert {os.path.relpath(p, mp) for p in found} == {
        *keys,
    }
    for key, size in keys.items():
        assert os.stat(mp / key).st_size == size
    stats = mp / ".n5fs" / "stats.json"
    before = json.loads(stats.read_text())
    assert (mp / "README.txt").read_bytes() == store.get("README.txt")
    after = json.loads(stats.read_text())  # longer now: never cut at the cached size
    assert after["bytes_out"] >= before["bytes_out"] + len(store.get("README.txt"))
    listing = subprocess.run(
        ["ls", "-lR", str(mp)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "zarr.json" in listing
    assert mount_entry(str(mp)).fstype == "fuse.n5fs"


def test_cp_mkdir_mv_rm_through_the_mount(mounter, backing, tmp_path):
    mp = mounter.foreground(str(backing))
    payload = np.random.default_rng(1).bytes(3 << 20)
    (tmp_path / "big.bin").write_bytes(payload)
    subprocess.run(["cp", str(tmp_path / "big.bin"), str(mp / "plain")], check=True, timeout=60)
    assert (backing / "plain" / "big.bin").read_bytes() == payload
    subprocess.run(["mkdir", "-p", str(mp / "d" / "e")], check=True, timeout=60)
    assert (backing / "d" / "e").is_dir()
    subprocess.run(
        ["cp", "-r", str(mp / "plain"), str(mp / "d" / "e" / "copy")], check=True, timeout=60
    )
    assert (backing / "d/e/copy/big.bin").read_bytes() == payload
    subprocess.run(
        ["mv", str(mp / "plain" / "hello.txt"), str(mp / "d" / "hi.txt")], check=True, timeout=60
    )
    assert (backing / "d" / "hi.txt").read_bytes() == b"hello\n"
    assert not (backing / "plain" / "hello.txt").exists()
    with open(mp / "d" / "hi.txt", "ab") as f:
        f.write(b"again\n")
    assert (backing / "d" / "hi.txt").read_bytes() == b"hello\nagain\n"
    os.truncate(mp / "d" / "hi.txt", 2)
    assert (mp / "d" / "hi.txt").read_bytes() == b"he"
    # FUSE sends RELEASE after close() returns: if it is still on its way, the gateway stages
    # the truncate on the open node and commits it at that release, a moment later
    hi = backing / "d" / "hi.txt"
    wait_until(lambda: hi.read_bytes() == b"he", "the truncate reaches the store")
    subprocess.run(["rm", "-r", str(mp / "d" / "e")], check=True, timeout=60)
    assert not (backing / "d" / "e").exists()
    os.unlink(mp / "d" / "hi.txt")
    os.rmdir(mp / "d")
    assert sorted(os.listdir(mp)) == ["plain"]


def test_errnos_of_a_writable_mount(mounter, backing):
    mp = mounter.foreground(str(backing))
    assert errno_of_call(lambda: (mp / "missing").read_bytes()) == errno.ENOENT
    assert errno_of_call(lambda: os.open(mp / "plain" / "hello.txt", os.O_CREAT | os.O_EXCL)) == (
        errno.EEXIST
    )
    assert errno_of_call(lambda: os.rmdir(mp / "plain")) == errno.ENOTEMPTY
    (mp / "other.txt").write_bytes(b"other")
    assert _renameat2(mp / "plain" / "hello.txt", mp / "other.txt", 1) == errno.EEXIST
    assert (mp / "other.txt").read_bytes() == b"other"
    os.mkdir(mp / "arr")

    def bad_metadata() -> None:
        with open(mp / "arr" / ".zarray", "wb") as f:
            f.write(b'{"zarr_format": 2}')  # no shape, chunks, dtype ...

    assert errno_of_call(bad_metadata) == errno.EINVAL  # at close(), the commit point
    assert not (backing / "arr" / ".zarray").exists()
    [rejection] = [
        json.loads(line) for line in (mp / ".n5fs" / "rejections").read_text().splitlines()
    ]
    assert rejection["path"] == "/arr/.zarray"


def _renameat2(old: Path, new: Path, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, bytes(old), at_fdcwd, bytes(new), flags) == 0:
        return 0
    return ctypes.get_errno()


def test_rejected_chunk_fails_at_close_and_the_old_chunk_stays(mounter):
    mp = mounter.foreground("demo:")
    chunk = mp / "zarr2" / "raw" / "0.0"
    before = chunk.read_bytes()
    with pytest.raises(OSError) as info, open(chunk, "wb") as f:
        f.write(b"not zstd at all")
    assert info.value.errno == errno.EINVAL
    assert chunk.read_bytes() == before
    good = np.full((16, 16), 7, dtype="<u2")
    chunk.write_bytes(numcodecs.Zstd(level=3).encode(good.tobytes()))
    decoded = numcodecs.Zstd().decode(chunk.read_bytes())
    assert np.array_equal(np.frombuffer(decoded, "<u2").reshape(16, 16), good)


def test_read_only_mount(mounter):
    mp = mounter.foreground("demo:", "-o", "ro")
    assert "ro" in mount_entry(str(mp)).options.split(",")
    assert errno_of_call(lambda: (mp / "new.txt").write_bytes(b"x")) == errno.EROFS
    assert errno_of_call(lambda: os.mkdir(mp / "d")) == errno.EROFS
    assert errno_of_call(lambda: os.unlink(mp / "README.txt")) == errno.EROFS
    assert os.stat(mp / "README.txt").st_mode & 0o222 == 0
    assert (mp / "README.txt").read_bytes().startswith(b"n5fs demo store")


def test_flock_and_fcntl_locks_exclude_each_other(mounter, backing):
    mp = mounter.foreground(str(backing))
    target = mp / "plain" / "hello.txt"
    holder = subprocess.Popen(
        ["flock", str(target), "-c", "echo locked; exec sleep 60"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        busy = subprocess.run(["flock", "-n", str(target), "true"], check=False, timeout=30)
        assert busy.returncode == 1
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and the shell holding its descriptor
        holder.wait()
        holder.stdout.close()
    # the killed `sleep` (flock's child, holding the descriptor) may close it a moment after
    # flock itself was reaped: poll, bounded
    for _ in range(100):
        free = subprocess.run(["flock", "-n", str(target), "true"], check=False, timeout=30)
        if free.returncode == 0:
            break
        time.sleep(0.1)
    assert free.returncode == 0
    hold = (
        "import fcntl,sys,time; f=open(sys.argv[1],'r+b'); fcntl.lockf(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(target)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        with open(target, "r+b") as f, pytest.raises(OSError) as info:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert info.value.errno in (errno.EAGAIN, errno.EACCES)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_store_fault_is_eio_and_the_daemon_lives(mounter, backing):
    (backing / "plain" / "flaky.txt").write_bytes(b"flaky")
    (backing / "BROKEN").touch()
    mp, proc = mounter.script(SERVE_FAULTY, str(backing))
    assert errno_of_call(lambda: (mp / "plain" / "flaky.txt").read_bytes()) == errno.EIO
    (backing / "BROKEN").unlink()
    assert (mp / "plain" / "flaky.txt").read_bytes() == b"flaky"  # the store is back
    assert (mp / "plain" / "hello.txt").read_bytes() == b"hello\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert mount_entry(str(mp)) is None


def test_create_takes_the_open_flags_without_inspecting_the_operation(mounter, backing):
    mp, _ = mounter.script(SERVE_NO_SIGNATURE, str(backing))
    target = mp / "plain" / "new.txt"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"created")
    finally:
        os.close(fd)
    assert target.read_bytes() == b"created"
    assert (backing / "plain" / "new.txt").read_bytes() == b"created"
    assert errno_of_call(lambda: os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)) == (
        errno.EEXIST
    )


# == the daemon ====================================================================================


def test_mount_returns_once_mounted_status_then_unmount(mounter):
    mp = mounter.daemon("demo:")
    entry = mount_entry(str(mp))  # no waiting: the command returned only once mounted
    assert entry is not None
    assert entry.is_n5fs
    assert os.stat(mp).st_dev != os.stat(mp.parent).st_dev
    pid = mounter.pid(mp)
    assert process_alive(pid)
    text = mounter.cli("status")
    assert text.returncode == 0
    [line] = [ln for ln in text.stdout.splitlines() if ln.startswith(f"{mp} ")]
    assert re.split(r"\s{2,}", line.strip()) == [str(mp), "demo:", "rw,strict", str(pid), "mounted"]
    rows = json.loads(mounter.cli("status", "--json").stdout)
    [row] = [r for r in rows if r["mountpoint"] == str(mp)]  # other n5fs mounts may exist
    assert (row["mountpoint"], row["pid"], row["state"]) == (str(mp), pid, "mounted")
    assert "commits" in row["counters"]
    result = mounter.cli("unmount", str(mp))
    assert result.returncode == 0, result.stderr
    assert mount_entry(str(mp)) is None
    assert not process_alive(pid)
    assert not state_path(str(mp)).exists()
    assert str(mp) not in mounter.cli("status").stdout  # gone (other mounts may remain)


@pytest.mark.parametrize(
    ("source", "extra", "reason"),
    [
        ("/nonexistent/volume", [], "no such directory"),
        ("bogus://x", [], "unknown URL scheme"),
        ("demo:", ["-o", "no_such_option"], "unknown option"),  # said by libfuse, in the daemon
        ("demo:", ["--cache-size", "lots"], "cannot read 'lots' as a size"),
        ("demo:", ["--staging-size", "lots"], "cannot read 'lots' as a size"),
        ("demo:", ["-o", "max_file_size=huge"], "cannot read 'huge' as a size"),
    ],
)
def test_mount_failure_reaches_the_terminal(mounter, source, extra, reason):
    mp = mounter.mountpoint()
    result = mounter.cli("mount", source, str(mp), *extra)
    assert result.returncode == 2
    assert reason in result.stderr
    assert mount_entry(str(mp)) is None


def test_mountpoint_must_be_a_free_directory(mounter):
    result = mounter.cli("mount", "demo:", str(mounter.tmp / "absent"))
    assert result.returncode == 2
    assert "does not exist (create it with mkdir -p" in result.stderr
    (mounter.tmp / "a-file").write_text("x")
    result = mounter.cli("mount", "demo:", str(mounter.tmp / "a-file"))
    assert result.returncode == 2
    assert "is not a directory" in result.stderr
    mp = mounter.daemon("demo:")
    again = mounter.cli("mount", "demo:", str(mp))
    assert again.returncode == 2
    assert "already mounted" in again.stderr


def test_sigterm_commits_staged_writes_and_unmounts(mounter, backing):
    mp = mounter.daemon(str(backing))
    pid = mounter.pid(mp)
    sitting = subprocess.Popen(["sleep", "60"], cwd=mp)  # keeps the mount busy
    pending = open(mp / "plain" / "pending.txt", "wb")  # noqa: SIM115 (left open on purpose)
    try:
        pending.write(b"x" * 100)
        pending.flush()  # written to the daemon's staging buffer, not yet committed
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not process_alive(pid), "the daemon exits after SIGTERM")
    finally:
        sitting.kill()
        sitting.wait()
        with contextlib.suppress(OSError):  # ENOTCONN: the mount is gone
            pending.close()
    assert (backing / "plain" / "pending.txt").read_bytes() == b"x" * 100
    assert mount_entry(str(mp)) is None
    assert not state_path(str(mp)).exists()


def test_sighup_drops_caches(mounter, backing):
    mp = mounter.daemon(str(backing), "--cache-ttl", "3600")
    assert os.listdir(mp / "plain") == ["hello.txt"]
    (backing / "plain" / "new.txt").write_bytes(b"new")
    assert os.listdir(mp / "plain") == ["hello.txt"]  # the listing is trusted for an hour
    os.kill(mounter.pid(mp), signal.SIGHUP)
    wait_until(lambda: "new.txt" in os.listdir(mp / "plain"), "the listing is read again")
    assert mount_entry(str(mp)) is not None


def test_a_killed_daemons_state_file_is_pruned_once_unmounted(mounter):
    """A daemon killed and its mount detached by hand (not by n5fs unmount) leaves its state
    file: status lists it with the hint, --prune removes it and says so."""
    mp = mounter.daemon("demo:")
    pid = mounter.pid(mp)
    state = json.loads(state_path(str(mp)).read_text())
    writer = writer_of(state["writer"])
    assert writer is not None
    assert writer.pid == pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: is_stale(str(mp)), "the mount goes stale")
    rows = json.loads(mounter.cli("status", "--json").stdout)
    [row] = [r for r in rows if r["mountpoint"] == str(mp)]
    assert row["state"].startswith("stale")  # still mounted: unmount's to clear, not prune's
    assert mounter.cli("status", "--prune").stdout.startswith("no stale state files\n")
    assert state_path(str(mp)).exists()
    subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=True, timeout=30)
    assert mount_entry(str(mp)) is None
    [line] = [ln for ln in mounter.cli("status").stdout.splitlines() if ln.startswith(f"{mp} ")]
    assert line.endswith("(run n5fs status --prune to remove)")
    pruned = mounter.cli("status", "--prune")
    assert pruned.returncode == 0, pruned.stderr
    assert f"removed stale state file {state_path(str(mp))}: {mp} (source demo:" in pruned.stdout
    assert not state_path(str(mp)).exists()
    assert str(mp) not in mounter.cli("status").stdout


def test_stale_mount_is_reported_and_cleared(mounter):
    mp = mounter.daemon("demo:")
    pid = mounter.pid(mp)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: is_stale(str(mp)), "the mount goes stale")
    rows = json.loads(mounter.cli("status", "--json").stdout)
    [row] = [r for r in rows if r["mountpoint"] == str(mp)]  # other n5fs mounts may exist
    assert row["state"].startswith("stale")
    again = mounter.cli("mount", "demo:", str(mp))  # a restart detaches the stale mount
    assert again.returncode == 0, again.stderr
    assert os.listdir(mp)
    os.kill(mounter.pid(mp), signal.SIGKILL)
    wait_until(lambda: is_stale(str(mp)), "the mount goes stale")
    result = mounter.cli("unmount", str(mp))
    assert result.returncode == 0, result.stderr
    assert mount_entry(str(mp)) is None
    assert not is_stale(str(mp))
