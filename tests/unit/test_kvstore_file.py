"""What only the file store must do: stay inside its root, write atomically, hide its temps."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from n5fs.errors import AccessDenied, IsAPrefix, KeyNotFound, NotAPrefix, errno_of
from n5fs.kvstore import open_store
from n5fs.kvstore.base import Listing
from n5fs.kvstore.file import PARTIAL_SUFFIX, FileStore
from n5fs.kvstore.memory import MemoryStore


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "root")


def test_symlink_out_of_root_is_never_followed(store: FileStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    store.set("inside", b"i")
    os.symlink(outside, store.root / "link")
    os.symlink(outside / "secret", store.root / "filelink")
    assert store.get("link/secret") is None
    assert store.get("filelink") is None
    assert store.stat("link/secret") is None
    assert store.list("").names() == ["inside"]
    assert list(store.list("").prefixes) == []
    with pytest.raises(AccessDenied):
        store.set("link/planted", b"x")
    assert not (outside / "planted").exists()


def test_a_symlink_to_a_file_inside_the_root_is_that_file(store: FileStore) -> None:
    store.set("real/a", b"1")
    os.symlink(store.root / "real" / "a", store.root / "same")
    assert store.get("same") == b"1"
    info = store.stat("same")
    assert info is not None
    assert info.size == 1
    assert store.list("").names() == ["same"]
    assert sorted(i.key for i in store.walk("")) == ["real/a", "same"]


def test_a_symlinked_folder_is_no_prefix(store: FileStore) -> None:
    """A symlink to a folder, even inside the root, is never followed: not listed, nothing
    below it reads, writes below it are refused as below a file, deletes find nothing."""
    store.set("real/a", b"1")
    os.symlink(store.root / "real", store.root / "alias")
    assert store.get("alias/a") is None
    assert store.stat("alias/a") is None
    assert store.local_path("alias/a") is None
    assert store.nothing_at("alias/a")
    assert store.list("").prefixes == ("real/",)
    assert store.list("alias/") == store.list("alias/", delimiter=None) == Listing()
    assert [i.key for i in store.walk("")] == ["real/a"]
    for write in (
        lambda: store.set("alias/b", b"2"),
        lambda: store.make_prefix("alias/"),
        lambda: store.make_prefix("alias/sub/"),
        lambda: store.rename("real/a", "alias/c"),
    ):
        with pytest.raises(NotAPrefix):
            write()
    with pytest.raises(KeyNotFound):
        store.rename("alias/a", "moved")
    store.delete("alias/a")
    assert store.delete_prefix("alias/") == 0
    assert store.rename_prefix("alias/", "elsewhere/") == 0
    store.remove_prefix("alias/")
    assert sorted(os.listdir(store.root / "real")) == ["a"]
    assert (store.root / "alias").is_symlink()


def test_a_checked_folder_swapped_for_a_link_out_of_the_root_is_not_followed(
    store: FileStore, tmp_path: Path
) -> None:
    """Lookups remember a folder they checked (no link on its path) by its inode: a folder
    replaced afterwards, by a link out of the root or by another folder, is checked again."""
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "c").write_bytes(b"secret")
    store.set("a/b/c", b"inside")
    assert store.stat("a/b/c") is not None  # "a/b" is now a checked folder
    assert store.local_path("a/b/c") == str(store.root / "a" / "b" / "c")
    os.rename(store.root / "a", tmp_path / "moved")
    os.symlink(outside, store.root / "a")  # a/b now resolves to outside/b
    assert store.stat("a/b/c") is None
    assert store.local_path("a/b/c") is None
    assert store.get("a/b/c") is None
    os.unlink(store.root / "a")
    store.set("a/b/c", b"new folder")  # a new directory at the checked path
    assert store.local_path("a/b/c") == str(store.root / "a" / "b" / "c")
    assert store.get("a/b/c") == b"new folder"
    info = store.stat("a/b/c")
    assert info is not None
    assert info.size == len(b"new folder")


def test_writes_below_a_checked_folder_skip_the_full_check_but_never_leave_the_root(
    store: FileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set below a checked folder costs two ``lstat`` calls, no ``realpath``; a folder
    swapped for a link out of the root, or a link at the key, still meets the full check."""
    store.set("a/b/c", b"1")
    assert store.stat("a/b/c") is not None  # "a/b" is now a checked folder
    real_realpath = os.path.realpath
    resolved: list[str] = []

    def counting(path: str, *args: object, **kwargs: object) -> str:
        resolved.append(path)
        return real_realpath(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os.path, "realpath", counting)
    store.set("a/b/d", b"2")
    store.set("a/b/c", b"3")
    assert resolved == []
    assert store.get("a/b/d") == b"2"
    assert store.get("a/b/c") == b"3"

    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    os.symlink(outside / "b" / "e", store.root / "a" / "b" / "link")
    with pytest.raises(AccessDenied):
        store.set("a/b/link", b"through a link at the key")
    assert not (outside / "b" / "e").exists()
    os.rename(store.root / "a", tmp_path / "moved")
    os.symlink(outside, store.root / "a")  # the checked a/b now leads out of the root
    with pytest.raises(AccessDenied):
        store.set("a/b/c", b"through a swapped folder")
    assert list((outside / "b").iterdir()) == []
    assert resolved  # both refusals took the full check


