"""Local-disk primitives of the file store: atomic replacement, fsync of files and folders,
and copies that keep holes.

Why apart from :mod:`~n5fs.kvstore.file.store`: these are plain POSIX file operations with no notion
of keys, roots or durability policy; the store decides *when* to call them (every ``set`` with
``Durability.COMMIT``, at ``flush`` with ``FSYNC``), this module only *how*. A temp file is
hidden and names its writer (:func:`~n5fs.kvstore.tempnames.temp_name`), so a killed writer's
file is found and removed by a later sweep, never listed as a key.

Stateless: no shared state, no locks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import sys
from typing import TYPE_CHECKING, BinaryIO

from n5fs.kvstore.tempnames import temp_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "atomic_writer",
    "can_sync_filesystem",
    "copy_sparse",
    "fsync_dir",
    "fsync_file",
    "sync_filesystem",
    "write_pieces",
]

_CHUNK = 1 << 20
#: the largest single ``write(2)`` into a local file (:func:`write_pieces`)
WRITE_PIECE = 1 << 20


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on directories
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux), None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        syncfs: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return syncfs


def can_sync_filesystem() -> bool:
    return _syncfs() is not None


def sync_filesystem(path: str) -> bool:
    """``syncfs(2)`` of the filesystem holding ``path``: every file and folder written there
    is on disk when it returns, in one call (one journal commit) where an ``fsync`` per file
    cost one each (thousands of small chunks: seconds). It writes back what others wrote on
    that filesystem too. False where there is no ``syncfs`` (nothing done)."""
    syncfs = _syncfs()
    if syncfs is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}", path)
    finally:
        os.close(fd)
    return True


def _temp_beside(path: str) -> str:
    """A hidden temp name beside ``path`` that names its writer and fits ``NAME_MAX``."""
    head, name = os.path.split(path)
    return os.path.join(head, temp_name(name))


def fsync_file(path: str) -> None:
    """Make a file written earlier durable; a file gone since (replaced, deleted) is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a file to write; on success it replaces ``path`` (durably unless told not to),
    else it vanishes."""
    tmp = _temp_beside(path)
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(os.path.dirname(path))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_pieces(f: BinaryIO, data: bytes | memoryview) -> None:
    """Write ``data`` in pieces of :data:`WRITE_PIECE`. Why: one large ``write(2)`` into the
    page cache costs the daemon more CPU than the same bytes in pieces (the kernel copies a
    piece while its source is still in the CPU's cache), and a passthrough writes as the
    kernel hands it over, in pieces of at most 1 MiB."""
    view = memoryview(data).cast("B")
    f.writelines(view[start : start + WRITE_PIECE] for start in range(0, len(view), WRITE_PIECE))


def copy_sparse(src: BinaryIO, dst: BinaryIO) -> None:
    """Copy ``src`` into the empty ``dst``: only its data extents (``SEEK_DATA``/``SEEK_HOLE``)
    at their offsets, then ``ftruncate`` to its size, so holes stay holes (``truncate -s 4G``
    costs no blocks). Where the platform or filesystem cannot say, a plain copy."""
    size = os.fstat(src.fileno()).st_size
    extents: list[tuple[int, int]] | None
    try:
        extents = list(_data_extents(src.fileno(), size))
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        extents = None
    if extents is None:
        src.seek(0)
        shutil.copyfileobj(src, dst, _CHUNK)
        return
    for start, stop in extents:
        src.seek(start)
        dst.seek(start)
        _copy_range(src, dst, stop - start)
    dst.flush()
    os.ftruncate(dst.fileno(), size)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of every data extent of ``fd``; OSError where unsupported."""
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        raise OSError(errno.ENOTSUP, "no SEEK_DATA/SEEK_HOLE here")
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, seek_data)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                return
            raise
        stop = min(os.lseek(fd, start, seek_hole), size)
        yield start, stop
        pos = stop


def _copy_range(src: BinaryIO, dst: BinaryIO, length: int) -> None:
    while length > 0:
        data = src.read(min(_CHUNK, length))
        if not data:
            return  # the source shrank meanwhile: the final ftruncate keeps the size
        dst.write(data)
        length -= len(data)
