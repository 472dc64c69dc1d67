"""Paths and keys, and the entries that live only in the gateway.

Key ``a/b/c`` is file ``/a/b/c``; a prefix with keys under it is a directory, and where a key
and a prefix share a name (``a`` and ``a/x``) the directory wins. The control folder
``/.n5fs/`` is never stored; a store key under that name is hidden.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.kvstore.keys import check_key

if TYPE_CHECKING:
    from collections.abc import Mapping

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


@dataclass(frozen=True)
class DirEntries:
    """One folder's direct children, as one LIST showed them (then changed by our commits).

    Immutable: a change makes a new value (``with_file`` and friends), so a thread iterating
    a listing never sees it change. Copying a folder of 10,000 names costs ~0.1 ms, far less
    than the LIST it saves.
    """

    files: Mapping[str, KeyInfo] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()

    def with_file(self, name: str, info: KeyInfo) -> DirEntries:
        return DirEntries({**self.files, name: info}, self.dirs)

    def without_file(self, name: str) -> DirEntries:
        if name not in self.files:
            return self
        files = dict(self.files)
        del files[name]
        return DirEntries(files, self.dirs)

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
        return cls(files, frozenset(dirs))


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
