"""The gateway: a POSIX-shaped Python API over a KvStore that validates every commit.

Writes are staged per open file and committed at ``flush`` (every close), ``fsync``,
``rename`` and ``link``. A commit classifies the key under its folder's format, validates it
(strict mode refuses, warn mode records, off mode trusts) and stores it with one atomic
``set``. No FUSE in here: tests drive it directly.

This class builds the pieces of one mount and is what the FUSE front (or a view) calls. The
content calls go to :class:`~n5fs.gateway.write.filecalls.FileCalls`; the namespace changes
(unlink, mkdir, rmdir, rename, link, symlink) and the order of shutdown are its own, and so
are the threads of every piece: one :class:`~n5fs.workers.Workers`, handed to the pieces
that run work on a pool and shut down once in :meth:`Gateway.close`, after the committer
drained. Each piece lives in the subpackage that owns its state, whose docstring names that state and its
locks: :mod:`n5fs.gateway.write` (open files, staging), :mod:`n5fs.gateway.commit` (rules,
commit order, renames, many mounts), :mod:`n5fs.gateway.namespace` (listings, walks, links,
control entries), :mod:`n5fs.gateway.read` (byte cache, read-ahead, descriptors).

Lock order, whole gateway (a thread only ever takes locks further down this list while
holding one): node locks (in key order) -> commit-order folder locks
(:mod:`~n5fs.gateway.commit.ordering`) -> the consolidated-metadata lock -> leaf locks (caches,
tables, counters); each lock is made with its rank by :mod:`n5fs.locking`, which checks the
order on every acquire when ``N5FS_DEBUG_LOCKS=1``. Cache loads (a LIST, a detection) run
outside every cache lock and are shared between threads. ``docs/semantics.md`` ("Consistency and concurrency") is the contract.

Memory: ``cache_bytes`` is one budget for what the mount caches, shared out here: the folder
listings may hold a :data:`LISTING_SHARE`-th of it (weighed by their bytes, the least recently
used dropped past it), the byte cache the rest; staged writes have their own
(``staging_bytes``).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from n5fs.detect import Detector, Listed
from n5fs.errors import (
    AccessDenied,
    IsAPrefix,
    KeyExists,
    NotAPrefix,
    NotSupported,
    PrefixNotEmpty,
    Rejected,
)
from n5fs.formats.registry import PROBE_NAMES
from n5fs.gateway.commit.committer import Committer
from n5fs.gateway.commit.conditional import Conditional
from n5fs.gateway.commit.renames import Renamer
from n5fs.gateway.commit.rules import Mode, Rejection
from n5fs.gateway.config import GatewayConfig
from n5fs.gateway.namespace.control import ControlEntries
from n5fs.gateway.namespace.listings import NamespaceView
from n5fs.gateway.namespace.paths import (
    Attr,
    EntryKind,
    FileMap,
    path_to_key,
    statfs_of,
)
from n5fs.gateway.read.byte_cache import version_of
from n5fs.gateway.read.reader import ObjectReader, PageCache
from n5fs.gateway.write.filecalls import FileCalls, read_whole
from n5fs.gateway.write.handles import OpenFiles, StagingConfig
from n5fs.gateway.write.staging import StagingBudget
from n5fs.kvstore.abilities import Durability, listed_times, settable_durability
from n5fs.kvstore.keys import folders_above
from n5fs.workers import Workers

#: the folder listings may hold ``cache_bytes`` over this; the byte cache holds the rest (packed,
#: a million chunk files' listings take some 30 MB: the default's quarter holds two million)
LISTING_SHARE = 4

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from typing_extensions import Self

    from n5fs.kvstore.base import KvStore


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
        #: every thread pool of this gateway, started lazily and shut down once by close()
        self.workers = Workers()
        self.mode = Mode(cfg.validate)
        self.read_only = cfg.read_only or not store.traits.writable
        source = cfg.mtime or ("listing" if self.read_only else "kept")
        listed = None if store.traits.listing_mtimes else listed_times(store)
        if source == "kept" and listed is not None:
            listed.show_kept_times(True)  # S3: from each folder's times index, no HEAD a file
        #: a stat asks the store for the kept mtime its listing cannot show (a HEAD on S3):
        #: ``-o mtime=head``, or ``kept`` where listings cannot be asked for kept times
        self._ask_mtimes = not store.traits.listing_mtimes and (
            source == "head" or (source == "kept" and listed is None)
        )
        durability = settable_durability(store)
        if durability is not None:
            durability.set_durability(Durability(cfg.durable))
        ttl = 0.0 if cfg.consistency == "strict" else cfg.ttl
        self.detector = Detector(store, ttl=ttl, clock=clock, listed=self._fresh_files)
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
            workers=self.workers,
            show_control=cfg.show_control,
            flat_keys=cfg.flat_list_keys,
            max_bytes=cfg.cache_bytes // LISTING_SHARE,
        )
        self.conditional = (
            Conditional(store, reason="read-only mount")
            if self.read_only
            else Conditional.probe(store, wanted=cfg.conditional != "off")
        )
        self.reader = ObjectReader(
            store,
            cache_bytes=cfg.cache_bytes - cfg.cache_bytes // LISTING_SHARE,
            small_object=cfg.small_object,
            readahead=cfg.readahead,
            workers=self.workers,
            clock=clock,
        )
        self.reader.follow(self._listed_files, self._listed_folders)
        self.committer = Committer(
            store,
            self.detector,
            self.view,
            self.reader,
            mode=self.mode,
            max_rejections=cfg.max_rejections,
            budget=self.budget,
            conditional=self.conditional,
            workers=self.workers,
        )
        self.rules = self.committer.rules
        self.renamer = Renamer(
            store, self.view, self.files, self.committer, self.reader, self.detector
        )
        self.control = ControlEntries(
            self.committer, self.view, self.reader, self.files, self.budget, store, cfg.consistency
        )
        self.calls = FileCalls(
            store,
            self.view,
            self.files,
            self.reader,
            self.committer,
            control=self._control_bytes,
            read_only=self.read_only,
        )
        calls = self.calls
        self.open, self.create, self.page_cache = calls.open, calls.create, calls.page_cache
        self.read, self.read_fd, self.write = calls.read, calls.read_fd, calls.write
        self.read_unopened, self.read_fd_unopened = calls.read_unopened, calls.read_fd_unopened
        self.truncate, self.utimens = calls.truncate, calls.utimens
        self.flush, self.fsync, self.release = calls.flush, calls.fsync, calls.release

    @property
    def rejections(self) -> list[Rejection]:
        return self.committer.rejections()

    def subscribe(
        self, callback: Callable[[Sequence[str]], None], *, own_writes: bool = True
    ) -> None:
        """``callback(paths)`` after every change whose kernel entries are stale now (commits,
        refusals, renames, unlinks, consolidated metadata rewritten). Any thread; must not
        block or call back into the gateway. ``own_writes=False``: not told of a file whose
        commit stored just what was written to it through this gateway's file calls
        (:meth:`~n5fs.gateway.commit.committer.Committer.subscribe`)."""
        self.committer.subscribe(callback, own_writes=own_writes)

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

    def readdir(self, path: str) -> Sequence[tuple[str, Attr]]:
        return self.view.readdir(path_to_key(path))

    def readlink(self, path: str) -> str:
        return self.view.readlink(path_to_key(path))

    # == control entries and housekeeping ===========================================================

    def _control_bytes(self, key: str) -> bytes:
        return self.control.content(key)  # (made before the control entries exist)

    def _fresh_files(self, prefix: str) -> Listed | None:
        """The files of ``prefix`` as a fresh cached listing holds them, when it expires, and
        the cached bytes of its probe files at the versions listed; never a request. The
        detector fetches only the probe files listed and not held: every change of this
        mount patches (or drops) the listing before it invalidates the detector
        (:mod:`~n5fs.gateway.commit.committer`), and another writer's change is seen when
        the listing expires."""
        known = self.view.listings.get_until(prefix)
        if known is None:
            return None
        entries, until = known
        held = {}
        for name in PROBE_NAMES:
            info = entries.files.get(name)
            if info is not None:
                data = self.reader.cache.get(prefix + name, version_of(info))
                if data is not None:
                    held[name] = data
        return Listed(entries.files, until, held)

    def _listed_files(self, prefix: str) -> FileMap | None:
        """The files of ``prefix`` as the last listing held them, even past its TTL (what
        the read-ahead fetches: a guess, and every read goes by a live listing); never a LIST.
        A reader of a tree listed longer ago than the TTL still gets the next folder's
        objects fetched ahead while its lookups list that folder again."""
        entries = self.view.listings.peek(prefix)
        return None if entries is None else entries.files

    def _listed_folders(self, prefix: str) -> frozenset[str] | None:
        """The subfolders of ``prefix`` as the last listing held them (as above)."""
        entries = self.view.listings.peek(prefix)
        return None if entries is None else entries.dirs

    def stats(self) -> dict[str, int]:
        return self.control.stats()

    def sweep_leftovers(self) -> int:
        """Remove what dead writers left in the store (temp files, temp archives, multipart
        uploads); called once at mount, in the background. Returns how many were removed."""
        return 0 if self.read_only else self.control.sweep(self.store)

    # == open / read / write / commits =============================================================
    #
    # The calls on a file's content are the file calls' own methods, bound in ``__init__``
    # (:class:`~n5fs.gateway.write.filecalls.FileCalls` documents each): this class adds
    # nothing to them, so it keeps no second layer of methods (and the hot path no extra call).

    open: Callable[[str, int], int]
    create: Callable[..., int]
    read: Callable[[int, int, int], bytes]
    read_fd: Callable[[int, int, int], int | None]
    read_unopened: Callable[[str, int, int], bytes]
    read_fd_unopened: Callable[[str, int, int], int | None]
    page_cache: Callable[[int], PageCache]
    write: Callable[[int, bytes, int], int]
    truncate: Callable[..., None]
    flush: Callable[[int], None]
    fsync: Callable[[int], None]
    release: Callable[[int], None]
    utimens: Callable[[str, float], None]

    @property
    def opens_optional(self) -> bool:
        """May the kernel read files without opening them first? On a read-only mount whose
        store keeps each key in a local file: an open then only proves the file exists (the
        lookup did), and a read by path costs what a read by handle does. Reading 10k small
        files is then two FUSE calls each instead of four."""
        local = self.reader.local
        return self.read_only and local is not None and local.local_folder("") is not None

    # == namespace changes =========================================================================

    def unlink(self, path: str) -> None:
        key = path_to_key(path)
        self.calls.check_mutable(key)
        attr = self.view.stat(key)
        if attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if attr.kind is EntryKind.SYMLINK:
            self.renamer.remove_link(key)
            return
        with self.files.pinned(key) as (node,):
            stored = node.stored
            self.files.detach(key)
            self.calls.failed_creates.forget(key)
            if not stored:
                self.committer.changed([key])
                return
            with self.committer.hold(key):
                self.store.delete(key)
                self.committer.after_delete(key)

    def mkdir(self, path: str) -> None:
        key = path_to_key(path)
        self.calls.check_mutable(key)
        if self.view.lookup(key) is not None:
            raise KeyExists(f"file exists: {path}")
        self.view.note_mkdir(key)

    def rmdir(self, path: str) -> None:
        key = path_to_key(path)
        self.calls.check_mutable(key)
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
        self.calls.check_mutable(src)
        self.calls.check_mutable(dst)
        if not src or not dst:
            raise AccessDenied("cannot rename the mount root")
        attr = self.view.stat(src)
        dst_attr = self.view.lookup(dst)
        if dst_attr is None:
            self.calls.check_ancestors(dst)
        if attr.kind is EntryKind.DIR:
            self.renamer.rename_dir(src, dst, dst_attr)
        elif attr.kind is EntryKind.SYMLINK:
            raise NotSupported("hdmf-zarr links cannot be renamed; remove and link again")
        else:
            self.renamer.rename_file(src, dst, dst_attr)
            self.calls.failed_creates.forget(dst)

    def link(self, src_path: str, dst_path: str) -> None:
        src, dst = path_to_key(src_path), path_to_key(dst_path)
        self.calls.check_mutable(dst)
        if self.view.stat(src).kind is not EntryKind.FILE:
            raise AccessDenied(f"only files can be linked: {src_path}")
        self.renamer.link(src, dst)

    def symlink(self, target: str, path: str) -> None:
        key = path_to_key(path)
        self.calls.check_mutable(key)
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
        """Commit what is still staged, stop every pool (once: the committer drained, so no
        check is wanted any more; read-ahead fetches land first), then make the store durable
        and close it."""
        for node in self.files.all_nodes():
            with node.lock:
                # not a new file whose commit failed: its close() said so (FileCalls.release)
                if node.dirty and not node.unlinked and not node.failed:
                    with contextlib.suppress(Rejected):  # recorded; nothing more at shutdown
                        self.committer.commit_node(node)
        self.committer.close()
        self.reader.close()
        self.workers.shutdown()
        self.calls.unopened.close()
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- convenience for tests and notebooks -----------------------------------------------------

    def write_file(self, path: str, data: bytes) -> None:
        """create + write + close, as ``cp`` does; raises Rejected if the commit is refused."""
        self.calls.write_file(path, data)

    def read_file(self, path: str) -> bytes:
        """open + read + release, as ``cat`` does."""
        return read_whole(self, path)

    def walk_keys(self) -> list[str]:
        return sorted(k.key for k in self.store.list("", delimiter=None).keys)
