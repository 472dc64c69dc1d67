"""A create whose commit failed leaves no name, and a retry works at once, whatever failed:
the store (ENOSPC, EIO), a conflict with another mount (EAGAIN) or the commit rules (EINVAL).

Through the Gateway API, as the FUSE front calls it: ``close()`` is ``flush`` then
``release``; after a failed ``close()`` the kernel still holds the entry the ``create`` made,
so the caller's retried ``open(O_CREAT|O_TRUNC)`` reaches the gateway as a plain ``open``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from n5fs.errors import N5fsError, NoSpace, StaleVersion, StoreUnavailable, errno_of
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import Clock, FaultyStore
from tests.gateway.test_gateway_many_mounts import doc, zarray


@pytest.fixture(params=["memory", "file"])
def faulty(request: pytest.FixtureRequest, tmp_path: Path) -> FaultyStore:
    inner = MemoryStore() if request.param == "memory" else FileStore(tmp_path / "store")
    return FaultyStore(inner)


def announced(gw: Gateway) -> list[str]:
    """The paths the gateway tells the kernel to forget, in order."""
    told: list[str] = []

    def hear(paths: Sequence[str]) -> None:
        told.extend(paths)

    gw.subscribe(hear)
    return told


def retry_as_the_kernel_sends_it(gw: Gateway, path: str, data: bytes) -> None:
    """``open(O_CREAT|O_TRUNC)`` + write + close of a name whose entry the kernel kept."""
    fh = gw.open(path, os.O_WRONLY | os.O_TRUNC)
    gw.write(fh, data, 0)
    gw.flush(fh)
    gw.release(fh)


def absent(gw: Gateway, path: str) -> bool:
    """Neither ``stat`` nor the folder's listing (if the folder shows at all) has the name."""
    folder, _, name = path.rpartition("/")
    folder = folder or "/"
    listed = gw.lookup(folder) is not None and name in dict(gw.readdir(folder))
    return gw.lookup(path) is None and not listed


@pytest.mark.parametrize(
    ("error", "code"), [(NoSpace, errno.ENOSPC), (StoreUnavailable, errno.EIO)]
)
def test_a_create_the_store_failed_leaves_no_name_and_a_retry_works_at_once(
    faulty: FaultyStore, error: Callable[[str], N5fsError], code: int
) -> None:
    gw = Gateway(faulty)
    told = announced(gw)
    assert gw.readdir("/") == []  # the root's listing is cached: no name of a later LIST
    fh = gw.create("/plain/notes.txt")
    gw.write(fh, b"hello", 0)
    faulty.fail("set", error)  # once: the cause is gone before the retry
    with pytest.raises(N5fsError) as failed:
        gw.flush(fh)
    assert errno_of(failed.value) == code
    # gone at close(), not at the release that follows it, and the kernel was told
    assert absent(gw, "/plain/notes.txt")
    assert "/plain/notes.txt" in told
    gw.release(fh)  # does not commit again: the close() said it failed
    assert faulty.calls["set"] == 1
    assert absent(gw, "/plain/notes.txt")
    assert faulty.get("plain/notes.txt") is None
    retry_as_the_kernel_sends_it(gw, "/plain/notes.txt", b"hello")
    assert gw.read_file("/plain/notes.txt") == b"hello"
    assert faulty.get("plain/notes.txt") == b"hello"
    assert gw.rejections == []  # the store failed; nothing was refused


def test_a_retry_through_create_works_at_once_too(faulty: FaultyStore) -> None:
    """The kernel dropped its entry (or another process retries): a real create."""
    gw = Gateway(faulty)
    faulty.fail("set", NoSpace)
    with pytest.raises(NoSpace):
        gw.write_file("/a.bin", b"abc")
    assert absent(gw, "/a.bin")
    gw.write_file("/a.bin", b"abc")
    assert gw.read_file("/a.bin") == b"abc"


def test_a_descriptor_still_open_keeps_what_was_written_and_commits_it(
    faulty: FaultyStore,
) -> None:
    """Two descriptors of one file (a fork, a dup): one close fails, the name is gone; the
    other descriptor writes on and its close commits everything both wrote."""
    gw = Gateway(faulty)
    fh = gw.create("/log.txt")
    gw.write(fh, b"first ", 0)
    other = gw.open("/log.txt", os.O_WRONLY)
    faulty.fail("set", NoSpace)
    with pytest.raises(NoSpace):
        gw.flush(fh)
    gw.release(fh)
    assert absent(gw, "/log.txt")
    gw.write(other, b"second", 6)
    assert gw.stat("/log.txt").size == 12  # written again: shown again
    gw.flush(other)
    gw.release(other)
    assert gw.read_file("/log.txt") == b"first second"


def test_a_create_that_lost_a_conflict_reads_the_winner_at_once_and_a_retry_works() -> None:
    """Two mounts of one store create one array; B cached the root's listing before A made
    the array's folder. B's close answers EAGAIN; B then reads A's document at once (not
    ENOENT until its cached root listing expires), and B's retry that builds on it works."""
    store = MemoryStore()
    a = Gateway(store, GatewayConfig(), clock=Clock())
    b = Gateway(store, GatewayConfig(), clock=Clock())  # caches never expire in this test
    assert b.readdir("/") == []
    a.write_file("/arr/.zarray", zarray())
    fh = b.create("/arr/.zarray")
    b.write(fh, zarray(dtype="<u2"), 0)
    with pytest.raises(StaleVersion) as conflict:
        b.flush(fh)
    assert errno_of(conflict.value) == errno.EAGAIN
    assert json.loads(b.read_file("/arr/.zarray"))["dtype"] == "|u1"  # before the release
    assert "arr" in dict(b.readdir("/"))
    b.release(fh)
    assert json.loads(b.read_file("/arr/.zarray"))["dtype"] == "|u1"
    retry_as_the_kernel_sends_it(b, "/arr/.zarray", zarray(shape=[32]))
    assert doc(store, "arr/.zarray")["shape"] == [32]


def test_an_open_while_the_lost_create_is_still_held_opens_the_winners_file() -> None:
    """B's failed create is not released yet when B opens the name again (no O_TRUNC):
    the handle writes over A's stored file, not over what B's failed create staged."""
    store = MemoryStore()
    a = Gateway(store, GatewayConfig(), clock=Clock())
    b = Gateway(store, GatewayConfig(), clock=Clock())
    assert b.lookup("/grp/.zattrs") is None
    a.write_file("/grp/.zattrs", b'{"a": 1, "b": 2}')
    fh = b.create("/grp/.zattrs")
    b.write(fh, b'{"mine": 1}', 0)
    with pytest.raises(StaleVersion):
        b.flush(fh)
    again = b.open("/grp/.zattrs", os.O_RDWR)
    b.write(again, b"3", 14)  # {"a": 1, "b": 3}
    b.flush(again)
    b.release(again)
    b.release(fh)
    assert doc(store, "grp/.zattrs") == {"a": 1, "b": 3}