def test_listings_of_checked_folders_never_leave_the_root(
    store: FileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder listed before is recognised by its inode (no ``realpath`` per listing); a
    link inside it is listed as what it leads to inside the root, one leading out is not
    listed, and the folder swapped for a link out of the root lists nothing."""
    store.set("a/b/c", b"123")
    store.set("t/target", b"12345")
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "secret").write_bytes(b"secret")
    os.symlink(store.root / "t" / "target", store.root / "a" / "b" / "inside")
    os.symlink(outside / "b" / "secret", store.root / "a" / "b" / "out")
    assert store.stat("a/b/c") is not None  # "a/b" is now a checked folder
    real_realpath = os.path.realpath
    resolved: list[str] = []

    def counting(path: str, *args: object, **kwargs: object) -> str:
        resolved.append(path)
        return real_realpath(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os.path, "realpath", counting)
    listing = store.list("a/b/")
    assert [(k.key, k.size) for k in listing.keys] == [("a/b/c", 3), ("a/b/inside", 5)]
    assert [p for p in resolved if not p.endswith(("inside", "out"))] == []  # links only
    os.rename(store.root / "a", tmp_path / "moved")
    os.symlink(outside, store.root / "a")  # the checked a/b now leads out of the root
    assert store.list("a/b/").keys == ()
    assert store.list("a/").prefixes == ()


def test_local_folder_only_without_a_link_on_the_way(store: FileStore, tmp_path: Path) -> None:
    """Readers of many keys of a folder open it once (validate): only a folder inside the
    root with no link on its path is given, the root for the top, None for a missing one."""
    store.set("a/b/c", b"1")
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", store.root / "out")
    os.symlink(store.root / "a", store.root / "alias")
    real_root = os.path.realpath(store.root)
    assert store.local_folder("") == real_root
    assert store.local_folder("a/b/") == os.path.join(real_root, "a", "b")
    assert store.local_folder("a/b") == os.path.join(real_root, "a", "b")
    for prefix in ("out/", "alias/b/", "nowhere/", "a/b/c/"):
        assert store.local_folder(prefix) is None, prefix
    (tmp_path / "outside" / "b").mkdir()
    os.rename(store.root / "a", tmp_path / "moved")
    os.symlink(tmp_path / "outside", store.root / "a")  # a/b, checked, now leads out
    assert store.local_folder("a/b/") is None


def test_nothing_at_is_sure_only_when_nothing_is_on_disk(store: FileStore, tmp_path: Path) -> None:
    store.set("a/b/c", b"1")
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", store.root / "link")
    (store.root / "a" / f".c.1{PARTIAL_SUFFIX}").write_bytes(b"half")
    for key in ("a/b/missing", "a/nowhere/c", "nowhere", "a/b/c/below", "link/x"):
        assert store.nothing_at(key), key  # (nothing below a symlinked folder is a key)
    for key in ("a/b/c", "a/b", "a", "link", f"a/.c.1{PARTIAL_SUFFIX}"):
        assert not store.nothing_at(key), key  # something there: the listing decides


def test_temp_files_are_hidden(store: FileStore) -> None:
    store.set("k", b"1")
    (store.root / f".k.123{PARTIAL_SUFFIX}").write_bytes(b"half")
    (store.root / ".rsync.tmp").write_bytes(b"user temp files are keys")
    assert store.list("").names() == [".rsync.tmp", "k"]


def test_failed_write_keeps_old_value_and_leaves_no_temp(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.set("k", b"old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        store.set("k", b"new")
    monkeypatch.undo()
    assert store.get("k") == b"old"
    assert sorted(os.listdir(store.root)) == ["k"]


def test_write_is_durable(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    store.set("a/b", b"x")
    assert len(synced) >= 2  # the file, then its directory


def test_put_file_keeps_holes(store: FileStore, tmp_path: Path) -> None:
    size = 8 << 30
    source = tmp_path / "sparse"
    writes = {0: b"head", 3 << 30: b"middle" * 1000, size - 4: b"tail"}
    with open(source, "wb") as f:
        os.ftruncate(f.fileno(), size)
        for offset, data in writes.items():
            os.pwrite(f.fileno(), data, offset)
    store.put_file("a/big", source)
    st = os.stat(store.root / "a" / "big")
    assert st.st_size == size
    assert st.st_blocks * 512 < 1 << 20
    with open(store.root / "a" / "big", "rb") as f:
        for offset, data in writes.items():
            assert os.pread(f.fileno(), len(data), offset) == data
        assert os.pread(f.fileno(), 8, 1 << 30) == bytes(8)
    assert sorted(os.listdir(store.root / "a")) == ["big"]  # no temp left beside it


def test_put_file_without_seek_data_copies_plainly(
    store: FileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "plain"
    source.write_bytes(b"x" * 3_000_000 + bytes(10))
    real_lseek = os.lseek

    def no_holes(fd: int, pos: int, how: int) -> int:
        if how in (os.SEEK_DATA, os.SEEK_HOLE):
            raise OSError(errno.EINVAL, "not here")
        return real_lseek(fd, pos, how)

    monkeypatch.setattr(os, "lseek", no_holes)
    store.put_file("p", source)
    assert store.get("p") == source.read_bytes()


def test_key_conflicts_have_errnos(store: FileStore) -> None:
    store.set("a", b"file")
    with pytest.raises(NotAPrefix) as info:
        store.set("a/b", b"x")
    assert errno_of(info.value) == errno.ENOTDIR
    store.set("d/x", b"1")
    with pytest.raises(IsAPrefix) as info2:
        store.set("d", b"x")
    assert errno_of(info2.value) == errno.EISDIR
    store.delete("d")  # a folder is not a key
    assert store.get("d/x") == b"1"


def test_empty_prefix_survives_and_lists(store: FileStore) -> None:
    store.make_prefix("empty/dir")
    assert list(store.list("").prefixes) == ["empty/"]
    assert list(store.list("empty/").prefixes) == ["empty/dir/"]


def test_delete_prefix_of_root(store: FileStore) -> None:
    for key in ("a", "b/c", "b/d/e"):
        store.set(key, b"1")
    assert store.delete_prefix("") == 3
    assert store.list("", delimiter=None).names() == []
    assert store.root.is_dir()


def test_bare_path_and_file_url_open_the_same_store(tmp_path: Path) -> None:
    (tmp_path / "k").write_bytes(b"v")
    assert open_store(str(tmp_path)).get("k") == b"v"
    assert open_store(f"file://{tmp_path}/").get("k") == b"v"
    assert open_store({"driver": "file", "path": str(tmp_path)}).get("k") == b"v"


keys = st.lists(st.sampled_from(["a", "b", "c d", "ü"]), min_size=1, max_size=3).map("/".join)


class FileVsMemory(RuleBasedStateMachine):
    """The file store and the dict store agree on every sequence of operations."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.file = FileStore(self._dir.name)
        self.memory = MemoryStore()

    @rule(key=keys, data=st.binary(max_size=32))
    def set(self, key: str, data: bytes) -> None:
        # The file store cannot hold "a" and "a/b" at once; the dict store could: keep to
        # what both can represent.
        try:
            self.file.set(key, data)
        except (NotAPrefix, IsAPrefix):
            return
        self.memory.set(key, data)

    @rule(key=keys)
    def delete(self, key: str) -> None:
        self.file.delete(key)
        self.memory.delete(key)

    @rule(key=keys)
    def delete_prefix(self, key: str) -> None:
        assert self.file.delete_prefix(key + "/") == self.memory.delete_prefix(key + "/")

    @invariant()
    def same_keys_and_values(self) -> None:
        names = self.memory.list("", delimiter=None).names()
        assert self.file.list("", delimiter=None).names() == names
        for name in names:
            assert self.file.get(name) == self.memory.get(name)

    def teardown(self) -> None:
        self._dir.cleanup()


TestFileVsMemory = FileVsMemory.TestCase
TestFileVsMemory.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
