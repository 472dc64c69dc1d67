"""When a commit to the file store is on disk (``-o durable=``), and that atomicity does not
depend on it. fsync calls are counted by wrapping ``os.fsync`` (a file descriptor of the
store's root tree each), so the tests say which calls make what durable, not how long."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from n5fs.errors import InvalidSource
from n5fs.fuse_front.options import parse_options
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore.file import Durability, FileStore
from n5fs.kvstore.file import store as file_store


class Fsyncs:
    """Which paths were fsynced (through /proc/self/fd), in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = os.fsync

        def counting(fd: int) -> None:
            self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, "fsync", counting)

    def take(self) -> list[str]:
        taken, self.paths = self.paths, []
        return taken


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Fsyncs:
    if not os.path.isdir("/proc/self/fd"):
        pytest.fail("these tests read /proc/self/fd (Linux)")
    return Fsyncs(monkeypatch)


def test_commit_durability_syncs_every_set(tmp_path: Path, fsyncs: Fsyncs) -> None:
    store = FileStore(tmp_path)
    assert store.durability is Durability.COMMIT  # a store on its own: as before
    store.set("a/b", b"1")
    synced = fsyncs.take()
    assert len(synced) == 2  # the temp file (renamed since), then its folder
    assert synced[1] == str(tmp_path / "a")
    assert store.unsynced == 0
    store.flush()
    assert fsyncs.take() == []


def test_fsync_durability_defers_to_flush(tmp_path: Path, fsyncs: Fsyncs) -> None:
    store = FileStore(tmp_path, durability=Durability.FSYNC)
    store.set("a/b", b"1")
    store.set("a/c", b"2")
    store.set("a/b", b"3")  # written twice, synced once
    src = tmp_path.parent / f"{tmp_path.name}-src"
    src.write_bytes(b"4" * 100)
    store.put_file("d/e", src)
    assert fsyncs.take() == []
    assert store.unsynced == 3
    assert store.get("a/b") == b"3"  # atomic all the same: the renamed file, whole
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temp left
    store.flush()
    synced = fsyncs.take()
    files = {str(tmp_path / k) for k in ("a/b", "a/c", "d/e")}
    assert set(synced[:3]) == files
    assert set(synced[3:]) == {str(tmp_path / "a"), str(tmp_path / "d")}
    assert store.unsynced == 0
    store.flush()
    assert fsyncs.take() == []


def test_fsync_durability_skips_what_is_gone(tmp_path: Path, fsyncs: Fsyncs) -> None:
    store = FileStore(tmp_path, durability=Durability.FSYNC)
    store.set("x", b"1")
    store.delete("x")
    store.flush()
    assert fsyncs.take() == [str(tmp_path)]  # the folder (the deletion), no file


def test_too_many_unsynced_sets_are_synced_early_without_syncfs(
    tmp_path: Path, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_store, "MAX_UNSYNCED", 3)
    monkeypatch.setattr(file_store, "can_sync_filesystem", lambda: False)  # macOS
    store = FileStore(tmp_path, durability=Durability.FSYNC)
    store.set("k1", b"1")
    store.set("k2", b"2")
    assert fsyncs.take() == []
    store.set("k3", b"3")  # the bound: everything so far is synced now
    assert len(fsyncs.take()) == 4  # three files and their folder
    assert store.unsynced == 0


