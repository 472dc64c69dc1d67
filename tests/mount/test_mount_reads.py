"""Reads through a real read-write mount: re-reads that keep the kernel's pages
never serve bytes of another version, a reader open across a replacement keeps its version,
and a mount without extended attributes still lets cp -a, rsync -aX and tar --xattrs copy.

Every mount runs in its own process and is always unmounted (tests/mounting.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.mounting import real_mount, wait_until

pytestmark = real_mount(120)

OLD = b"old bytes " * 100_000  # ~1 MB: several kernel reads, and pages worth keeping
NEW = b"NEW BYTES " * 100_000  # same size: only the bytes tell the versions apart


@pytest.fixture
def backing(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    (store / "plain").mkdir(parents=True)
    (store / "plain" / "f.bin").write_bytes(OLD)
    (store / "plain" / "notes.txt").write_bytes(b"notes\n")
    return store


def replace_behind(backing: Path, data: bytes) -> None:
    """Another process replaces the stored file, as every atomic writer does (a new inode)."""
    tmp = backing / "plain" / "f.bin.other"
    tmp.write_bytes(data)
    os.replace(tmp, backing / "plain" / "f.bin")


def read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=60, check=False
    )


# == re-reads and replacements ====================================================================


def bytes_served(mp: Path) -> int:
    return int(json.loads((mp / ".n5fs" / "stats.json").read_bytes())["bytes_out"])


def test_re_reads_see_a_file_another_process_replaced(mounter, backing):
    mp = mounter.foreground(str(backing), "-o", "cache_ttl=3600")
    path = mp / "plain" / "f.bin"
    assert read(path) == OLD
    served = bytes_served(mp)
    assert read(path) == OLD
    assert bytes_served(mp) == served  # the second open kept the kernel's pages
    replace_behind(backing, NEW)
    assert read(path) == NEW  # a new file on disk: its open drops them, however long the TTL
    assert read(path) == NEW


def test_a_changed_size_is_seen_once_the_ttl_passed(mounter, backing):
    mp = mounter.foreground(str(backing), "-o", "cache_ttl=1")
    path = mp / "plain" / "f.bin"
    assert read(path) == OLD
    assert read(path) == OLD
    replace_behind(backing, NEW * 2)
    wait_until(lambda: os.stat(path).st_size == len(NEW) * 2, "the kernel asks for the size")
    assert read(path) == NEW * 2


def test_re_reads_see_the_mounts_own_commit(mounter, backing):
    mp = mounter.foreground(str(backing), "-o", "cache_ttl=3600")
    path = mp / "plain" / "f.bin"
    assert read(path) == OLD
    assert read(path) == OLD
    path.write_bytes(NEW)
    assert read(path) == NEW
    (mp / "plain" / "t.bin").write_bytes(OLD)
    os.rename(mp / "plain" / "t.bin", path)  # zarr-python's and TensorStore's commit
    assert read(path) == OLD


def test_a_reader_open_across_a_rename_over_keeps_its_version(mounter, backing):
    mp = mounter.foreground(str(backing))
    path = mp / "plain" / "f.bin"
    with open(path, "rb", buffering=0) as old_reader:
        first = old_reader.read(5000)
        (mp / "plain" / "t.bin").write_bytes(NEW)
        os.rename(mp / "plain" / "t.bin", path)
        assert read(path) == NEW  # a new open reads the new file
        assert first + old_reader.read() == OLD  # never a mix
    assert read(path) == NEW


def test_readers_of_two_versions_never_see_each_others_bytes(mounter, backing):
    """The kernel caches pages per name: while a reader of the replaced file is open, a reader
    of the new one reads around the pages the old one fills (docs/semantics.md)."""
    mp = mounter.foreground(str(backing), "-o", "cache_ttl=3600")
    path = mp / "plain" / "f.bin"
    read(path)
    with open(path, "rb", buffering=0) as old_reader:
        first = old_reader.read(5000)
        replace_behind(backing, NEW)
        with open(path, "rb", buffering=0) as new_reader:
            halves = [new_reader.read(len(NEW) // 2)]
            rest = old_reader.read()  # fills pages with the old bytes
            halves.append(new_reader.read())
        assert first + rest == OLD
        assert b"".join(halves) == NEW
    assert read(path) == NEW  # the first open after both closed drops those pages
    assert read(path) == NEW


def test_stat_through_the_mount_shows_the_stored_file(mounter, backing):
    """Every field ``stat`` shows of a file and a folder (filled without a dict per call)."""
    os.utime(backing / "plain" / "notes.txt", ns=(0, 1_234_567_891_000_000_000))
    mp = mounter.foreground(str(backing))
    st = os.stat(mp / "plain" / "notes.txt")
    assert (st.st_size, st.st_nlink, st.st_blocks) == (6, 1, 1)
    assert st.st_mode == 0o100644
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert st.st_mtime_ns == st.st_ctime_ns == st.st_atime_ns == 1_234_567_891_000_000_000
    folder = os.stat(mp / "plain")
    assert (folder.st_mode, folder.st_nlink) == (0o40755, 2)
    with pytest.raises(FileNotFoundError):
        os.stat(mp / "plain" / "absent")


def test_closing_a_reader_does_not_commit_another_descriptors_writes(mounter, backing):
    """A read-only descriptor commits nothing at close (the kernel is told not to FLUSH it):
    the writer's own close commits its bytes, and a reader's close meanwhile changes
    nothing in the store."""
    mp = mounter.foreground(str(backing))
    path = mp / "plain" / "f.bin"
    writer = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(writer, NEW)
        reader = os.open(path, os.O_RDONLY)
        os.close(reader)
        assert (backing / "plain" / "f.bin").read_bytes() == OLD
    finally:
        os.close(writer)
    assert (backing / "plain" / "f.bin").read_bytes() == NEW
    assert read(path) == NEW


# == extended attributes ==========================================================================


def test_xattrs_are_not_supported(mounter, backing):
    mp = mounter.foreground(str(backing))
    path = mp / "plain" / "notes.txt"
    assert os.listxattr(path) == []  # "none": tar --xattrs lists without a warning
    calls = [
        lambda: os.getxattr(path, "user.note"),
        lambda: os.getxattr(path, "security.selinux"),
        lambda: os.setxattr(path, "user.note", b"x"),
        lambda: os.removexattr(path, "user.note"),
    ]
    for _ in range(2):  # the second time the kernel answers without asking n5fs
        for call in calls:
            with pytest.raises(OSError) as info:
                call()
            assert info.value.errno == errno.ENOTSUP
    assert path.read_bytes() == b"notes\n"


def test_cp_rsync_and_tar_keep_their_xattr_options_working(mounter, backing, tmp_path):
    mp = mounter.foreground(str(backing))
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "s.txt").write_bytes(b"from outside\n")
    out = tmp_path / "out"
    out.mkdir()
    steps = [
        ("cp", "-a", mp / "plain", out / "cp"),
        ("cp", "-a", src, mp / "in-cp"),
        ("rsync", "-aX", f"{mp / 'plain'}/", out / "rsync"),
        ("rsync", "-aX", f"{src}/", mp / "in-rsync"),
        ("tar", "--xattrs", "-cf", tmp_path / "from-mount.tar", "-C", mp, "plain"),
        ("tar", "--xattrs", "-cf", tmp_path / "src.tar", "-C", src, "sub"),
    ]
    for argv in steps:
        if shutil.which(str(argv[0])) is None:
            pytest.fail(f"{argv[0]} is not installed")
        done = run(*argv)
        assert done.returncode == 0, (argv, done.stderr)
        assert "xattr" not in done.stderr, (argv, done.stderr)
    (out / "tar").mkdir()
    (mp / "in-tar").mkdir()
    for archive, into in (
        (tmp_path / "from-mount.tar", out / "tar"),
        (tmp_path / "src.tar", mp / "in-tar"),
    ):
        done = run("tar", "--xattrs", "-xf", archive, "-C", into)
        assert done.returncode == 0, done.stderr
    for copy in (out / "cp", out / "rsync", out / "tar" / "plain"):
        assert (copy / "f.bin").read_bytes() == OLD
        assert (copy / "notes.txt").read_bytes() == b"notes\n"
    for name in ("in-cp", "in-rsync", "in-tar"):
        assert (mp / name / "sub" / "s.txt").read_bytes() == b"from outside\n"
        assert (backing / name / "sub" / "s.txt").read_bytes() == b"from outside\n"


def bdi_read_ahead(mp: Path) -> int:
    device = os.stat(mp).st_dev
    return int(
        Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb").read_text()
    )


@pytest.mark.skipif(not Path("/sys/class/bdi").is_dir(), reason="no /sys/class/bdi (not Linux)")
def test_the_kernel_reads_ahead_in_requests_of_a_mebibyte(mounter, backing):
    """The mount's read-ahead is 1 MiB once it answers (root may set it), or what
    ``-o read_ahead_kb=`` says; 0 leaves the kernel's; bytes read the same either way."""
    mp = mounter.daemon(str(backing), "-o", "ro")
    kernel = bdi_read_ahead(mounter.daemon(str(backing), "-o", "ro,read_ahead_kb=0", name="k"))
    if os.geteuid() != 0:
        assert bdi_read_ahead(mp) == kernel  # only root may change it: the kernel's stays
        return
    assert bdi_read_ahead(mp) == 1024
    assert (mp / "plain" / "f.bin").read_bytes() == OLD
    other = mounter.daemon(str(backing), "-o", "read_ahead_kb=256", name="rw")
    assert bdi_read_ahead(other) == 256
    assert (other / "plain" / "f.bin").read_bytes() == OLD
