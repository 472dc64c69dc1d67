"""New files through a real mount: an empty new chunk is refused at ``close()`` and never
shown as a name that does not open; a create whose commit failed leaves no name, and the
caller's retry works at once (the kernel still holds the create's entry: it sends the retry
as a plain open)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.gateway.test_gateway import N5_ATTRS, n5_block
from tests.mounting import real_mount, wait_until

pytestmark = real_mount(120)

SERVE_FULL = """
import os
import sys
from n5fs.errors import NoSpace
from n5fs.fuse_front._lib import LIBFUSE_VERSION
from n5fs.fuse_front.mount import serve
from n5fs.fuse_front.options import MountOptions, fuse_options
from n5fs.gateway import Gateway
from n5fs.kvstore.file import FileStore
from n5fs.testing.doubles import FaultyStore

store = FaultyStore(FileStore(sys.argv[1]))
full = os.path.join(sys.argv[1], "FULL")  # while it exists, every commit finds the disk full
store.fail("set", NoSpace, times=None, when=lambda key: os.path.exists(full))
options = fuse_options(MountOptions(), read_only=False, ttl=5.0, fsname="full",
                       libfuse_major=LIBFUSE_VERSION[0])
serve(Gateway(store), sys.argv[2], options)
"""


def sh(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )


def rejected_paths(mp: Path) -> list[str]:
    lines = (mp / ".n5fs" / "rejections").read_text().splitlines()
    return [json.loads(line)["path"] for line in lines]


def never_shown_unopenable(path: Path, seconds: float) -> None:
    """For ``seconds``: whenever ``lstat`` finds the name, it opens (or it went between the
    two calls: then ``lstat`` says so too)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.lexists(path):
            try:
                with open(path, "rb") as f:
                    f.read()
            except FileNotFoundError:
                assert not os.path.lexists(path), f"{path} is shown but does not open"
        time.sleep(0.01)


def test_empty_new_chunks_are_refused_at_close_and_empty_plain_files_are_kept(
    mounter, tmp_path: Path
) -> None:
    backing = tmp_path / "store"
    (backing / "vol").mkdir(parents=True)
    (backing / "vol" / "attributes.json").write_text(json.dumps(N5_ATTRS))
    mp = mounter.foreground(str(backing))
    os.makedirs(mp / "vol" / "0")
    os.makedirs(mp / "vol" / "1")

    touched = sh("touch vol/0/0", mp)
    assert touched.returncode != 0
    assert "Invalid argument" in touched.stderr  # touch reports its failed close()
    # the shell ignores the close() of its redirection: `: >` says nothing, stores nothing
    assert sh(": > vol/0/1", mp).returncode == 0
    for name in ("0", "1"):
        never_shown_unopenable(mp / "vol" / "0" / name, 0.5)
        wait_until(lambda n=name: not os.path.lexists(mp / "vol" / "0" / n), "the name goes")
        assert not (backing / "vol" / "0" / name).exists()
    wait_until(
        lambda: {"/vol/0/0", "/vol/0/1"} <= set(rejected_paths(mp)),
        "both refusals are recorded",
    )
    # the retried create with content works at once (the kernel may still hold the entry)
    (mp / "vol" / "0" / "0").write_bytes(n5_block([4, 4]))
    assert (backing / "vol" / "0" / "0").read_bytes() == n5_block([4, 4])

    # `cmd > chunk`: the shell's first close comes before cat writes (and cat fstat-s its
    # output): the chunk is stored and nothing is recorded
    (tmp_path / "block").write_bytes(n5_block([4, 4]))
    assert sh(f"cat {tmp_path / 'block'} > vol/1/1", mp).returncode == 0
    assert (backing / "vol" / "1" / "1").read_bytes() == n5_block([4, 4])
    assert "/vol/1/1" not in rejected_paths(mp)

    # empty files the format takes are stored, as on any filesystem
    assert sh("touch notes.txt && : > vol/README && touch vol/0/notes", mp).returncode == 0
    for name in ("notes.txt", "vol/README", "vol/0/notes"):
        assert (mp / name).stat().st_size == 0
        assert (mp / name).read_bytes() == b""
        wait_until(lambda n=name: (backing / n).exists(), f"{name} is stored")


def test_a_create_that_found_the_disk_full_leaves_no_name_and_a_retry_works_at_once(
    mounter, tmp_path: Path
) -> None:
    backing = tmp_path / "store"
    backing.mkdir()
    mp, _ = mounter.script(SERVE_FULL, str(backing))
    target = mp / "notes.txt"
    (backing / "FULL").touch()
    with pytest.raises(OSError) as failed, open(target, "wb") as f:
        f.write(b"hello")
    assert failed.value.errno == errno.ENOSPC
    assert not os.path.lexists(target)  # at once: the close() took the name away
    assert "notes.txt" not in os.listdir(mp)
    (backing / "FULL").unlink()
    with open(target, "wb") as f:  # the kernel sends it as a plain open: served as a create
        f.write(b"hello")
    assert target.read_bytes() == b"hello"
    assert (backing / "notes.txt").read_bytes() == b"hello"
