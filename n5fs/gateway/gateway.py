"""The gateway: a POSIX-shaped Python API over a KvStore that validates every commit.

Writes are staged per open file and committed at ``flush`` (every close), ``fsync``,
``rename`` and ``link``. A commit classifies the key under its folder's format, validates it
(strict mode refuses, warn mode records, off mode trusts) and stores it with one atomic
``set``. No FUSE in here: tests drive it directly.

This class is the façade the FUSE front calls; each concern lives in its own module, which
owns its state and states its lock discipline:

- :mod:`~n5fs.gateway.handles` — open files (nodes, handles, staging);
- :mod:`~n5fs.gateway.view` — the namespace (listings, virtual dirs, links, control entries);
- :mod:`~n5fs.gateway.committer` — validation, store writes, commit order, rejections,
  counters, consolidated metadata, change notices;
- :mod:`~n5fs.gateway.renames` — rename, link, symlink.

Lock order, whole gateway (a thread only ever takes locks further down this list while
holding one): node locks (in key order) -> commit-order folder locks
(:mod:`~n5fs.gateway.ordering`) -> the consolidated-metadata lock -> leaf locks (caches,
tables, counters). Cache loads (a LIST, a detection) run outside every cache lock and are
shared between threads. ``docs/semantics.md`` ("Consistency and concurrency") is the contract.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING

from n5fs.detect import Detector
from n5fs.errors import (
    AccessDenied,
    IsAPrefix,
    KeyExists,
    KeyNotFound,
    NotAPrefix,
    NotSupported,
    PrefixNotEmpty,
    ReadOnly,
    Rejected,
)
from n5fs.gateway.cache import stamp_of, version_of
from n5fs.gateway.commit import Mode, Rejection
from n5fs.gateway.committer import Committer
from n5fs.gateway.conditional import Conditional
from n5fs.gateway.config import GatewayConfig
from n5fs.gateway.control import ControlEntries
from n5fs.gateway.handles import Handle, Node, OpenFiles, RefusedNames, StagingConfig
from n5fs.gateway.namespace import (
    Attr,
    EntryKind,
    is_control,
    path_to_key,
    statfs_of,
)
from n5fs.gateway.reader import ObjectReader, PageCache
from n5fs.gateway.renames import Renamer
from n5fs.gateway.staging import StagingBudget
from n5fs.gateway.view import NamespaceView
from n5fs.kvstore.file import Durability, FileStore
from n5fs.kvstore.keys import folders_above, parent

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from typing_extensions import Self

    from n5fs.kvstore.base import KvStore

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


class Gateway:
    def __init__(
        self,
        store: KvStore,
        config: GatewayConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = cfg = config or GatewayConfig()
        self.mode = Mode(cfg.validate)
        self.read_only = cfg.read_only or not store.writable
        kept = cfg.mtime == "kept" or (cfg.mtime is None and not self.read_only)
        #: a stat asks the store for the kept mtime its listing cannot show (S3: a HEAD)
        self._ask_mtimes = kept and not store.listing_mtimes
        if isinstance(store, FileStore):
            store.durability = Durability(cfg.durable)
        ttl = 0.0 if cfg.consistency == "strict" else cfg.ttl
        self.detector = Detector(store, ttl=ttl, clock=clock)
        self.budget = StagingBudget(cfg.staging_bytes)
        self.files = OpenFiles(
            store, self.budget, StagingConfig(cfg.spill_bytes, cfg.tmp_dir, cfg.max_file_size)
        )
        self.view = NamespaceView(
            store,
            self.detector,
            self.files,
            ttl=ttl,
            clock=clock,
            writable=not self.read_only,
            control=self._control_bytes,
            show_control=cfg.show_control,
            flat_keys=cfg.flat_list_keys,
        )
        self.conditional = (
            Conditional(store, reason="read-only mount")
            if self.read_only
            else Conditional.probe(store, wanted=cfg.conditional != "off")
        )
        self.reader = ObjectReader(
            store,
            cache_bytes=cfg.cache_bytes,
            small_object=cfg.small_object,
            readahead=cfg.readahead,
        )
        self.reader.follow(self.view.cached_files)
        self.committer = Committer(
            store,
            self.detector,
            self.view,
            self.reader,
            mode=self.mode,
            max_rejections=cfg.max_rejections,
            budget=self.budget,
            conditional=self.conditional,
        )
        self.rules = self.committer.rules
        self.renamer = Renamer(
            store, self.view, self.files, self.committer, self.reader, self.detector
        )
        self._refused = RefusedNames()
        self.control = ControlEntries(
            self.committer, self.view, self.reader, self.files, self.budget, cfg.consistency
        )

    @property
    def rejections(self) -> list[Rejection]:
        return self.committer.rejections()

    def subscribe(self, callback: Callable[[Sequence[str]], None]) -> None:
        """``callback(paths)`` after every change whose kernel entries are stale now (commits,
        refusals, renames, unlinks, consolidated metadata rewritten). Any thread; must not
        block or call back into the gateway."""
        self.committer.subscribe(callback)

    # == namespace ==================================================================================

    def stat(self, path: str) -> Attr:
        key = path_to_key(path)
        attr = self.view.stat(key)
        if attr.kind is EntryKind.FILE and self._ask_mtimes:
            return self.view.with_kept_mtime(key, attr)
        return attr

    def lookup(self, path: str) -> Attr | None:
        """Like stat, but None when absent."""
        return self.view.lookup(path_to_key(path))

    def readdir(self, path: str) -> list[tuple[str, Attr]]:
        return self.view.readdir(path_to_key(path))

    def readlink(self, path: str) -> str:
        return self.view.readlink(path_to_key(path))

    # == control entries and housekeeping ===========================================================

    def _control_bytes(self, key: str) -> bytes:
        return self.control.content(key)

    def stats(self) -> dict[str, int]:
        return self.control.stats()

    def sweep_leftovers(self) -> int:
        """Remove what dead writers left in the store (temp files, temp archives, multipart
        uploads); called once at mount, in the background. Returns how many were removed."""
        return 0 if self.read_only else self.control.sweep(self.store)

    # == open / read / write =======================================================================

    def _check_mutable(self, key: str) -> None:
        if is_control(key):
            raise AccessDenied(f"/{key} is a read-only control entry of n5fs")
        if self.read_only:
            raise ReadOnly(f"read-only mount: cannot change /{key}")

    def open(self, path: str, flags: int) -> int:
        key = path_to_key(path)
        if is_control(key):
            if flags & (_WRITE_FLAGS | os.O_TRUNC):
                raise AccessDenied(f"{path} is a read-only control entry of n5fs")
            control = self._control_bytes(key)  # its size changes between reads: no pages
            return self.files.add_handle(
                Handle(None, flags, control=control, page_cache=PageCache.BYPASS)
            )
        writing = bool(flags & (_WRITE_FLAGS | os.O_TRUNC))
        if writing:
            self._check_mutable(key)
            self.reader.forget_pages(key)  # what it writes reaches the kernel's pages first
        attr = self.view.lookup(key)
        if attr is None:
            if writing and key in self._refused:
                # The kernel still holds the entry our refused create made; the caller's
                # open(O_CREAT) arrives as open(): create it again.
                return self.create(path, flags)
            raise KeyNotFound(f"no such file or directory: {path}")
        if attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if not writing:
            info = self.view.info(key)
            listed = stamp_of(info) if info is not None else (attr.size, attr.mtime)
            return self.files.add_handle(self.files.reading(key, flags, self.reader, listed))
        base = self.committer.base_of(key)
        node = self.files.acquire_locked(key)
        try:
            if not node.pending:
                node.base = base  # the version a metadata commit compares with
            if not flags & os.O_TRUNC:
                return self.files.add_handle(Handle(node, flags))
            self.files.empty(node)
            node.dirty = True
        finally:
            node.lock.release()
        return self.files.add_handle(Handle(node, flags))

    def page_cache(self, fh: int) -> PageCache:
        """What the kernel does with the pages it caches of the file at this open: keeps them
        when the file is the version they came from and this mount changed nothing since;
        reads around them while another handle reads an older version of the file (it may
        fill them with its bytes); else drops them."""
        return self.files.handle(fh).page_cache

    def create(self, path: str, flags: int = os.O_WRONLY) -> int:
        """A new file (parents are implied, as keys imply prefixes; the kernel has checked
        them on a mount). The name's node is locked while its existence is decided, so two
        exclusive creates of one name cannot both succeed."""
        key = path_to_key(path)
        self._check_mutable(key)
        self.reader.forget_pages(key)
        node = self.files.acquire_locked(key)
        try:
            self._start_new(node, path, flags)
        except BaseException:
            node.lock.release()
            self.files.release(node)
            raise
        node.lock.release()
        return self.files.add_handle(Handle(node, flags))

    def _start_new(self, node: Node, path: str, flags: int) -> None:
        """Stage ``node`` for ``create`` (caller holds its lock)."""
        attr = self.view.lookup(node.key)
        if attr is not None and flags & os.O_EXCL:
            raise KeyExists(f"file exists: {path}")
        if attr is not None and attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if attr is None:
            self._check_ancestors(node.key)
            node.stored = False
        if not node.pending:
            node.base = self.committer.base_of(node.key)
        node.unlinked = False
        if attr is None or flags & os.O_TRUNC:
            self.files.empty(node)
        else:
            self.files.staged(node, attr.size)
        node.dirty = True

    def _check_ancestors(self, key: str) -> None:
        """No file may sit where a new key needs a directory (ENOTDIR, as POSIX says)."""
        folder = parent(key)
        while folder:
            attr = self.view.lookup(folder)
            if attr is None:
                folder = parent(folder)
                continue
            if attr.kind is not EntryKind.DIR:
                raise NotAPrefix(f"not a directory: /{folder}")
            return

    def _stored_size(self, node: Node) -> int | None:
        info = self.view.info(node.key) if node.stored else None
        return info.size if info is not None else None

    def read(self, fh: int, size: int, offset: int) -> bytes:
        handle = self.files.handle(fh)
        node, local = handle.node, handle.local
        if local is not None and node is not None and node.staged is None:
            return self.reader.read_local(local, size, offset)  # the hot path: one pread
        if handle.control is not None:
            return handle.control[offset : offset + size]
        assert node is not None
        with node.lock:
            if node.staged is not None:
                return node.staged.read(size, offset)
            key = node.key
        info = self.view.info(key)
        total, version = (info.size, version_of(info)) if info else (None, None)
        chunk, handle.window = self.reader.read(handle.window, key, size, offset, total, version)
        return chunk

    def read_fd(self, fh: int, size: int, offset: int) -> int | None:
        """The descriptor a read of ``size`` bytes at ``offset`` may be served from directly
        (the FUSE front hands it to libfuse, which reads it in C), None when the read
        must go through :meth:`read` (staged content, a store without local files)."""
        handle = self.files.handle(fh)
        node, local = handle.node, handle.local
        if local is None or node is None or node.staged is not None:
            return None
        self.reader.count_local(local, size, offset)
        return local.fd

    def write(self, fh: int, data: bytes, offset: int) -> int:
        node = self.files.handle(fh).node
        if node is None:
            raise AccessDenied("control entries are read-only")
        self._check_mutable(node.key)
        with node.lock:
            staged = self.files.staged(node, self._stored_size(node))
            prechecks = self.committer.prechecks
            if not offset and not staged.size and prechecks is not None:
                prechecks.start(node.key, staged)  # a chunk written from 0: check as it comes
            written = staged.write(data, offset)
            node.dirty = node.written = True
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        """With a handle, or while a writer holds unflushed data: staged, committed at its
        flush. Otherwise (``truncate(1)``): committed now, like any other change."""
        key = path_to_key(path)
        self._check_mutable(key)
        if fh is not None:
            node = self.files.handle(fh).node
            if node is None:
                raise AccessDenied(f"{path} is a read-only control entry of n5fs")
            with node.lock:
                self.files.staged(node, self._stored_size(node)).truncate(length)
                node.dirty = node.written = True
            return
        if self.view.stat(key).kind is not EntryKind.FILE:
            raise IsAPrefix(f"is a directory: {path}")
        with self.files.pinned(key) as (node,):
            self.files.staged(node, self._stored_size(node)).truncate(length)
            deferred = node.dirty and node.refs > 1  # a writer's flush commits it
            node.dirty = node.written = True
            if not deferred:
                self._commit(node)

    # == commits ===================================================================================

    def _commit(self, node: Node) -> None:
        """Commit the node (caller holds its lock), remembering refused new names."""
        new = not node.stored
        try:
            self.committer.commit_node(node)
        except Rejected:
            if new:
                self._refused.remember(node.key)
            raise
        self._refused.forget(node.key)

    def flush(self, fh: int) -> None:
        node = self.files.handle(fh).node
        if node is None:
            return
        with node.lock:
            if not node.dirty or node.unlinked:
                return
            if not node.stored and not node.written:
                # Created and not written yet: `cmd > file` flushes the empty file when the
                # shell closes its first descriptor. Judge it at release, or at the first
                # flush after a write.
                return
            self._commit(node)

    def fsync(self, fh: int) -> None:
        self.flush(fh)
        self.store.flush()

    def release(self, fh: int) -> None:
        handle = self.files.pop_handle(fh)
        if handle is None or handle.node is None:
            return
        node = handle.node
        try:
            with node.lock:
                if node.dirty and not node.unlinked and node.refs == 1:
                    self._commit(node)  # the kernel always flushes first; this is a safety net
        except Rejected:
            pass  # recorded by the committer; release() cannot report it
        finally:
            self.files.release(node)

    def utimens(self, path: str, mtime: float) -> None:
        """A file's modification time (``touch -d``, ``cp -a``, ``rsync -a``): kept with staged
        content until its commit, else stored now. Folders and links keep none."""
        key = path_to_key(path)
        self._check_mutable(key)
        if self.view.stat(key).kind is not EntryKind.FILE:
            return
        with self.files.pinned(key) as (node,):
            if node.pending:
                node.mtime = mtime
                return
            info = self.view.info(key)
            if info is not None:
                self.committer.set_mtime(key, mtime, info.size)

    # == namespace changes =========================================================================

    def unlink(self, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        attr = self.view.stat(key)
        if attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if attr.kind is EntryKind.SYMLINK:
            self.renamer.remove_link(key)
            return
        with self.files.pinned(key) as (node,):
            stored = node.stored
            self.files.detach(key)
            self._refused.forget(key)
            if not stored:
                self.committer.changed([key])
                return
            with self.committer.hold(key):
                self.store.delete(key)
                self.committer.after_delete(key)

    def mkdir(self, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        if self.view.lookup(key) is not None:
            raise KeyExists(f"file exists: {path}")
        self.view.note_mkdir(key)

    def rmdir(self, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        if not key:
            raise AccessDenied("cannot remove the mount root")
        above = folders_above(key)
        with self.committer.order.hold(shared=above, exclusive=[key + "/"]):
            if self.view.stat(key).kind is not EntryKind.DIR:
                raise NotAPrefix(f"not a directory: {path}")
            if self.view.readdir(key):
                raise PrefixNotEmpty(f"directory not empty: {path}")
            self.view.note_rmdir(key)
        self.committer.changed([key])

    def rename(self, old: str, new: str) -> None:
        src, dst = path_to_key(old), path_to_key(new)
        self._check_mutable(src)
        self._check_mutable(dst)
        if not src or not dst:
            raise AccessDenied("cannot rename the mount root")
        attr = self.view.stat(src)
        dst_attr = self.view.lookup(dst)
        if dst_attr is None:
            self._check_ancestors(dst)
        if attr.kind is EntryKind.DIR:
            self.renamer.rename_dir(src, dst, dst_attr)
        elif attr.kind is EntryKind.SYMLINK:
            raise NotSupported("hdmf-zarr links cannot be renamed; remove and link again")
        else:
            self.renamer.rename_file(src, dst, dst_attr)
            self._refused.forget(dst)

    def link(self, src_path: str, dst_path: str) -> None:
        src, dst = path_to_key(src_path), path_to_key(dst_path)
        self._check_mutable(dst)
        if self.view.stat(src).kind is not EntryKind.FILE:
            raise AccessDenied(f"only files can be linked: {src_path}")
        self.renamer.link(src, dst)

    def symlink(self, target: str, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        self.renamer.symlink(target, key)

    # == filesystem ================================================================================

    def statfs(self) -> dict[str, int]:
        return statfs_of(getattr(self.store, "root", None))

    def drop_caches(self) -> None:
        """Forget everything cached about the store (SIGHUP; someone else changed it)."""
        self.view.clear()
        self.reader.cache.clear()
        self.detector.clear()
        self.store.refresh()

    def close(self) -> None:
        """Commit what is still staged, then make the store durable and close it."""
        for node in self.files.all_nodes():
            with node.lock:
                if node.dirty and not node.unlinked:
                    with contextlib.suppress(Rejected):  # recorded; nothing more at shutdown
                        self.committer.commit_node(node)
        self.committer.close()
        self.reader.close()
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- convenience for tests and notebooks -----------------------------------------------------

    def write_file(self, path: str, data: bytes) -> None:
        """create + write + close, as ``cp`` does; raises Rejected if the commit is refused."""
        fh = self.create(path, os.O_WRONLY | os.O_TRUNC)
        try:
            self.write(fh, data, 0)
            self.flush(fh)
        finally:
            self.release(fh)

    def read_file(self, path: str) -> bytes:
        fh = self.open(path, os.O_RDONLY)
        try:
            out = bytearray()
            while chunk := self.read(fh, 1 << 20, len(out)):
                out += chunk
            return bytes(out)
        finally:
            self.release(fh)

    def walk_keys(self) -> list[str]:
        return sorted(k.key for k in self.store.list("", delimiter=None).keys)
