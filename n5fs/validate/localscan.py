"""The keys of an array folder on a local disk, as ``n5fs validate`` needs them: names only,
streamed, in no order.

Why not the store's ``walk``: it gives each key with its size and time (an ``fstatat`` and a
:class:`~n5fs.kvstore.base.KeyInfo` per key), sorted, so it holds the whole listing before
the first key: for a million small chunks that was half the listing's time and most of the
run's memory. Validate needs names only (a worker reads each file anyway and learns its size
then; the report is sorted when the run ends), and can check chunks while the scan goes on.

The keys are those of ``FileStore.list(prefix, delimiter=None)`` (a test compares them): a
regular file is a key; a writer's temp file (:func:`~n5fs.kvstore.tempnames.is_partial`), at
any depth, is none; a folder is walked only when it is a real directory, opened relative to
its parent with ``O_NOFOLLOW`` (no symlink is walked into, so the scan ends on any tree); a
symlink, or an entry whose kind changed since the scan, is asked of the store (``stat``),
which decides what it reads as. The kind of an entry comes from its directory entry
(``d_type``); where the filesystem gives none, ``DirEntry`` asks ``lstat``. A file removed
between the scan and its read is found by the read (``vanished``), as with any listing.

Stateless: no shared state, no locks (each scan holds the descriptors of the folders it is
in, closed when it ends or is abandoned).
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from n5fs.kvstore.tempnames import is_partial

if TYPE_CHECKING:
    from collections.abc import Iterator

    from n5fs.kvstore.base import KvStore

__all__ = ["scan_keys"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: what opening a folder that is no longer one (or is a link now) raises
_NOT_A_FOLDER = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def scan_keys(store: KvStore, directory: str, prefix: str) -> Iterator[str]:
    """Every key below ``prefix`` (``""`` or ``"a/b/"``), whose local folder is ``directory``
    (``local_folder(prefix)``: no link on its path; a folder below the root is opened with
    ``O_NOFOLLOW``); nothing when that is no folder by now."""
    try:
        fd = os.open(directory, _DIR_FLAGS | (os.O_NOFOLLOW if prefix else 0))
    except OSError as exc:
        if exc.errno in _NOT_A_FOLDER:
            return
        raise
    yield from _scan(store, fd, prefix)


_FILE, _FOLDER, _LINK, _OTHER = "file", "folder", "link", "other"


def _kind(entry: os.DirEntry[str]) -> str:
    """What a scanned entry is, from its ``d_type`` (an ``lstat`` where the filesystem gives
    none: then an entry removed since the scan is :data:`_OTHER`, no key)."""
    try:
        if entry.is_file(follow_symlinks=False):
            return _FILE
        if entry.is_dir(follow_symlinks=False):
            return _FOLDER
        return _LINK if entry.is_symlink() else _OTHER
    except FileNotFoundError:
        return _OTHER


def _scan(store: KvStore, fd: int, base: str) -> Iterator[str]:
    """The keys below folder ``base``, open as ``fd`` (closed here): its files as they are
    scanned, then its sub-folders' keys."""
    folders: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                name = entry.name
                if is_partial(name):
                    continue
                kind = _kind(entry)
                if kind is _FILE:
                    yield base + name
                elif kind is _FOLDER:
                    folders.append(name)
                elif kind is _LINK and store.stat(base + name) is not None:
                    yield base + name  # a link the store reads as a file
                # else a FIFO, socket or device, or gone since the scan: no key
        for name in folders:
            try:
                sub = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:  # removed, or replaced by a file or a link, since the scan
                if exc.errno not in _NOT_A_FOLDER:
                    raise
                if exc.errno != errno.ENOENT and store.stat(base + name) is not None:
                    yield base + name
                continue
            yield from _scan(store, sub, f"{base}{name}/")
    finally:
        os.close(fd)