def test_past_the_bound_a_flush_syncs_the_filesystem_once(
    tmp_path: Path, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of small chunks: no fsync storm in a commit; the flush is one ``syncfs``."""
    if not file_store.can_sync_filesystem():
        pytest.skip("no syncfs(2) here")
    monkeypatch.setattr(file_store, "MAX_UNSYNCED", 3)
    synced: list[str] = []
    real = file_store.sync_filesystem
    monkeypatch.setattr(file_store, "sync_filesystem", lambda p: synced.append(p) or real(p))
    store = FileStore(tmp_path, durability=Durability.FSYNC)
    for i in range(10):
        store.set(f"a/k{i}", b"x")
    assert fsyncs.take() == []  # the commits never wait for the disk
    assert synced == []
    assert store.unsynced == 10
    store.flush()
    assert synced == [str(tmp_path)]
    assert fsyncs.take() == []  # syncfs covered every file and folder
    assert store.unsynced == 0
    store.set("b", b"y")  # below the bound again: tracked by path
    store.flush()
    assert fsyncs.take() == [str(tmp_path / "b"), str(tmp_path)]
    assert synced == [str(tmp_path)]


def test_a_mount_defaults_to_fsync_and_its_fsync_makes_commits_durable(
    tmp_path: Path, fsyncs: Fsyncs
) -> None:
    store = FileStore(tmp_path)
    gw = Gateway(store)
    assert store.durability is Durability.FSYNC
    gw.write_file("/plain/a.txt", b"first")
    gw.write_file("/plain/b.txt", b"second")
    assert fsyncs.take() == []
    assert store.unsynced == 2
    fh = gw.open("/plain/b.txt", os.O_RDONLY)
    gw.fsync(fh)  # fsync(2) of any file: every commit before it is on disk
    gw.release(fh)
    assert {str(tmp_path / "plain" / n) for n in ("a.txt", "b.txt")} <= set(fsyncs.take())
    assert store.unsynced == 0
    gw.write_file("/plain/c.txt", b"third")
    gw.close()  # unmount: durable too
    assert str(tmp_path / "plain" / "c.txt") in fsyncs.take()


def test_durable_commit_syncs_before_close_returns(tmp_path: Path, fsyncs: Fsyncs) -> None:
    store = FileStore(tmp_path)
    gw = Gateway(store, GatewayConfig(durable="commit"))
    gw.write_file("/plain/a.txt", b"first")
    assert str(tmp_path / "plain") in fsyncs.take()
    assert store.unsynced == 0
    gw.close()


def test_durable_mount_option() -> None:
    assert parse_options([]).durable == "fsync"
    assert parse_options(["rw,durable=commit"]).durable == "commit"
    assert parse_options(["durable=commit", "durable=fsync"]).durable == "fsync"
    assert "durable" not in parse_options(["durable=commit"]).fuse  # n5fs's, not libfuse's
    with pytest.raises(InvalidSource, match="durable must be one of"):
        parse_options(["durable=always"])


def test_many_mounts_options_are_checked() -> None:
    """``-o consistency=``, ``conditional=`` and ``mtime=``: n5fs's own, never libfuse's; a
    bad value names the choices (the mount then exits 2 before anything is mounted)."""
    opts = parse_options(["consistency=strict,conditional=off,mtime=listing"])
    assert (opts.consistency, opts.conditional, opts.mtime) == ("strict", "off", "listing")
    assert opts.fuse == {}
    for bad, name in (
        ("consistency=eventual", "consistency"),
        ("conditional=on", "conditional"),
        ("mtime=ctime", "mtime"),
    ):
        with pytest.raises(InvalidSource, match=f"{name} must be one of"):
            parse_options([bad])


def test_a_failed_sync_leaves_its_sets_for_the_next_flush(
    tmp_path: Path, fsyncs: Fsyncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error in a flush answers the caller's fsync with it, and the sets stay owed:
    the next flush syncs them instead of reporting success for sets it never saw."""
    monkeypatch.setattr(file_store, "MAX_UNSYNCED", 2)
    monkeypatch.setattr(file_store, "can_sync_filesystem", lambda: True)
    failures = [OSError(5, "syncfs: Input/output error")]
    synced: list[str] = []

    def sync(path: str) -> bool:
        if failures:
            raise failures.pop()
        synced.append(path)
        return True

    monkeypatch.setattr(file_store, "sync_filesystem", sync)
    store = FileStore(tmp_path, durability=Durability.FSYNC)
    for i in range(5):
        store.set(f"k{i}", b"x")
    assert store.unsynced == 5
    with pytest.raises(OSError, match="Input/output"):
        store.flush()
    assert store.unsynced == 5
    store.set("k9", b"y")
    assert store.unsynced == 6
    store.flush()
    assert synced == [str(tmp_path)]
    assert store.unsynced == 0
    assert fsyncs.take() == []
