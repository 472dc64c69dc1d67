"""Zero-message opens through a real read-only mount of a local directory: the kernel opens
files by itself (no OPEN, FLUSH or RELEASE reaches n5fs) and reads them by path, while the
bytes, the control entries and the user's choice of cache mode stay as they were.

Every mount runs in its own process and is always unmounted (tests/mounting.py).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tests.mounting import real_mount, wait_until

pytestmark = real_mount(120)

BIG = bytes(range(256)) * 12_000  # ~3 MB: many kernel reads, spread over its threads


@pytest.fixture
def backing(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    (store / "d").mkdir(parents=True)
    (store / "d" / "big").write_bytes(BIG)
    (store / "d" / "other").write_bytes(BIG[::-1])
    for i in range(20):
        (store / "d" / f"s{i}").write_bytes(f"small {i}".encode())
    return store


def stats(mp: Path) -> dict[str, int]:
    loaded: dict[str, int] = json.loads((mp / ".n5fs" / "stats.json").read_bytes())
    return loaded


def test_files_are_read_without_opens(mounter, backing):
    mp = mounter.daemon(str(backing), "-o", "ro,cache_ttl=60")
    with open(mp / "d" / "big", "rb") as held:
        assert held.read() == BIG
        assert stats(mp)["open_handles"] == 0  # the kernel holds it open, n5fs has no handle
        os.fsync(held.fileno())  # no handle to sync: nothing staged on a read-only mount
    assert [(mp / "d" / f"s{i}").read_bytes() for i in range(20)] == [
        f"small {i}".encode() for i in range(20)
    ]
    with pytest.raises(OSError, match="Read-only file system"):
        (mp / "d" / "new").write_bytes(b"x")


def test_interleaved_readers_of_two_files_get_their_own_bytes(mounter, backing):
    mp = mounter.daemon(str(backing), "-o", "ro,cache_ttl=60")
    got: dict[str, bytes] = {}

    def read(name: str) -> None:
        with open(mp / "d" / name, "rb", buffering=0) as f:
            got[name] = b"".join(iter(lambda: f.read(65536), b""))

    threads = [threading.Thread(target=read, args=(n,)) for n in ("big", "other") * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == {"big": BIG, "other": BIG[::-1]}


def test_control_entries_are_fresh_at_every_read(mounter, backing):
    """The kernel keeps the pages of files it opened by itself; a control entry is announced
    stale once read, so the next read renders it again (without that, its first bytes would
    stand until the 60 s attribute timeout)."""
    mp = mounter.daemon(str(backing), "-o", "ro,cache_ttl=60")
    assert (mp / ".n5fs" / "stats.json").stat().st_size % 4096 == 0  # a fixed size
    before = stats(mp)["bytes_out"]  # (every read below parses: none may come out cut)
    (mp / "d" / "big").read_bytes()
    wait_until(
        lambda: stats(mp)["bytes_out"] >= before + len(BIG), "a fresh stats.json", timeout=10
    )


def test_a_chosen_cache_mode_keeps_the_opens(mounter, backing):
    mp = mounter.daemon(str(backing), "-o", "ro,auto_cache")
    with open(mp / "d" / "big", "rb") as held:
        assert held.read(10) == BIG[:10]
        assert stats(mp)["open_handles"] == 1
