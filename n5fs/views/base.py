"""A view: the gateway's calls, answered for the store as another format shows it.

:class:`View` has the shape the FUSE front calls (:class:`~n5fs.fuse_front.operations.
GatewayLike`) and sits on a :class:`~n5fs.gateway.Gateway`. What its tree says is *native*
(a plain file, a folder, a chunk whose bytes stay as stored) goes to the gateway unchanged,
page cache and local descriptors included; what the view makes (metadata documents,
translated chunks, ``.npy`` files) is opened as a gateway handle reading that content
(:meth:`~n5fs.gateway.write.filecalls.FileCalls.open_made`). Every handle is the gateway's:
one numbering, one table, and every call by handle goes straight to it.

A Zarr view (``zarr3``, ``zarr2``) of a writable N5 store takes writes: the gateway stages
them under their view names like any file (its handles, its one staging budget, spilling to
disk) and hands each to :class:`~n5fs.views.writes.ViewWrites` to commit, which translates
it into native N5 and stores that through the gateway; the ``n5`` view of a writable Zarr
store, likewise, into native Zarr (:class:`~n5fs.views.n5_writes.N5ViewWrites`). Removing a
document or a folder there removes the native data it stands for
(:class:`~n5fs.views.removal.Removals`: the names it hides are hidden here). Every other view
(``npy``, Zarr over Zarr, N5 over N5, a read-only store) answers EROFS
(:class:`~n5fs.errors.ReadOnly`) to every call that would change something, before the
gateway is asked; so does a writable view outside the hierarchies it writes into. The
control folder ``/.n5fs/`` is the gateway's, plus ``view.json``: what the view did (source reads, chunks
translated, units decoded), for ``cat`` and for tests.

Thread-safety: the view keeps no table of its own (handles and staged files are the
gateway's); contents are immutable once made; the tree and the gateway are thread-safe.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

from n5fs.errors import IsAPrefix, KeyExists, KeyNotFound, NotAPrefix, ReadOnly
from n5fs.gateway.namespace.paths import CONTROL, Attr, EntryKind, is_control, path_to_key
from n5fs.gateway.read.reader import PageCache
from n5fs.gateway.write.filecalls import read_whole
from n5fs.views.writes import ViewWrites

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from n5fs.gateway import Gateway
    from n5fs.views.tree import Content, Entry, ViewTree

#: the view's counters, beside the gateway's control files
VIEW_STATS = f"{CONTROL}/view.json"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class View:
    """The store seen through ``tree`` (see the module docs)."""

    def __init__(self, gateway: Gateway, tree: ViewTree) -> None:
        self.gateway = gateway
        self.tree = tree
        self.writes = _writes_for(gateway, tree)
        self.read_only = self.writes is None

    @property
    def format(self) -> str:
        return self.tree.name

    def _refuse(self, what: str, path: str) -> ReadOnly:
        return ReadOnly(f"the --as {self.format} view is read-only: cannot {what} {path}")

    def _entry(self, path: str) -> tuple[str, Entry]:
        key = path_to_key(path)
        entry = None if self.writes is None else self.writes.declared(key)
        if self.writes is not None and self.writes.removals.hidden(key):
            entry = None
        elif entry is None:
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
        staged = None if self.writes is None else self.writes.stat(key)
        if staged is not None:
            return staged
        _, entry = self._entry(path)
        if entry.native and entry.kind is EntryKind.FILE:
            return self.gateway.stat(path)  # the gateway's mtime rules (S3 keeps utimens apart)
        return self._writable(entry.attr)

    def _writable(self, attr: Attr) -> Attr:
        """A writable view's entries may be written (the kernel checks the mode bits)."""
        return attr if self.read_only else dataclasses.replace(attr, writable=True)

    def lookup(self, path: str) -> Attr | None:
        try:
            return self.stat(path)
        except KeyNotFound:
            return None

    def readdir(self, path: str) -> list[tuple[str, Attr]]:
        key = path_to_key(path)
        if is_control(key):
            listing = list(self.gateway.readdir(path))
            if key == CONTROL:
                listing.append((VIEW_STATS.rpartition("/")[2], self.stat("/" + VIEW_STATS)))
            return sorted(listing)
        staged = None if self.writes is None else self.writes.stat(key)
        if staged is not None and staged.kind is EntryKind.DIR:
            return sorted(self.writes.names(key)) if self.writes is not None else []
        _, entry = self._entry(path)
        if entry.kind is not EntryKind.DIR:
            raise NotAPrefix(f"not a directory: {path}")
        shown = {name: self._writable(child.attr) for name, child in self.tree.children(key)}
        if self.writes is not None:
            shown.update(self.writes.names(key))
            hidden = self.writes.removals.hidden
            shown = {n: a for n, a in shown.items() if not hidden(f"{key}/{n}" if key else n)}
        return sorted(shown.items())

    def readlink(self, path: str) -> str:
        _, entry = self._entry(path)
        if not entry.native or entry.kind is not EntryKind.SYMLINK:
            raise KeyNotFound(f"not a symlink: {path}")
        return self.gateway.readlink(path)

    # == files ====================================================================================

    def open(self, path: str, flags: int) -> int:
        key = path_to_key(path)
        staged = self.writes is not None and self.writes.stat(key) is not None
        if flags & _WRITE_FLAGS or staged:
            return self._open_writing(path, key, flags)
        if key == VIEW_STATS:
            return self._add(_Uncached(self._stats()))
        if is_control(key):
            return self.gateway.open(path, flags)
        _, entry = self._entry(path)
        if entry.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if entry.native or entry.open is None:
            return self.gateway.open(path, flags)
        return self._add(entry.open())

    def _open_writing(self, path: str, key: str, flags: int) -> int:
        """A write handle: the gateway's for a native file, else a staged view file."""
        writes = self._writes("write", path, key)
        if writes.stat(key) is not None:
            return writes.open(key, flags, None)
        entry = self.tree.entry(key)
        if entry is None:
            raise KeyNotFound(f"no such file or directory in the {self.format} view: {path}")
        if entry.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if entry.native:
            return self.gateway.open(path, flags)
        _, shown = self._entry(path)  # what a writer of this mount declared, if one did
        base = None if flags & os.O_TRUNC or shown.open is None else _Shown(shown)
        return writes.open(key, flags, base)

    def _writes(self, what: str, path: str, key: str) -> ViewWrites:
        """The view's writes, where ``key`` may be written; else EROFS."""
        if self.writes is None or is_control(key):
            raise self._refuse(what, path)
        if not self.writes.in_n5(key):
            raise ReadOnly(
                f"the --as {self.format} view writes into "
                f"{getattr(self.writes, 'hierarchy', 'N5')} hierarchies only: cannot {what} {path}"
            )
        return self.writes

    def _add(self, content: Content) -> int:
        return self.gateway.calls.open_made(content, content.page_cache)

    # Every handle is the gateway's (native files, view files being written, made content).

    def read(self, fh: int, size: int, offset: int) -> bytes:
        return self.gateway.read(fh, size, offset)

    def read_fd(self, fh: int, size: int, offset: int) -> int | None:
        """The gateway's descriptor for a native file; None for what the view makes."""
        return self.gateway.read_fd(fh, size, offset)

    def page_cache(self, fh: int) -> PageCache:
        if self.writes is not None and self._translated(fh):
            return PageCache.DROP  # its size as read is not the size the view will show
        return self.gateway.page_cache(fh)

    def _translated(self, fh: int) -> bool:
        node = self.gateway.files.handle(fh).node
        return node is not None and node.translator is not None

    def flush(self, fh: int) -> None:
        self.gateway.flush(fh)

    def fsync(self, fh: int) -> None:
        self.gateway.fsync(fh)  # the control file's fsync flushes the store (unmount)

    def release(self, fh: int) -> None:
        self.gateway.release(fh)

    # == changes (a writable Zarr view over N5; else EROFS) ========================================

    def create(self, path: str, flags: int) -> int:
        key = path_to_key(path)
        writes = self._writes("create", path, key)
        if flags & os.O_EXCL and self.lookup(path) is not None:
            raise KeyExists(f"file exists: {path}")
        if writes.stat(key) is None:
            entry = self.tree.entry(key)
            if entry is not None and entry.native and entry.kind is EntryKind.FILE:
                return self.gateway.create(path, flags)  # a plain file of a group, as stored
        return writes.open(key, flags | os.O_TRUNC, None)

    def write(self, fh: int, data: bytes, offset: int) -> int:
        if self.writes is None:
            raise self._refuse("write", f"handle {fh}")
        return self.gateway.write(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        key = path_to_key(path)
        writes = self._writes("truncate", path, key)
        if writes.truncate(key, length):
            return
        _, entry = self._entry(path)
        if not entry.native:
            raise self._refuse("truncate a file the view makes:", path)
        self.gateway.truncate(path, length, fh)

    def unlink(self, path: str) -> None:
        key = path_to_key(path)
        writes = self._writes("remove", path, key)
        if writes.unlink(key) or writes.removals.unlink(key):
            return
        native = writes.native_chunk(key)
        if native is not None:
            try:
                self.gateway.unlink("/" + native)
            except KeyNotFound:
                if not self._entry(path)[1].fill:
                    raise
                # a fill block (nothing stored): it reads as a removed block would, done
            return
        _, entry = self._entry(path)
        if not entry.native:
            raise self._refuse("remove a file the view makes:", path)
        self.gateway.unlink(path)

    def mkdir(self, path: str) -> None:
        key = path_to_key(path)
        writes = self._writes("make the directory", path, key)
        if self.lookup(path) is not None:
            raise KeyExists(f"file exists: {path}")
        if not writes.mkdir(key):
            self.gateway.mkdir(path)

    def rmdir(self, path: str) -> None:
        key = path_to_key(path)
        writes = self._writes("remove the directory", path, key)
        if not writes.rmdir(key):
            writes.removals.rmdir(key)

    def rename(self, old: str, new: str) -> None:
        src, dst = path_to_key(old), path_to_key(new)
        writes = self._writes("rename", old, src)
        self._writes("rename", new, dst)
        if not writes.rename(src, dst):
            raise self._refuse("rename what it did not stage:", f"{old} to {new}")

    def link(self, src_path: str, dst_path: str) -> None:
        src, dst = path_to_key(src_path), path_to_key(dst_path)
        writes = self._writes("link", dst_path, dst)
        if self.lookup(dst_path) is not None and not writes.implicit(dst):
            raise KeyExists(f"file exists: {dst_path}")
        if not writes.rename(src, dst, keep=True):
            raise self._refuse("link what it did not stage:", dst_path)

    def symlink(self, target: str, path: str) -> None:
        raise self._refuse("make the symlink", path)

    def utimens(self, path: str, mtime: float) -> None:
        key = path_to_key(path)
        writes = self._writes("change the time of", path, key)
        if writes.stat(key) is None:
            self.gateway.utimens(path, mtime)

    # == the mount ================================================================================

    def subscribe(
        self, callback: Callable[[Sequence[str]], None], *, own_writes: bool = True
    ) -> None:
        """What a writable view commits it announces under its own names (the view file
        made of it has another size than the one written, so ``own_writes`` changes nothing
        here: every commit is announced); a read-only view changes nothing, and what others
        change in the store reaches the view's readers after the cache TTL, as on a native
        mount."""
        if self.writes is not None:
            self.writes.subscribe(callback)

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
        self.gateway.close()

    # -- convenience for tests and notebooks -----------------------------------------------------

    def read_file(self, path: str) -> bytes:
        """open + read + release through the view, as ``cat`` does."""
        return read_whole(self, path)


def _writes_for(gateway: Gateway, tree: ViewTree) -> ViewWrites | None:
    """Writes for a Zarr view of a writable store whose root is N5 (with or without its
    attributes.json: the first document written gives it one), or the n5 view of one whose
    root is Zarr (v2, v3); else None (EROFS)."""
    from n5fs.views.n5 import N5Tree
    from n5fs.views.n5_writes import WRITABLE, N5ViewWrites
    from n5fs.views.writes import n5_without_attributes
    from n5fs.views.zarr import ZarrTree

    if gateway.read_only:
        return None
    root = tree.access.folder("").fmt
    if isinstance(tree, N5Tree) and root in WRITABLE:
        return N5ViewWrites(gateway, tree)
    if not isinstance(tree, ZarrTree) or root not in ("n5", None):
        return None
    if root is None and not n5_without_attributes(tree.access):
        return None
    return ViewWrites(gateway, tree)


class _Shown:
    """What the view shows at a path, the base a view file opened for writing starts from:
    read by range when a write leaves a part untouched or the commit needs it all, never up
    front (:class:`~n5fs.gateway.write.staging.BaseObject`). The content is made once, at the
    first read."""

    def __init__(self, entry: Entry) -> None:
        self._entry = entry
        self._content: Content | None = None
        self.size = entry.size

    def fetch(self, offset: int, length: int) -> bytes:
        if self._content is None:
            assert self._entry.open is not None
            self._content = self._entry.open()
        return self._content.read(length, offset)


class _Uncached:
    """``view.json``: its size changes between reads, so no page cache."""

    page_cache = PageCache.BYPASS

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int, offset: int) -> bytes:
        return self.data[offset : offset + size]
