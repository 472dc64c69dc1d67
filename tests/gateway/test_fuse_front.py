"""The FUSE front without a mount: the errno funnel over a real Gateway, st_* dicts, -o
parsing, readdir paging, the mount table, and the daemon's pipe and state files."""

from __future__ import annotations

import ctypes.util
import errno
import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from n5fs.cli.daemon import (
    PID_TAG,
    READY_TOKEN,
    await_ready,
    daemon_lines,
    process_alive,
    read_state,
    remove_state,
    state_dir,
    state_path,
    write_state,
)
from n5fs.errors import InvalidSource, StoreUnavailable
from n5fs.fuse_front import _lib
from n5fs.fuse_front.attrs import BLKSIZE, StatMaker
from n5fs.fuse_front.mounts import MountFailed, parse_mountinfo
from n5fs.fuse_front.operations import UTIME_NOW, UTIME_OMIT, N5fsOperations
from n5fs.fuse_front.options import (
    fsname_of,
    fuse_options,
    parse_options,
    parse_size,
    split_options,
)
from n5fs.gateway import Attr, EntryKind, Gateway, GatewayConfig
from n5fs.gateway.read.reader import PageCache
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import FaultyStore

ZARRAY = json.dumps(
    {
        "zarr_format": 2,
        "shape": [4],
        "chunks": [2],
        "dtype": "<u1",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
).encode()


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore()
    s.set("a/.zarray", ZARRAY)
    s.set("a/0", b"\x01\x02")
    s.set("notes.txt", b"hello")
    return s


def ops_over(store, **config) -> N5fsOperations:
    return N5fsOperations(Gateway(store, GatewayConfig(**config)))


def errno_from(call) -> int:
    with pytest.raises(OSError) as info:
        call()
    assert isinstance(info.value, _lib.FuseOSError)
    return info.value.errno


# == the funnel =====================================================================================


def test_missing_path_is_enoent(store):
    ops = ops_over(store)
    assert errno_from(lambda: ops.getattr("/nope")) == errno.ENOENT
    assert errno_from(lambda: ops.open("/nope", os.O_RDONLY)) == errno.ENOENT


def test_refused_content_is_einval_at_flush_and_nothing_is_stored(store):
    ops = ops_over(store)
    fh = ops.create("/a/1", 0o644, os.O_WRONLY)
    ops.write("/a/1", b"\x00" * 7, 0, fh)  # a 2-byte chunk cannot hold 7 bytes
    assert errno_from(lambda: ops.flush("/a/1", fh)) == errno.EINVAL
    ops.release("/a/1", fh)
    assert store.get("a/1") is None


def test_a_close_before_any_write_of_an_empty_chunk_is_einval_logged_at_debug(store, caplog):
    """The shell's first close of `cmd > chunk`: EINVAL, but no warning (the command may
    write yet); the refusal is logged when the last handle goes with nothing written."""
    ops = ops_over(store)
    fh = ops.create("/a/1", 0o644, os.O_WRONLY | os.O_TRUNC)
    with caplog.at_level(logging.DEBUG, logger="n5fs"):
        assert errno_from(lambda: ops.flush("/a/1", fh)) == errno.EINVAL
    [record] = [r for r in caplog.records if "errno 22" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with caplog.at_level(logging.DEBUG, logger="n5fs"):
        ops.release("/a/1", fh)
    assert [r.name for r in caplog.records if r.levelno == logging.WARNING] == [
        "n5fs.gateway.commit.committer"
    ]
    assert store.get("a/1") is None


def test_valid_write_commits_at_flush(store):
    ops = ops_over(store)
    fh = ops.create("/a/1", 0o644, os.O_WRONLY)
    assert ops.write("/a/1", b"\x07\x08", 0, fh) == 2
    ops.flush("/a/1", fh)
    ops.release("/a/1", fh)
    assert store.get("a/1") == b"\x07\x08"


def test_read_only_mount_is_erofs(store):
    ops = ops_over(store, read_only=True)
    assert errno_from(lambda: ops.create("/new", 0o644, os.O_WRONLY)) == errno.EROFS
    assert errno_from(lambda: ops.mkdir("/d", 0o755)) == errno.EROFS
    assert errno_from(lambda: ops.unlink("/notes.txt")) == errno.EROFS


def test_directory_errors(store):
    ops = ops_over(store)
    assert errno_from(lambda: ops.rmdir("/a")) == errno.ENOTEMPTY
    assert errno_from(lambda: ops.mkdir("/a", 0o755)) == errno.EEXIST
    assert errno_from(lambda: ops.create("/notes.txt", 0o644, os.O_WRONLY | os.O_EXCL)) == (
        errno.EEXIST
    )


def test_store_fault_is_eio_with_traceback_and_the_next_call_works(store, caplog):
    faulty = FaultyStore(store)
    ops = N5fsOperations(Gateway(faulty))
    faulty.fail("list", StoreUnavailable, times=1)
    with caplog.at_level(logging.DEBUG, logger="n5fs.fuse_front"):
        assert errno_from(lambda: ops.getattr("/notes.txt")) == errno.EIO
    [record] = [r for r in caplog.records if "errno 5" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.exc_info
    assert record.exc_info[0] is StoreUnavailable
    assert ops.getattr("/notes.txt")["st_size"] == 5


def test_enoent_logs_at_debug_without_traceback(store, caplog):
    ops = ops_over(store)
    with caplog.at_level(logging.DEBUG, logger="n5fs.fuse_front"):
        errno_from(lambda: ops.getattr("/nope"))
    [record] = caplog.records
    assert record.levelno == logging.DEBUG
    assert not record.exc_info


class _Broken:
    """A gateway whose every call fails with an exception n5fs does not know."""

    read_only = False

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError(f"bug in {name}")

        return fail


def test_unknown_exception_is_eio_never_einval():
    ops = N5fsOperations(_Broken())
    for call in (
        lambda: ops.getattr("/x"),
        lambda: ops.read("/x", 10, 0, 1),
        lambda: ops.flush("/x", 1),
        lambda: ops.rename("/x", "/y"),
    ):
        assert errno_from(call) == errno.EIO


def test_destroy_closes_the_gateway_once():
    calls = []

    class Closing(_Broken):
        def close(self):
            calls.append("close")

    ops = N5fsOperations(Closing())
    ops.destroy("/")
    ops.destroy("/")
    ops.close()
    assert calls == ["close"]


# == names, links, attributes =======================================================================


def test_link_and_rename_argument_order(store):
    ops = ops_over(store)
    ops.link("/copy.txt", "/notes.txt")  # mfusepy: (new name, existing file)
    assert store.get("copy.txt") == b"hello"
    ops.rename("/copy.txt", "/moved.txt")
    assert store.get("moved.txt") == b"hello"
    assert store.get("copy.txt") is None


def test_rename_flags(store):
    ops = ops_over(store)
    store.set("other.txt", b"x")
    noreplace = _lib.RENAME_NOREPLACE
    assert errno_from(lambda: ops.rename("/notes.txt", "/other.txt", noreplace)) == errno.EEXIST
    assert store.get("other.txt") == b"x"
    assert errno_from(lambda: ops.rename("/notes.txt", "/z", _lib.RENAME_EXCHANGE)) == errno.EINVAL
    ops.rename("/notes.txt", "/fresh.txt", noreplace)
    assert store.get("fresh.txt") == b"hello"


def test_chmod_chown_accepted_for_existing_paths(store):
    ops = ops_over(store)
    assert ops.chmod("/notes.txt", 0o600) == 0
    assert ops.chown("/notes.txt", 1, 1) == 0
    assert errno_from(lambda: ops.chmod("/nope", 0o600)) == errno.ENOENT
    assert ops.getattr("/notes.txt")["st_mode"] == stat.S_IFREG | 0o644


def test_utimens_keeps_the_modification_time(store):
    ops = ops_over(store)
    assert ops.utimens("/notes.txt", (5 * 10**9, 1_000_000_000 * 10**9 + 500_000_000)) == 0
    assert ops.getattr("/notes.txt")["st_mtime"] == 1_000_000_000 * 10**9 + 500_000_000
    before = ops.getattr("/notes.txt")["st_mtime"]
    assert ops.utimens("/notes.txt", (0, UTIME_OMIT)) == 0  # atime only: nothing to keep
    assert ops.getattr("/notes.txt")["st_mtime"] == before
    assert ops.utimens("/notes.txt", (0, UTIME_NOW)) == 0  # `touch`: now
    assert ops.getattr("/notes.txt")["st_mtime"] > before
    assert errno_from(lambda: ops.utimens("/nope", None)) == errno.ENOENT


@pytest.mark.parametrize("op", ["getxattr", "setxattr", "removexattr"])
def test_xattr_calls_are_left_to_libfuse(op):
    """Not registered with libfuse (mfusepy skips its own placeholders): libfuse answers
    ENOSYS and the kernel stops asking (tests/mount/test_mount_reads.py checks the mount)."""
    assert getattr(getattr(N5fsOperations, op), "libfuse_ignore", False)


def test_xattr_lists_are_empty(store):
    ops = ops_over(store)
    assert not getattr(N5fsOperations.listxattr, "libfuse_ignore", False)
    assert ops.listxattr("/notes.txt") == []


def test_control_files_bypass_the_page_cache(store):
    ops = ops_over(store)
    assert ops.direct_io("/.n5fs/stats.json")
    assert not ops.direct_io("/notes.txt")
    fh = ops.open("/.n5fs/stats.json", os.O_RDONLY)
    assert ops.page_cache("/.n5fs/stats.json", fh) is PageCache.BYPASS


def test_readdir_carries_attributes(store):
    ops = ops_over(store)
    fh = ops.opendir("/")
    entries = dict(ops.dir_entries("/", fh))
    assert set(entries) == {"a", "notes.txt"}  # /.n5fs is reachable, never listed
    assert entries["notes.txt"]["st_size"] == 5
    assert stat.S_ISDIR(entries["a"]["st_mode"])
    names = [name for name, _, _ in ops.readdir("/", fh)]
    assert names[:2] == [".", ".."]
    ops.releasedir("/", fh)


def test_readdir_pages_resume_at_any_offset(store):
    for i in range(5):
        store.set(f"many/f{i}", b"")
    ops = ops_over(store)
    fh = ops.opendir("/many")
    full = list(_lib._entries_from(ops, "/many", fh, 0))
    assert [o for o, _, _ in full] == list(range(1, 8))
    assert [n for _, n, _ in full] == [".", "..", "f0", "f1", "f2", "f3", "f4"]
    for offset in range(1, len(full) + 1):
        assert list(_lib._entries_from(ops, "/many", fh, offset)) == full[offset:]
    store.set("many/g", b"")
    assert [n for _, n, _ in _lib._entries_from(ops, "/many", fh, 3)][-1] == "f4"  # snapshot
    ops.gateway.drop_caches()
    rewound = list(_lib._entries_from(ops, "/many", fh, 0))  # rewinddir reads afresh
    assert [n for _, n, _ in rewound][-1] == "g"


# == attributes =====================================================================================


@pytest.mark.parametrize(
    ("kind", "writable", "read_only", "mode"),
    [
        (EntryKind.FILE, True, False, stat.S_IFREG | 0o644),
        (EntryKind.FILE, True, True, stat.S_IFREG | 0o444),
        (EntryKind.FILE, False, False, stat.S_IFREG | 0o444),
        (EntryKind.DIR, True, False, stat.S_IFDIR | 0o755),
        (EntryKind.DIR, True, True, stat.S_IFDIR | 0o555),
        (EntryKind.SYMLINK, True, True, stat.S_IFLNK | 0o777),
    ],
)
def test_modes(kind, writable, read_only, mode):
    st = StatMaker(read_only=read_only)(Attr(kind, 3, 1.0, writable))
    assert st["st_mode"] == mode


@pytest.mark.parametrize(("size", "blocks"), [(0, 0), (1, 1), (512, 1), (513, 2), (10**6, 1954)])
def test_blocks_count_512_byte_units(size, blocks):
    st = StatMaker()(Attr(EntryKind.FILE, size, 1.0))
    assert st["st_blocks"] == blocks
    assert st["st_blksize"] == BLKSIZE


def test_owner_and_times():
    maker = StatMaker(uid=1234, gid=99, mounted_ns=7)
    st = maker(Attr(EntryKind.FILE, 1, 1.5))
    assert (st["st_uid"], st["st_gid"]) == (1234, 99)
    assert st["st_mtime"] == 1_500_000_000
    assert maker(Attr(EntryKind.DIR))["st_mtime"] == 7  # folders have no time of their own
    assert maker(Attr(EntryKind.DIR))["st_nlink"] == 2


# == options ========================================================================================


def test_split_options_keeps_escaped_commas():
    assert split_options("ro, allow_other,fsname=a\\,b,,") == ["ro", "allow_other", "fsname=a,b"]


def test_parse_options_separates_n5fs_from_libfuse():
    opts = parse_options(["ro,validate=warn", "cache_size=1G,cache_ttl=2.5,allow_other,uid=5"])
    assert opts.read_only
    assert (opts.validate, opts.cache_bytes, opts.ttl) == ("warn", 1 << 30, 2.5)
    assert opts.fuse == {"allow_other": True, "uid": "5"}
    assert not parse_options(["ro", "rw"]).read_only  # the later one wins


@pytest.mark.parametrize("bad", ["validate=maybe", "cache_size=lots", "cache_ttl=-1"])
def test_bad_n5fs_options_are_refused(bad):
    with pytest.raises(InvalidSource):
        parse_options([bad])


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("512M", 512 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("64k", 1 << 16)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_fuse_options_read_write_libfuse3():
    got = fuse_options(
        parse_options([]), read_only=False, ttl=5.0, fsname="s3://b/p", libfuse_major=3
    )
    assert got == {
        "fsname": "s3://b/p",
        "subtype": "n5fs",
        "attr_timeout": "5",
        "entry_timeout": "5",
        "negative_timeout": "5",
    }


def test_fuse_options_read_only_keeps_the_page_cache_and_user_wins():
    got = fuse_options(
        parse_options(["attr_timeout=60,subtype=x"]),
        read_only=True,
        ttl=0.5,
        fsname="a, b",
        libfuse_major=3,
    )
    assert got["ro"] is True
    assert got["kernel_cache"] is True
    assert got["attr_timeout"] == "60"
    assert got["entry_timeout"] == "0.5"
    assert got["subtype"] == "n5fs"
    assert got["fsname"] == fsname_of("a, b") == "a__b"
    own = fuse_options(
        parse_options(["auto_cache"]), read_only=True, ttl=1, fsname="x", libfuse_major=3
    )
    assert "kernel_cache" not in own


def test_fuse_options_libfuse2_asks_for_big_writes():
    got = fuse_options(parse_options([]), read_only=False, ttl=1, fsname="x", libfuse_major=2)
    assert got["big_writes"] is True
    assert got["max_write"] == str(128 << 10)


# == the binding ====================================================================================


@pytest.mark.skipif(not ctypes.util.find_library("fuse3"), reason="libfuse 3 is not installed")
def test_libfuse3_is_preferred():
    assert _lib.LIBFUSE_VERSION[0] == 3
    assert "libfuse 3." in _lib.describe()


def test_cli_help_does_not_load_libfuse():
    code = (
        "import sys; from n5fs.cli.main import build_parser; import n5fs.cli.mount; "
        "import n5fs.fuse_front.options; build_parser().format_help(); "
        "assert 'mfusepy' not in sys.modules and 'n5fs.fuse_front._lib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# == the mount table ================================================================================

MOUNTINFO = (
    "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
    "42 22 0:39 / /mnt/with\\040space rw,nosuid - fuse.n5fs s3://b/p rw,user_id=0\n"
    "43 22 0:40 / /mnt/other rw shared:5 - fuse.sshfs u@h:/x rw\n"
)


def test_parse_mountinfo():
    entries = list(parse_mountinfo(MOUNTINFO))
    assert [e.mountpoint for e in entries] == ["/", "/mnt/with space", "/mnt/other"]
    assert [e.is_n5fs for e in entries] == [False, True, False]
    assert entries[1].source == "s3://b/p"
    assert entries[2].fstype == "fuse.sshfs"  # optional fields before "-" are skipped


# == the daemon's pipe and state files ==============================================================


def _pipe_with(data: bytes, close: bool = True) -> tuple[int, int]:
    r, w = os.pipe()
    os.write(w, data)
    if close:
        os.close(w)
    return r, w


def test_await_ready_returns_once_the_daemon_is_ready(capsys):
    r, _ = _pipe_with(PID_TAG + b"12\nn5fs: WARNING: slow\nlibfuse chatter\n" + READY_TOKEN)
    assert await_ready(r, what="mount", timeout=30) == 0
    assert capsys.readouterr().err == "n5fs: WARNING: slow\n"


def test_await_ready_reports_what_the_daemon_said():
    said = b"Ignoring invalid max threads value 1 > max (2).\nfuse: unknown option(s): `-o x'\n"
    r, _ = _pipe_with(PID_TAG + b"12\n" + said)
    with pytest.raises(MountFailed, match=r"unknown option\(s\)") as info:
        await_ready(r, what="mount of x", timeout=30)
    assert "max threads" not in str(info.value)


def test_await_ready_gives_up_and_stops_the_daemon():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    r, w = _pipe_with(PID_TAG + str(sleeper.pid).encode() + b"\n", close=False)
    try:
        with pytest.raises(MountFailed, match="no answer"):
            await_ready(r, what="mount", timeout=0.2)
        assert sleeper.wait(timeout=30) == -15
    finally:
        os.close(w)
        sleeper.kill()


def test_daemon_lines_drop_protocol_and_noise():
    buf = PID_TAG + b"1\n\nIgnoring invalid max threads value\nreal\n" + READY_TOKEN
    assert daemon_lines(buf) == ["real"]


def test_state_files(tmp_path, monkeypatch):
    monkeypatch.setenv("N5FS_STATE_DIR", str(tmp_path / "state"))
    assert state_dir() == tmp_path / "state"
    path = state_path("/mnt/x")
    assert path != state_path("/mnt/y")
    write_state(path, {"pid": 7, "mountpoint": "/mnt/x"})
    assert read_state(path) == {"pid": 7, "mountpoint": "/mnt/x"}
    remove_state(path, pid=8)  # someone else's: kept
    assert path.exists()
    remove_state(path, pid=7)
    assert not path.exists()
    assert read_state(path) is None


def test_process_alive():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)


@pytest.mark.parametrize("kind", [EntryKind.FILE, EntryKind.DIR, EntryKind.SYMLINK])
def test_readdir_plus_stat_matches_the_binding_s_own_filler(kind: EntryKind) -> None:
    """The fast filler writes the same ``struct stat`` as mfusepy's ``set_st_attrs``, and a
    field a dict of another shape set (``st_ino``) does not leak into the next entry."""
    fuse = _lib._fuse
    attrs = StatMaker(read_only=False)(Attr(kind, 5000, 1_700_000_000.123456, True))
    reference = fuse.c_stat()
    fuse.set_st_attrs(reference, attrs, use_ns=True)
    st = fuse.c_stat()
    fill = _lib._StatFiller(st)
    fill({**attrs, "st_ino": 42})  # another shape: the binding's filler
    assert st.st_ino == 42
    fill(attrs)
    assert bytes(st) == bytes(reference)
    assert (st.st_mtimespec.tv_sec, st.st_mtimespec.tv_nsec) == (1_700_000_000, 123456000)
