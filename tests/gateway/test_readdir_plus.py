"""Readdir answers: attributes only for a READDIRPLUS request, and the same ones getattr gives.

The glue (:class:`n5fs.fuse_front._lib.N5fsFUSE`) is driven here without a mount: its
``_fill`` gets libfuse's arguments (a filler callback, the request's offset, a file info
holding the opendir handle), so what it hands the kernel per entry is read back as libfuse
would read it. Real mounts exercise the same path in tests/mount/test_mount*.py (``ls -l``, ``find``).
"""

from __future__ import annotations

import stat
from types import SimpleNamespace

import pytest

from n5fs.fuse_front import _lib
from n5fs.fuse_front.operations import N5fsOperations
from n5fs.gateway import Gateway
from n5fs.gateway.config import GatewayConfig
from n5fs.gateway.namespace.paths import FileMap
from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.memory import MemoryStore

pytestmark = pytest.mark.skipif(not _lib.IS_MFUSEPY, reason="the glue is mfusepy's")


class Filler:
    """libfuse's filler as the glue calls it: records what each entry carried; answers
    "buffer full" after ``room`` entries."""

    def __init__(self, room: int = 1 << 30) -> None:
        self.room = room
        self.entries: list[tuple[str, int, int, int, int, int]] = []

    def __call__(self, buf: object, raw: bytes, st: object, off: int, flags: int = 0) -> int:
        if len(self.entries) == self.room:
            return 1
        self.entries.append((raw.decode(), off, flags, st.st_mode, st.st_size, st.st_nlink))  # type: ignore[attr-defined]
        return 0


@pytest.fixture
def ops() -> N5fsOperations:
    store = MemoryStore()
    store.set("d/a.bin", b"12345")
    store.set("d/b.txt", b"")
    store.set("d/sub/x", b"x")
    return N5fsOperations(Gateway(store, GatewayConfig(read_only=True)))


def fill(ops: N5fsOperations, fh: int, offset: int, *, plus: bool, room: int = 1 << 30) -> Filler:
    glue = object.__new__(_lib.N5fsFUSE)  # the glue's methods, without mounting
    glue.operations, glue.encoding, glue.errors = ops, "utf-8", "surrogateescape"
    fip = SimpleNamespace(contents=SimpleNamespace(fh=fh))  # a fuse_file_info pointer
    filler = Filler(room)
    assert glue._fill(b"/d", None, filler, offset, fip, plus) == 0
    return filler


def test_plain_readdir_carries_the_type_only(ops: N5fsOperations) -> None:
    fh = ops.opendir("/d")
    entries = fill(ops, fh, 0, plus=False).entries
    assert [(name, off, flags) for name, off, flags, *_ in entries] == [
        (".", 1, 0), ("..", 2, 0), ("a.bin", 3, 0), ("b.txt", 4, 0), ("sub", 5, 0),
    ]  # fmt: skip
    modes = {name: mode for name, _, _, mode, _, _ in entries}
    assert {name: size for name, *_, size, _ in entries}["a.bin"] == 0  # no attributes made
    assert stat.S_ISREG(modes["a.bin"])
    assert [stat.S_ISDIR(modes[name]) for name in (".", "..", "sub")] == [True] * 3


def test_plus_readdir_carries_what_getattr_answers(ops: N5fsOperations) -> None:
    fh = ops.opendir("/d")
    entries = fill(ops, fh, 0, plus=True).entries
    flags = {name: flag for name, _, flag, *_ in entries}
    assert flags == {".": 0, "..": 0, "a.bin": 2, "b.txt": 2, "sub": 2}  # FUSE_FILL_DIR_PLUS
    for name, _, _, mode, size, nlink in entries[2:]:
        st = ops.getattr(f"/d/{name}")
        assert (mode, size, nlink) == (st["st_mode"], st["st_size"], st["st_nlink"])


def test_a_full_buffer_resumes_at_the_kernel_s_offset(ops: N5fsOperations) -> None:
    fh = ops.opendir("/d")
    first = fill(ops, fh, 0, plus=True, room=3).entries
    assert [name for name, *_ in first] == [".", "..", "a.bin"]
    rest = fill(ops, fh, first[-1][1], plus=False).entries
    assert [(name, off) for name, off, *_ in rest] == [("b.txt", 4), ("sub", 5)]


@pytest.mark.parametrize(
    "changes",
    [
        [],
        [("add", "n")],
        [("del", "k1")],
        [("add", "k1"), ("del", "k2"), ("add", "z")],
        [("del", "absent")],
        [("add", f"m{i}") for i in range(40)],  # past the overlay limit: folded into the base
    ],
)
def test_file_map_iterates_like_a_dict(changes: list[tuple[str, str]]) -> None:
    base = {f"k{i}": KeyInfo(f"k{i}", i) for i in range(5)}
    files, model = FileMap(base), dict(base)
    for op, name in changes:
        if op == "add":
            files = files.with_item(name, KeyInfo(name, 99))
            model[name] = KeyInfo(name, 99)
        else:
            files = files.without(name)
            model.pop(name, None)
    assert sorted(files.items()) == sorted(model.items())
    assert sorted(files) == sorted(model)
    assert len(files) == len(model)
    assert base == {f"k{i}": KeyInfo(f"k{i}", i) for i in range(5)}  # the shared base is intact
