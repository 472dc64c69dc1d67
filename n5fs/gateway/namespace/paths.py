"""Paths and keys, and the entries that live only in the gateway.

Key ``a/b/c`` is file ``/a/b/c``; a prefix with keys under it is a directory, and where a key
and a prefix share a name (``a`` and ``a/x``) the directory wins. The control folder
``/.n5fs/`` is never stored; a store key under that name is hidden.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import ItemsView, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.kvstore.keys import check_key

if TYPE_CHECKING:
    from n5fs.kvstore.base import KeyInfo, Listing

CONTROL = ".n5fs"
CONTROL_FILES = ("rejections", "stats.json")


class EntryKind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class Attr:
    kind: EntryKind
    size: int = 0
    mtime: float = 0.0
    writable: bool = True


def path_to_key(path: str) -> str:
    """``"/a/b"`` -> ``"a/b"``; the root is ``""``. Raises InvalidKey for ``..`` and friends."""
    key = path.strip("/")
    return check_key(key) if key else ""


def is_control(key: str) -> bool:
    return key == CONTROL or key.startswith(CONTROL + "/")


class FileMap(Mapping[str, "KeyInfo"]):
    """An immutable name -> KeyInfo map that changes cheaply: a shared base (one LIST, never
    mutated) plus a small overlay of names added and removed since.

    Why not a plain dict copied on every change: writing 50,000 chunks into one Zarr v2
    folder would copy the folder's map 50,000 times (quadratic). Here a change copies only
    the overlay, and the overlay is folded into a new base once it outgrows the square root
    of the base: O(sqrt n) per change, amortized.
    """

    __slots__ = ("_added", "_base", "_removed")

    def __init__(
        self,
        base: Mapping[str, KeyInfo],
        added: Mapping[str, KeyInfo] | None = None,
        removed: frozenset[str] = frozenset(),
    ) -> None:
        self._base = base
        self._added = added or {}
        self._removed = removed

    def __getitem__(self, name: str) -> KeyInfo:
        info = self._added.get(name)
        if info is not None:
            return info
        if name in self._removed:
            raise KeyError(name)
        return self._base[name]

    def __contains__(self, name: object) -> bool:
        if name in self._added:
            return True
        return name not in self._removed and name in self._base

    def __iter__(self) -> Iterator[str]:
        if not self._added and not self._removed:
            return iter(self._base)
        return self._merged()

    def _merged(self) -> Iterator[str]:
        yield from self._added
        for name in self._base:
            if name not in self._added and name not in self._removed:
                yield name

    def __len__(self) -> int:
        if not self._added and not self._removed:
            return len(self._base)
        return sum(1 for _ in self)

    def items(self) -> ItemsView[str, KeyInfo]:
        """Every name with its info; a folder listed once and not changed since yields its
        listing's own pairs (readdir of 50,000 files asks for all of them: a lookup per name
        through :meth:`__getitem__` cost a quarter of the gateway's part)."""
        return _FileMapItems(self)

    def with_item(self, name: str, info: KeyInfo) -> FileMap:
        return self._compacted({**self._added, name: info}, self._removed - {name})

    def without(self, name: str) -> FileMap:
        if name not in self:
            return self
        added = {k: v for k, v in self._added.items() if k != name}
        removed = self._removed | {name} if name in self._base else self._removed
        return self._compacted(added, removed)

    def _compacted(self, added: dict[str, KeyInfo], removed: frozenset[str]) -> FileMap:
        changed = FileMap(self._base, added, removed)
        if len(added) + len(removed) <= max(32, math.isqrt(len(self._base))):
            return changed
        merged = {k: v for k, v in self._base.items() if k not in removed}
        merged.update(added)
        return FileMap(merged)


class _FileMapItems(ItemsView[str, "KeyInfo"]):
    _mapping: FileMap

    def __iter__(self) -> Iterator[tuple[str, KeyInfo]]:
        files = self._mapping
        if not files._added and not files._removed:
            return iter(files._base.items())
        return ((name, files[name]) for name in files)


