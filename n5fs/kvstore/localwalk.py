"""The file store's flat listing: every key below a folder, with its size and time.

Why it matters: a flat listing is the first step of ``n5fs validate`` (an array is listed once,
its chunks may sit in sub-folders), so its cost is paid once per chunk: for 16x16 chunks, about
what reading one costs. Why apart from :mod:`~n5fs.kvstore.file`: listing a tree of local
folders cheaply and safely is a matter of POSIX calls, not of keys or durability.

The keys are those ``FileStore._scan`` finds folder by folder, at less cost: each folder is
opened once and its entries are stat'ed relative to it (``fstatat``: no walk of the whole path
per key); sub-folders are told by the entry's type (no stat) and opened relative to their
parent without following a link (no ``realpath`` per folder), so only a symlink, which may lead
out of the root, pays for the full check. A folder replaced between the scan of its parent and
its own opening is judged as it is then.

Stateless: no shared state, no locks.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import TYPE_CHECKING

from n5fs.errors import AccessDenied
from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.tempnames import is_partial

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["walk_keys"]

#: a folder opened to list it (``O_NOFOLLOW`` is added for a sub-folder, opened relative to it)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def walk_keys(
    root: str, base: str, start: str, check_inside: Callable[[str, str], None]
) -> list[KeyInfo]:
    """Every key below folder ``base`` (``""`` or ``"a/b/"``) of the store at ``root`` whose
    name in ``base`` starts with ``start``, in no order; temp files left out. ``check_inside``
    (path, key) raises AccessDenied when a path resolves outside the root."""
    found: list[KeyInfo] = []
    _walk(root, base, start, check_inside, found)
    return found


def _walk(
    root: str, base: str, start: str, check_inside: Callable[[str, str], None], found: list[KeyInfo]
) -> None:
    directory = os.path.join(root, base)
    try:
        if base:
            check_inside(directory, base)
        fd = os.open(directory, _DIR_FLAGS)
    except (FileNotFoundError, NotADirectoryError, AccessDenied):
        return
    links = _collect(fd, base, start, found)
    for key in links:
        _follow(root, key, check_inside, found)


def _collect(fd: int, base: str, start: str, found: list[KeyInfo]) -> list[str]:
    """Add the keys below folder ``base`` (open as ``fd``, closed here) to ``found``; return
    the keys of the symlinks met on the way, for the caller to check and follow."""
    folders: list[str] = []
    links: list[str] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                name = entry.name
                if not name.startswith(start) or is_partial(name):
                    continue
                if entry.is_symlink():
                    links.append(base + name)
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
            try:
                sub = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                continue  # removed since the scan
            except OSError as exc:  # replaced by a file or a symlink since the scan
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                if _is_link(name, fd):
                    links.append(base + name)
                continue
            links += _collect(sub, f"{base}{name}/", "", found)
    finally:
        os.close(fd)
    return links


def _follow(
    root: str, key: str, check_inside: Callable[[str, str], None], found: list[KeyInfo]
) -> None:
    """The symlink at ``key``: its file, or the keys of its folder, if it stays inside."""
    path = os.path.join(root, key)
    try:
        check_inside(path, key)
        st = os.stat(path)
    except (OSError, AccessDenied):
        return  # dangling, or leads out of the root: not part of the store
    if stat_mod.S_ISDIR(st.st_mode):
        _walk(root, f"{key}/", "", check_inside, found)
    elif stat_mod.S_ISREG(st.st_mode):
        found.append(KeyInfo(key, st.st_size, st.st_mtime))


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat_mod.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
