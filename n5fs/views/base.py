"""A view: the gateway's calls, answered for the store as another format shows it.

:class:`View` has the shape the FUSE front calls (:class:`~n5fs.fuse_front.operations.
GatewayLike`) and sits on a :class:`~n5fs.gateway.Gateway`. What its tree says is *native*
(a plain file, a folder, a chunk whose bytes stay as stored) goes to the gateway unchanged,
page cache and local descriptors included; what the view makes (metadata documents,
translated chunks, ``.npy`` files) it serves from its own open handles, numbered apart from
the gateway's (from ``2**40``), so one ``fh`` never means two files.

Views are read-only in this stage: every call that would change something answers EROFS
(:class:`~n5fs.errors.ReadOnly`), before the gateway is asked. The control folder
``/.n5fs/`` is the gateway's, plus ``view.json``: what the view did (source reads, chunks
translated, units decoded), for ``cat`` and for tests.

Thread-safety: the handle table is guarded by ``_lock`` (a leaf lock, dictionary work only);
contents are immutable once made; the tree and the gateway are thread-safe.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from n5fs.errors import IsAPrefix, KeyNotFound, NotAPrefix, ReadOnly
from n5fs.gateway.namespace import CONTROL, Attr, EntryKind, is_control, path_to_key
from n5fs.gateway.reader import PageCache

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from n5fs.gateway import Gateway
    from n5fs.views.tree import Content, Entry, ViewTree

#: the view's own handles start here (the gateway counts from 1)
VIEW_HANDLES = 1 << 40
#: the view's counters, beside the gateway's control files
VIEW_STATS = f"{CONTROL}/view.json"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class View:
    """The store seen through ``tree`` (see the module docs)."""

    read_only = True

    def __init__(self, gateway: Gateway, tree: ViewTree) -> None:
        self.gateway = gateway
        self.tree = tree
        self._open: dict[int, Content] = {}
        self._fh = itertools.count(VIEW_HANDLES)
        self._lock = threading.Lock()

    @property
    def format(self) -> str:
        return self.tree.name

    def _refuse(self, what: str, path: str) -> ReadOnly:
        return ReadOnly(f"the --as {self.format} view is read-only: cannot {what} {path}")

    def _entry(self, path: str) -> tuple[str, Entry]:
        key = path_to_key(path)
        entry = self.tree.entry(key)
        if entry is None:
            raise KeyNotFound(f"no such file or directory in the {self.format} view: {path}")
        return key, entry

    # == namespace ================================================================================

    def stat(self, path: str) -> Attr:
        key = path_to_key(path)
        if key == VIEW_STATS:
            return Attr(EntryKind.FILE, len(self._stats()), writable=False)
        if is_control(key):
            return self.gateway.stat(path)
        _, entry = self._entry(path)
        if entry.native and entry.kind is EntryKind.FILE:
            return self.gateway.stat(path)  # the gateway's mtime rules (S3 keeps utimens apart)
        return entry.attr

    def lookup(self, path: str) -> Attr | None:
        try:
            return self.stat(path)
        except KeyNotFound:
            return None

    def readdir(self, path: str) -> list[tuple[str, Attr]]:
        key = path_to_key(path)
        if is_control(key):
            listing = self.gateway.readdir(path)
            if key == CONTROL:
                listing.append((VIEW_STATS.rpartition("/")[2], self.stat("/" + VIEW_STATS)))
            return sorted(listing)
        _, entry = self._entry(path)
        if entry.kind is not EntryKind.DIR:
            raise NotAPrefix(f"not a directory: {path}")
        return [(name, child.attr) for name, child in self.tree.children(key)]

    def readlink(self, path: str) -> str:
        _, entry = self._entry(path)
        if not entry.native or entry.kind is not EntryKind.SYMLINK:
            raise KeyNotFound(f"not a symlink: {path}")
        return self.gateway.readlink(path)

    # == files ====================================================================================

    def open(self, path: str, flags: int) -> int:
        if flags & _WRITE_FLAGS:
            raise self._refuse("write", path)
        key = path_to_key(path)
        if key == VIEW_STATS:
            data = self._stats()
            return self._add(_Uncached(data))
        if is_control(key):
            return self.gateway.open(path, flags)
        _, entry = self._entry(path)
        if entry.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if entry.native or entry.open is None:
            return self.gateway.open(path, flags)
        return self._add(entry.open())

    def _add(self, content: Content) -> int:
        with self._lock:
            fh = next(self._fh)
            self._open[fh] = content
        return fh

    def _content(self, fh: int) -> Content | None:
        if fh < VIEW_HANDLES:
            return None
        content = self._open.get(fh)  # one dict lookup: atomic without the lock
        if content is None:
            raise KeyNotFound(f"no open file with handle {fh}")
        return content

    def read(self, fh: int, size: int, offset: int) -> bytes:
        content = self._content(fh)
        if content is None:
            return self.gateway.read(fh, size, offset)
        return content.read(size, offset)

    def read_fd(self, fh: int, size: int, offset: int) -> int | None:
        """The gateway's descriptor for a native file; None for what the view makes."""
        read_fd = getattr(self.gateway, "read_fd", None)
        if fh >= VIEW_HANDLES or read_fd is None:
            return None
        fd: int | None = read_fd(fh, size, offset)
        return fd

    def page_cache(self, fh: int) -> PageCache:
        content = self._content(fh)
        if content is not None:
            return content.page_cache
        decide = getattr(self.gateway, "page_cache", None)
        return PageCache.DROP if decide is None else PageCache(decide(fh))

    def flush(self, fh: int) -> None:
        if fh < VIEW_HANDLES:
            self.gateway.flush(fh)

    def fsync(self, fh: int) -> None:
        if fh < VIEW_HANDLES:
            self.gateway.fsync(fh)  # the control file's fsync flushes the store (unmount)

    def release(self, fh: int) -> None:
        if fh < VIEW_HANDLES:
            self.gateway.release(fh)
            return
        with self._lock:
            self._open.pop(fh, None)

    # == what a read-only view refuses ============================================================

    def create(self, path: str, flags: int) -> int:
        raise self._refuse("create", path)

    def write(self, fh: int, data: bytes, offset: int) -> int:
        raise self._refuse("write", f"handle {fh}")

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        raise self._refuse("truncate", path)

    def unlink(self, path: str) -> None:
        raise self._refuse("remove", path)

    def mkdir(self, path: str) -> None:
        raise self._refuse("make the directory", path)

    def rmdir(self, path: str) -> None:
        raise self._refuse("remove the directory", path)

    def rename(self, old: str, new: str) -> None:
        raise self._refuse("rename", f"{old} to {new}")

    def link(self, src_path: str, dst_path: str) -> None:
        raise self._refuse("link", dst_path)

    def symlink(self, target: str, path: str) -> None:
        raise self._refuse("make the symlink", path)

    def utimens(self, path: str, mtime: float) -> None:
        raise self._refuse("change the time of", path)

    # == the mount ================================================================================

    def subscribe(self, callback: Callable[[Sequence[str]], None]) -> None:
        """Nothing to announce: a read-only view changes nothing, and what others change
        in the store reaches the view's readers after the cache TTL, as on a native mount."""

    def statfs(self) -> dict[str, int]:
        return self.gateway.statfs()

    def stats(self) -> dict[str, int]:
        """The view's counters (``/.n5fs/view.json``)."""
        return self.tree.access.stats()

    def _stats(self) -> bytes:
        doc: dict[str, Any] = {"view": self.format, **self.stats()}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def drop_caches(self) -> None:
        self.gateway.drop_caches()

    def close(self) -> None:
        with self._lock:
            self._open.clear()
        self.gateway.close()

    # -- convenience for tests and notebooks -----------------------------------------------------

    def read_file(self, path: str) -> bytes:
        fh = self.open(path, os.O_RDONLY)
        try:
            out = bytearray()
            while chunk := self.read(fh, 1 << 20, len(out)):
                out += chunk
            return bytes(out)
        finally:
            self.release(fh)


class _Uncached:
    """``view.json``: its size changes between reads, so no page cache."""

    page_cache = PageCache.BYPASS

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int, offset: int) -> bytes:
        return self.data[offset : offset + size]