@dataclass(frozen=True)
class DirEntries:
    """One folder's direct children, as one LIST showed them (then changed by our commits).

    Immutable: a change makes a new value (``with_file`` and friends), so a thread iterating
    a listing never sees it change.
    """

    files: FileMap = field(default_factory=lambda: FileMap({}))
    dirs: frozenset[str] = frozenset()

    def with_file(self, name: str, info: KeyInfo) -> DirEntries:
        return DirEntries(self.files.with_item(name, info), self.dirs)

    def without_file(self, name: str) -> DirEntries:
        files = self.files.without(name)
        return self if files is self.files else DirEntries(files, self.dirs)

    def with_dir(self, name: str) -> DirEntries:
        return self if name in self.dirs else DirEntries(self.files, self.dirs | {name})

    def without_dir(self, name: str) -> DirEntries:
        return DirEntries(self.files, self.dirs - {name}) if name in self.dirs else self

    @classmethod
    def from_listing(cls, prefix: str, listing: Listing) -> DirEntries:
        files = {info.key[len(prefix) :]: info for info in listing.keys}
        dirs = {p[len(prefix) : -1] for p in listing.prefixes}
        if not prefix:  # the control name shadows any stored key of the same name
            files.pop(CONTROL, None)
            dirs.discard(CONTROL)
        return cls(FileMap(files), frozenset(dirs))


@dataclass
class _OpenFolder:
    """A folder a flat listing is still inside (mutable while it fills)."""

    prefix: str
    born: float  # when the read of its first key began
    files: dict[str, KeyInfo] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    def entries(self) -> tuple[str, DirEntries, float]:
        return self.prefix, DirEntries(FileMap(self.files), frozenset(self.dirs)), self.born


class FolderSplitter:
    """Per-folder entries from a flat (delimiter-less) listing of ``prefix`` that comes in
    key order: a folder's keys are then one run, so a folder is whole as soon as a key
    outside it arrives, and is handed out at once (the listing is never held twice: only the
    folders on the path to the latest key are open).

    ``add`` returns the folders the key closed, ``finish`` the rest (call it only when the
    listing ended; a listing cut short leaves its open folders unanswered). Each comes with
    the time the read of its first key began (``born``), the age a cache must give it.
    """

    def __init__(self, prefix: str, born: float) -> None:
        self._open = [_OpenFolder(prefix, born)]
        self._last = ""

    def add(self, info: KeyInfo, born: float) -> list[tuple[str, DirEntries, float]]:
        key = info.key
        if key <= self._last:
            raise ValueError(f"listing not in key order: {key!r} after {self._last!r}")
        self._last = key
        folder = key[: key.rfind("/") + 1]
        root = self._open[0].prefix
        if not folder.startswith(root) or (not root and is_control(key)):
            return []  # not below (a store answering more than asked); the control name hides
        closed = []
        while not folder.startswith(self._open[-1].prefix):
            closed.append(self._open.pop().entries())
        while (top := self._open[-1]).prefix != folder:
            sub = folder[: folder.index("/", len(top.prefix)) + 1]
            top.dirs.add(sub[len(top.prefix) : -1])
            self._open.append(_OpenFolder(sub, born))
        self._open[-1].files[key[len(folder) :]] = info
        return closed

    def finish(self) -> list[tuple[str, DirEntries, float]]:
        closed = [folder.entries() for folder in reversed(self._open)]
        self._open = self._open[:1]
        return closed


def statfs_of(root: object) -> dict[str, int]:
    """The backing filesystem's numbers for a file store; generous fixed ones otherwise."""
    if isinstance(root, (str, os.PathLike)) and os.path.isdir(root):
        st = os.statvfs(root)
        return {
            "f_bsize": st.f_bsize,
            "f_frsize": st.f_frsize,
            "f_blocks": st.f_blocks,
            "f_bfree": st.f_bfree,
            "f_bavail": st.f_bavail,
            "f_files": st.f_files,
            "f_ffree": st.f_ffree,
            "f_namemax": 255,
        }
    big = 1 << 40
    return {
        "f_bsize": 1 << 20,
        "f_frsize": 1 << 20,
        "f_blocks": big >> 20,
        "f_bfree": big >> 20,
        "f_bavail": big >> 20,
        "f_files": 1 << 32,
        "f_ffree": 1 << 32,
        "f_namemax": 255,
    }
