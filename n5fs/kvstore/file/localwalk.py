"""The file store's flat listing: every key below a folder, with its size and time.

Why it matters: a flat listing is the first step of ``n5fs validate`` (an array is listed once,
its chunks may sit in sub-folders), so its cost is paid once per chunk, and for small chunks
it is not small beside reading them. Why apart from :mod:`~n5fs.kvstore.file.store`: listing
a tree of local folders cheaply and safely is a matter of POSIX calls, not of keys or
durability.

The keys are those ``FileStore.list`` finds folder by folder, at less cost: each folder is
opened once and its entries are stat'ed relative to it (``fstatat``: no walk of the whole path
per key); sub-folders are told by the entry's type (no stat) and opened relative to their
parent with ``O_NOFOLLOW`` (no ``realpath`` per folder).

Invariant: the walk descends only into real directories, never through a symlink, so it ends
on any tree (``ln -s . self`` is no loop to it) and meets each file once. A symlink met on the
way is handed to the caller's ``linked``, which says whether it reads as a file (a key) or is
no key at all; a folder replaced between the scan of its parent and its own opening is judged
as it is then (a symlink by then is handed over like any other).

Stateless: no shared state, no locks.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import TYPE_CHECKING

from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.tempnames import is_partial

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["walk_keys"]

#: a folder opened to list it (``O_NOFOLLOW`` is added for a sub-folder, opened relative to it)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: what opening a folder that is no longer one (or is a link now) raises
_NOT_A_FOLDER = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def walk_keys(
    folder: str | None,
    base: str,
    start: str,
    linked: Callable[[str, str], os.stat_result | None],
) -> list[KeyInfo]:
    """Every key below folder ``base`` (``""`` or ``"a/b/"``) whose name in ``base`` starts
    with ``start``, in no order; temp files left out. ``folder`` is the directory of ``base``,
    which the caller checked has no symlink on its path (None: nothing to walk); for ``base``
    other than the root it is opened with ``O_NOFOLLOW``. ``linked(path, key)`` is what the
    symlink at ``path`` reads as: the ``stat`` of a regular file (then it is a key), or None."""
    found: list[KeyInfo] = []
    if folder is None:
        return found
    try:
        fd = os.open(folder, _DIR_FLAGS | (_NOFOLLOW if base else 0))
    except OSError as exc:
        if exc.errno in _NOT_A_FOLDER:
            return found
        raise
    for path, key in _collect(fd, folder, base, start, found):
        st = linked(path, key)
        if st is not None:
            found.append(KeyInfo(key, st.st_size, st.st_mtime))
    return found


def _collect(
    fd: int, directory: str, base: str, start: str, found: list[KeyInfo]
) -> list[tuple[str, str]]:
    """Add the keys below folder ``base`` (path ``directory``, open as ``fd``, closed here)
    to ``found``; return the (path, key) of each symlink met on the way, for the caller to
    judge. Only real directories are descended into."""
    folders: list[str] = []
    links: list[tuple[str, str]] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                name = entry.name
                if not name.startswith(start) or is_partial(name):
                    continue
                if entry.is_symlink():
                    links.append((f"{directory}{os.sep}{name}", base + name))
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(name)
                else:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # renamed or removed since the scan
                    if stat_mod.S_ISREG(st.st_mode):
                        found.append(KeyInfo(base + name, st.st_size, st.st_mtime))
        for name in folders:
            path = f"{directory}{os.sep}{name}"
            try:
                sub = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:  # removed, or replaced by a file or a link, since the scan
                if exc.errno not in _NOT_A_FOLDER:
                    raise
                if exc.errno != errno.ENOENT and _is_link(name, fd):
                    links.append((path, base + name))
                continue
            links += _collect(sub, path, f"{base}{name}/", "", found)
    finally:
        os.close(fd)
    return links


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat_mod.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
