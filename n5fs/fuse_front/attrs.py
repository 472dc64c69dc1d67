"""Gateway :class:`Attr` -> the ``st_*`` dict mfusepy copies into ``struct stat``.

The store keeps no modes, owners or inode numbers: every file belongs to the mounting user,
files are 0644 and folders 0755, minus the write bits where nothing can be written (a
read-only mount, a control entry), so ``ls -l`` and ``test -w`` tell the truth before a write
fails with EROFS. Times are integer nanoseconds (mfusepy's ``use_ns``).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field

from n5fs.gateway import Attr, EntryKind

#: ``st_blocks`` counts 512-byte units, whatever the block size
BLOCK_UNIT = 512
#: what ``st_blksize`` advertises: tools size their reads and writes by it (cp uses 128 KiB+)
BLKSIZE = 1 << 20

_DIR = EntryKind.DIR
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
_TYPE_BITS = {
    EntryKind.FILE: stat.S_IFREG | 0o644,
    EntryKind.DIR: stat.S_IFDIR | 0o755,
    EntryKind.SYMLINK: stat.S_IFLNK | 0o777,
}


def mode_of(attr: Attr, *, read_only: bool) -> int:
    """Type and permission bits; symlinks keep 0777 (Linux ignores a link's own mode)."""
    mode = _TYPE_BITS[attr.kind]
    if attr.kind is not EntryKind.SYMLINK and (read_only or not attr.writable):
        mode &= ~_WRITE_BITS
    return mode


@dataclass(frozen=True)
class StatMaker:
    """Makes ``st_*`` dicts for one mount: who owns everything, whether it is read-only, and
    the time shown for folders (they have no mtime in a key-value store)."""

    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    read_only: bool = False
    mounted_ns: int = field(default_factory=time.time_ns)
    _modes: dict[tuple[int, bool], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # modes by kind and writability, looked up per entry without hashing the enum (its
        # __hash__ is Python code: readdir-plus makes one of these dicts per file)
        modes = {
            (id(kind), writable): mode_of(Attr(kind, 0, 0.0, writable), read_only=self.read_only)
            for kind in EntryKind
            for writable in (False, True)
        }
        object.__setattr__(self, "_modes", modes)

    def mode(self, attr: Attr) -> int:
        """``st_mode``: all readdir tells the kernel of an entry it asked no attributes for."""
        return self._modes[id(attr.kind), bool(attr.writable)]

    def fields(self, attr: Attr) -> tuple[int, int, int, int, int]:
        """``(st_mode, st_nlink, st_size, st_blocks, mtime_ns)``: what differs between the
        entries of a mount (the rest is :attr:`uid`, :attr:`gid` and :data:`BLKSIZE`; every
        time is the mtime). Readdir-plus fills a ``struct stat`` from these without a dict."""
        kind, size = attr.kind, attr.size
        return (
            self._modes[id(kind), bool(attr.writable)],
            2 if kind is _DIR else 1,
            size,
            -(-size // BLOCK_UNIT),
            int(attr.mtime * 1e9) if attr.mtime > 0 else self.mounted_ns,
        )

    def __call__(self, attr: Attr) -> dict[str, int]:
        mode, nlink, size, blocks, mtime = self.fields(attr)
        return {
            "st_mode": mode,
            "st_nlink": nlink,
            "st_size": size,
            "st_blocks": blocks,
            "st_blksize": BLKSIZE,
            "st_uid": self.uid,
            "st_gid": self.gid,
            "st_mtime": mtime,
            "st_ctime": mtime,
            "st_atime": mtime,
        }
