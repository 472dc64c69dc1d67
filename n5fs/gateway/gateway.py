"""The gateway: a POSIX-shaped Python API over a KvStore that validates every commit.

Writes are staged per open file and committed at ``flush`` (every close), ``fsync``,
``rename`` and ``link``. A commit classifies the key under its folder's format, validates it
(strict mode refuses, warn mode records, off mode trusts) and stores it with one atomic
``set``. Listings answer every lookup in a folder until the TTL (the chunk stat storm),
patched in place by the mount's own commits; small objects are kept in a byte-bounded LRU,
large ones are read by range with read-ahead. No FUSE in here: tests drive it directly.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cache, partial
from typing import TYPE_CHECKING

from n5fs.detect import Detector
from n5fs.errors import (
    AccessDenied,
    DetectionFailed,
    InvalidKey,
    IsAPrefix,
    KeyExists,
    KeyNotFound,
    NotAPrefix,
    NotSupported,
    PrefixNotEmpty,
    ReadOnly,
    Rejected,
)
from n5fs.formats.registry import METADATA_NAMES
from n5fs.gateway.cache import TTLCache
from n5fs.gateway.commit import CommitRules, Mode, Rejection
from n5fs.gateway.consolidated import ConsolidatedKeeper
from n5fs.gateway.links import add_link, links_of, remove_link
from n5fs.gateway.namespace import (
    CONTROL,
    CONTROL_FILES,
    Attr,
    DirEntries,
    EntryKind,
    is_control,
    path_to_key,
)
from n5fs.gateway.reader import ObjectReader, ReadWindow
from n5fs.gateway.staging import StagedFile
from n5fs.kvstore.base import KeyInfo, KvStore
from n5fs.kvstore.keys import basename, dir_prefix, parent

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Self

log = logging.getLogger(__name__)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


@dataclass
class GatewayConfig:
    validate: str = "strict"
    read_only: bool = False
    #: bytes of object data kept in memory (the LRU); read-ahead windows come on top
    cache_bytes: int = 256 << 20
    #: seconds a listing, stat or detection answer is trusted (others may write the store)
    ttl: float = 5.0
    #: staged writes past this size spill to a temp file
    spill_bytes: int = 64 << 20
    tmp_dir: str | None = None
    #: objects up to this size are fetched whole (and cached); larger ones by range. Chunks
    #: are read whole by every reader, and a 4 MiB chunk plus its header must not become a
    #: series of ranged GETs on S3.
    small_object: int = 16 << 20
    readahead: int = 8 << 20
    max_rejections: int = 10_000


@dataclass(eq=False)
class _Node:
    """An open file: the staging buffer all handles of one key share."""

    key: str
    staged: StagedFile | None = None
    dirty: bool = False
    stored: bool = True  # False while created but not yet committed
    written: bool = False  # any write or truncate since open/create
    refs: int = 0
    unlinked: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)


@dataclass(eq=False)
class _Handle:
    node: _Node | None
    flags: int
    control: bytes | None = None
    window: ReadWindow = field(default_factory=ReadWindow)


class Gateway:
    def __init__(
        self,
        store: KvStore,
        config: GatewayConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = config or GatewayConfig()
        self.mode = Mode(self.config.validate)
        self.read_only = self.config.read_only or not store.writable
        self.detector = Detector(store, ttl=self.config.ttl, clock=clock)
        self.rules = CommitRules(store, self.detector)
        self._listings: TTLCache[DirEntries] = TTLCache(self.config.ttl, clock=clock)
        self._reader = ObjectReader(
            store,
            cache_bytes=self.config.cache_bytes,
            small_object=self.config.small_object,
            readahead=self.config.readahead,
        )
        self._bytes = self._reader.cache
        self._consolidated = ConsolidatedKeeper(store, self._exists, self._note_set_bytes)
        self._nodes: dict[str, _Node] = {}
        self._handles: dict[int, _Handle] = {}
        self._vdirs: set[str] = set()
        self._fh = itertools.count(1)
        self._lock = threading.RLock()
        self.rejections: deque[Rejection] = deque(maxlen=self.config.max_rejections)
        self.counters: dict[str, int] = dict.fromkeys(("commits", "rejections", "bytes_in"), 0)

    # == namespace ==================================================================================

    def _entries(self, prefix: str) -> DirEntries:
        entries = self._listings.get(prefix)
        if entries is None:
            entries = DirEntries.from_listing(prefix, self.store.list(prefix))
            self._listings.put(prefix, entries)
        return entries

    def _exists(self, key: str) -> bool:
        return basename(key) in self._entries(dir_prefix(parent(key))).files

    def _writable(self) -> bool:
        return not self.read_only

    def stat(self, path: str) -> Attr:
        key = path_to_key(path)
        if not key:
            return Attr(EntryKind.DIR, mtime=0.0, writable=self._writable())
        if is_control(key):
            return self._control_attr(key)
        node = self._nodes.get(key)
        if node is not None and (node.dirty or not node.stored) and node.staged is not None:
            return Attr(EntryKind.FILE, node.staged.size, time.time(), self._writable())
        if key in self._vdirs:
            return Attr(EntryKind.DIR, writable=self._writable())
        folder, name = dir_prefix(parent(key)), basename(key)
        entries = self._entries(folder)
        if name in entries.dirs:
            return Attr(EntryKind.DIR, writable=self._writable())
        info = entries.files.get(name)
        if info is not None:
            return Attr(EntryKind.FILE, info.size, info.mtime, self._writable())
        target = self._links(folder).get(name)
        if target is not None:
            return Attr(EntryKind.SYMLINK, len(target), writable=self._writable())
        raise KeyNotFound(f"no such file or directory: {path}")

    def lookup(self, path: str) -> Attr | None:
        """Like stat, but None when absent."""
        try:
            return self.stat(path)
        except KeyNotFound:
            return None

    def _must_not_exist(self, path: str) -> None:
        if self.lookup(path) is not None:
            raise KeyExists(f"file exists: {path}")

    def readdir(self, path: str) -> list[tuple[str, Attr]]:
        key = path_to_key(path)
        if is_control(key):
            if key != CONTROL:
                raise NotAPrefix(path)
            return [(name, self._control_attr(f"{CONTROL}/{name}")) for name in CONTROL_FILES]
        if self.stat(path).kind is not EntryKind.DIR:
            raise NotAPrefix(f"not a directory: {path}")
        prefix = dir_prefix(key)
        entries = self._entries(prefix)
        writable = self._writable()
        out: dict[str, Attr] = {}
        for name, info in entries.files.items():
            out[name] = Attr(EntryKind.FILE, info.size, info.mtime, writable)
        for name, target in self._links(prefix).items():
            out.setdefault(name, Attr(EntryKind.SYMLINK, len(target), writable=writable))
        with self._lock:
            pending = [n for k, n in self._nodes.items() if parent(k) == key and not n.stored]
            vdirs = [v for v in self._vdirs if parent(v) == key]
        for node in pending:
            if node.staged is not None and not node.unlinked:
                out[basename(node.key)] = Attr(
                    EntryKind.FILE, node.staged.size, time.time(), writable
                )
        for name in itertools.chain(entries.dirs, (basename(v) for v in vdirs)):
            out[name] = Attr(EntryKind.DIR, writable=writable)
        if not key:
            out[CONTROL] = Attr(EntryKind.DIR, writable=False)
        return sorted(out.items())

    def _links(self, prefix: str) -> dict[str, str]:
        """hdmf-zarr links of the group at ``prefix``: name -> symlink text."""
        try:
            return links_of(self.detector.folder(prefix))
        except (DetectionFailed, Rejected):
            return {}  # a broken folder has no links to show

    def readlink(self, path: str) -> str:
        key = path_to_key(path)
        target = self._links(dir_prefix(parent(key))).get(basename(key))
        if target is None:
            raise KeyNotFound(f"not a symlink: {path}")
        return target

    # == control entries ===========================================================================

    def _control_bytes(self, key: str) -> bytes:
        name = key.removeprefix(CONTROL + "/")
        if name == "rejections":
            return "".join(r.to_json_line() + "\n" for r in list(self.rejections)).encode()
        if name == "stats.json":
            return (json.dumps(self.stats(), indent=2, sort_keys=True) + "\n").encode()
        raise KeyNotFound(f"/{key}")

    def _control_attr(self, key: str) -> Attr:
        if key == CONTROL:
            return Attr(EntryKind.DIR, writable=False)
        return Attr(EntryKind.FILE, len(self._control_bytes(key)), time.time(), writable=False)

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            "listing_hits": self._listings.hits,
            "listing_misses": self._listings.misses,
            "store_reads": self._reader.store_reads,
            "bytes_out": self._reader.bytes_out,
            "cache_hits": self._bytes.hits,
            "cache_misses": self._bytes.misses,
            "cache_bytes": self._bytes.size,
            "open_handles": len(self._handles),
        }

    # == open / read / write =======================================================================

    def _check_mutable(self, key: str) -> None:
        if is_control(key):
            raise AccessDenied(f"/{key} is a read-only control entry of n5fs")
        if self.read_only:
            raise ReadOnly(f"read-only mount: cannot change /{key}")

    def _new_handle(self, handle: _Handle) -> int:
        with self._lock:
            fh = next(self._fh)
            self._handles[fh] = handle
            return fh

    def _handle(self, fh: int) -> _Handle:
        try:
            return self._handles[fh]
        except KeyError:
            raise KeyNotFound(f"stale file handle {fh}") from None

    def _acquire(self, key: str, *, stored: bool) -> _Node:
        with self._lock:
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = _Node(key, stored=stored)
            node.refs += 1
            return node

    def open(self, path: str, flags: int) -> int:
        key = path_to_key(path)
        if is_control(key):
            if flags & (_WRITE_FLAGS | os.O_TRUNC):
                raise AccessDenied(f"{path} is a read-only control entry of n5fs")
            return self._new_handle(_Handle(None, flags, control=self._control_bytes(key)))
        if flags & (_WRITE_FLAGS | os.O_TRUNC):
            self._check_mutable(key)
        attr = self.stat(path)
        if attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        node = self._acquire(key, stored=True)
        if flags & os.O_TRUNC:
            with node.lock:
                self._staged(node).truncate(0)
                node.dirty = True
        return self._new_handle(_Handle(node, flags))

    def create(self, path: str, flags: int = os.O_WRONLY) -> int:
        """A new file (parents are implied, as keys imply prefixes; the kernel has checked
        them on a mount)."""
        key = path_to_key(path)
        self._check_mutable(key)
        attr = self.lookup(path)
        if attr is not None:
            if flags & os.O_EXCL:
                raise KeyExists(f"file exists: {path}")
            if attr.kind is EntryKind.DIR:
                raise IsAPrefix(f"is a directory: {path}")
        if attr is None:
            self._check_ancestors(key)
        node = self._acquire(key, stored=attr is not None)
        with node.lock:
            node.unlinked = False
            staged = self._staged(node)
            if attr is None or flags & os.O_TRUNC:
                staged.truncate(0)
            node.dirty = True
        return self._new_handle(_Handle(node, flags))

    def _check_ancestors(self, key: str) -> None:
        """No file may sit where a new key needs a directory (ENOTDIR, as POSIX says)."""
        folder = parent(key)
        while folder:
            try:
                kind = self.stat("/" + folder).kind
            except KeyNotFound:
                folder = parent(folder)
                continue
            if kind is not EntryKind.DIR:
                raise NotAPrefix(f"not a directory: /{folder}")
            return

    def _staged(self, node: _Node) -> StagedFile:
        """The node's staging buffer, loaded from the store on first use (copy on write)."""
        if node.staged is None:
            initial = b""
            if node.stored:
                data = self._reader.whole(node.key)
                initial = data if data is not None else b""
            node.staged = StagedFile(
                initial, spill_bytes=self.config.spill_bytes, tmp_dir=self.config.tmp_dir
            )
        return node.staged

    def read(self, fh: int, size: int, offset: int) -> bytes:
        handle = self._handle(fh)
        if handle.control is not None:
            return handle.control[offset : offset + size]
        node = handle.node
        assert node is not None
        with node.lock:
            if node.staged is not None:
                return node.staged.read(size, offset)
        return self._reader.read(handle.window, node.key, size, offset, self._size_of(node.key))

    def write(self, fh: int, data: bytes, offset: int) -> int:
        handle = self._handle(fh)
        node = handle.node
        if node is None:
            raise AccessDenied("control entries are read-only")
        self._check_mutable(node.key)
        with node.lock:
            written = self._staged(node).write(data, offset)
            node.dirty = node.written = True
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        """With a handle, or while a writer holds unflushed data: staged, committed at its
        flush. Otherwise (``truncate(1)``): committed now, like any other change."""
        key = path_to_key(path)
        self._check_mutable(key)
        node = self._handle(fh).node if fh is not None else self._nodes.get(key)
        if node is not None and (fh is not None or node.dirty):
            with node.lock:
                self._staged(node).truncate(length)
                node.dirty = node.written = True
            return
        if self.stat(path).kind is not EntryKind.FILE:
            raise IsAPrefix(f"is a directory: {path}")
        node = self._acquire(key, stored=True)
        try:
            with node.lock:
                self._staged(node).truncate(length)
                node.dirty = node.written = True
                self._commit(node)
        finally:
            self._release_node(node)

    # -- reads from the store --------------------------------------------------------------------

    def _size_of(self, key: str) -> int | None:
        info = self._entries(dir_prefix(parent(key))).files.get(basename(key))
        return info.size if info is not None else None

    # == commits ===================================================================================

    def flush(self, fh: int) -> None:
        node = self._handle(fh).node
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
        with self._lock:
            handle = self._handles.pop(fh, None)
        if handle is None or handle.node is None:
            return
        node = handle.node
        try:
            with node.lock:
                if node.dirty and not node.unlinked and node.refs == 1:
                    self._commit(node)  # the kernel always flushes first; this is a safety net
        except Rejected:
            pass  # recorded by _commit; release() cannot report it
        finally:
            self._release_node(node)

    def _release_node(self, node: _Node) -> None:
        with self._lock:
            node.refs -= 1
            if node.refs <= 0:
                if self._nodes.get(node.key) is node:
                    del self._nodes[node.key]
                if node.staged is not None:
                    node.staged.close()

    def _reject(self, key: str, exc: Rejected, *, stored: bool) -> None:
        self.counters["rejections"] += 1
        self.rejections.append(Rejection.of(key, exc, stored=stored))
        log.warning("%s /%s: %s", "stored despite" if stored else "refused", key, exc)

    def _validate(self, key: str, load: Callable[[], bytes]) -> None:
        """Run the commit rules per mode; strict raises Rejected (EINVAL at the caller)."""
        if self.mode is Mode.OFF:
            return
        try:
            self.rules.check(key, load)
        except Rejected as exc:
            self._reject(key, exc, stored=self.mode is Mode.WARN)
            if self.mode is Mode.STRICT:
                raise

    def _commit(self, node: _Node) -> None:
        """Validate and store the node's staged bytes; on refusal the store keeps its value
        and the staged bytes are dropped (the next read sees the stored value)."""
        staged = node.staged
        assert staged is not None
        key = node.key
        load = cache(staged.getvalue)  # one copy, shared by validation and the store
        try:
            self._validate(key, load)
        except Rejected:
            node.dirty = False
            staged.close()
            node.staged = None
            raise
        spilled = staged.spill_path()
        if spilled is not None:
            self.store.put_file(key, spilled)
            self._after_set(key, staged.size, None)
        else:
            data = load()
            self.store.set(key, data)
            self._after_set(key, len(data), data)
        node.dirty = False
        node.stored = True

    def _after_set(self, key: str, size: int, data: bytes | None) -> None:
        self.counters["commits"] += 1
        self.counters["bytes_in"] += size
        self._note_set(key, size)
        if data is not None:
            self._bytes.put(key, data)
        else:
            self._bytes.invalidate(key)
        self.detector.invalidate(key)
        if self.mode is not Mode.OFF and basename(key) in METADATA_NAMES:
            if data is None:
                data = self.store.get(key)
            self._consolidated.after_change(key, data)

    def _note_set_bytes(self, key: str, data: bytes) -> None:
        self._note_set(key, len(data))
        self._bytes.put(key, data)
        self.detector.invalidate(key)

    def _note_set(self, key: str, size: int) -> None:
        """Patch cached listings: the key is a file, and each ancestor holds a directory."""
        info = KeyInfo(key, size, time.time())
        name = basename(key)
        self._listings.update(
            dir_prefix(parent(key)), partial(DirEntries.add_file, name=name, info=info)
        )
        child = parent(key)
        while child:
            add = partial(DirEntries.add_dir, name=basename(child))
            self._listings.update(dir_prefix(parent(child)), add)
            with self._lock:
                self._vdirs.discard(child)
            child = parent(child)

    def _note_delete(self, key: str) -> None:
        name = basename(key)
        folder = parent(key)
        self._listings.update(dir_prefix(folder), partial(DirEntries.remove_file, name=name))
        self._bytes.invalidate(key)
        self.detector.invalidate(key)
        if folder and not self.store.empty_prefixes:
            with self._lock:  # keep the directory visible: `rm d/f; rmdir d` must work
                self._vdirs.add(folder)

    # == namespace changes =========================================================================

    def unlink(self, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        attr = self.stat(path)
        if attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if attr.kind is EntryKind.SYMLINK:
            self._remove_link(key)
            return
        with self._lock:
            node = self._nodes.pop(key, None)
        if node is not None:
            node.unlinked = True
            node.dirty = False
            if not node.stored:
                return
        self.store.delete(key)
        self._note_delete(key)
        if self.mode is not Mode.OFF and basename(key) in METADATA_NAMES:
            self._consolidated.after_change(key, None)

    def mkdir(self, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        self._must_not_exist(path)
        if self.store.make_prefix(key):
            name = basename(key)
            self._listings.update(dir_prefix(parent(key)), partial(DirEntries.add_dir, name=name))
        else:
            with self._lock:
                self._vdirs.add(key)

    def rmdir(self, path: str) -> None:
        key = path_to_key(path)
        self._check_mutable(key)
        if not key:
            raise AccessDenied("cannot remove the mount root")
        if self.stat(path).kind is not EntryKind.DIR:
            raise NotAPrefix(f"not a directory: {path}")
        if self.readdir(path):
            raise PrefixNotEmpty(f"directory not empty: {path}")
        with self._lock:
            self._vdirs.discard(key)
        self.store.remove_prefix(key)
        name = basename(key)
        self._listings.update(dir_prefix(parent(key)), partial(DirEntries.remove_dir, name=name))
        self._listings.invalidate(dir_prefix(key))

    def _content(self, key: str) -> bytes:
        node = self._nodes.get(key)
        if node is not None and node.staged is not None and (node.dirty or not node.stored):
            return node.staged.getvalue()
        data = self._reader.whole(key)
        if data is None:
            raise KeyNotFound(f"/{key}")
        return data

    def rename(self, old: str, new: str) -> None:
        src, dst = path_to_key(old), path_to_key(new)
        self._check_mutable(src)
        self._check_mutable(dst)
        if not src or not dst:
            raise AccessDenied("cannot rename the mount root")
        attr = self.stat(old)
        dst_attr = self.lookup(new)
        if dst_attr is None:
            self._check_ancestors(dst)
        if attr.kind is EntryKind.DIR:
            self._rename_dir(src, dst, dst_attr)
        elif attr.kind is EntryKind.SYMLINK:
            raise NotSupported("hdmf-zarr links cannot be renamed; remove and link again")
        else:
            if dst_attr is not None and dst_attr.kind is EntryKind.DIR:
                raise IsAPrefix(f"is a directory: {new}")
            self._rename_file(src, dst)

    def _rename_file(self, src: str, dst: str) -> None:
        if src == dst:
            return
        node = self._nodes.get(src)
        pending = node is not None and node.staged is not None and (node.dirty or not node.stored)
        self._validate(dst, partial(self._content, src))
        data: bytes | None
        if pending:
            assert node is not None
            assert node.staged is not None
            data = node.staged.getvalue()
            self.store.set(dst, data)
            if node.stored:
                self.store.delete(src)
        else:
            data = self._bytes.get(src)
            self.store.rename(src, dst)
        with self._lock:
            if node is not None:  # open handles follow the file to its new name
                self._nodes.pop(src, None)
                node.key, node.dirty, node.stored = dst, False, True
                self._nodes.setdefault(dst, node)
        self._note_delete(src)
        self._after_set(dst, len(data) if data is not None else self._size_after(dst), data)
        if self.mode is not Mode.OFF and basename(src) in METADATA_NAMES:
            self._consolidated.after_change(src, None)

    def _size_after(self, key: str) -> int:
        info = self.store.stat(key)
        return info.size if info is not None else 0

    def _rename_dir(self, src: str, dst: str, dst_attr: Attr | None) -> None:
        if dst == src or dst.startswith(src + "/"):
            raise InvalidKey(dst, "cannot move a directory into itself")
        if dst_attr is not None:
            if dst_attr.kind is not EntryKind.DIR:
                raise NotAPrefix(f"not a directory: /{dst}")
            if self.readdir("/" + dst):
                raise PrefixNotEmpty(f"directory not empty: /{dst}")
        keys = [info.key for info in self.store.list(src + "/", delimiter=None).keys]
        moves = [(key, dst + key[len(src) :]) for key in keys]
        destination = self.detector.folder(dir_prefix(parent(dst)))
        if destination.array is not None or destination.array_prefix is not None:
            for old_key, new_key in moves:  # moving into an array: every file is a chunk there
                self._validate(new_key, partial(self._content, old_key))
        if dst_attr is not None and self.store.empty_prefixes:
            self.store.remove_prefix(dst)  # an empty folder is replaced, as rename(2) does
        self.store.rename_prefix(src + "/", dst + "/")
        with self._lock:
            self._vdirs = {
                dst + v[len(src) :] if v == src or v.startswith(src + "/") else v
                for v in self._vdirs
            }
            if not moves and not self.store.empty_prefixes:
                self._vdirs.add(dst)
        self._listings.clear()
        self._bytes.invalidate_prefix(src + "/")
        self.detector.clear()
        if self.mode is not Mode.OFF:
            for old_key, new_key in moves:
                if basename(old_key) in METADATA_NAMES:
                    self._consolidated.after_change(old_key, None)
                    self._consolidated.after_change(new_key, self.store.get(new_key))

    def link(self, src_path: str, dst_path: str) -> None:
        """A hard link is a validated copy: zarr-python links its temp file to the final name
        for an exclusive create, then unlinks the temp."""
        src, dst = path_to_key(src_path), path_to_key(dst_path)
        self._check_mutable(dst)
        if self.stat(src_path).kind is not EntryKind.FILE:
            raise AccessDenied(f"only files can be linked: {src_path}")
        self._must_not_exist(dst_path)
        data = self._content(src)
        self._validate(dst, lambda: data)
        self.store.set(dst, data)
        self._after_set(dst, len(data), data)

    def symlink(self, target: str, path: str) -> None:
        """Inside an hdmf-zarr group, a symlink becomes a ``zarr_link`` entry of its .zattrs."""
        key = path_to_key(path)
        self._check_mutable(key)
        folder = self.detector.folder(dir_prefix(parent(key)))
        attrs_key, data = add_link(folder, basename(key), target)
        self._must_not_exist(path)
        self._commit_bytes(attrs_key, data)

    def _remove_link(self, key: str) -> None:
        folder = self.detector.folder(dir_prefix(parent(key)))
        self._commit_bytes(*remove_link(folder, basename(key)))

    def _commit_bytes(self, key: str, data: bytes) -> None:
        self._validate(key, lambda: data)
        self.store.set(key, data)
        self._after_set(key, len(data), data)

    # == filesystem ================================================================================

    def statfs(self) -> dict[str, int]:
        root = getattr(self.store, "root", None)
        if root is not None and os.path.isdir(root):
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

    def drop_caches(self) -> None:
        """Forget everything cached about the store (SIGHUP; someone else changed it)."""
        self._listings.clear()
        self._bytes.clear()
        self.detector.clear()
        self.store.refresh()

    def close(self) -> None:
        """Commit what is still staged, then make the store durable and close it."""
        with self._lock:
            nodes = list(self._nodes.values())
        for node in nodes:
            with node.lock:
                if node.dirty and not node.unlinked:
                    with contextlib.suppress(Rejected):  # recorded; nothing more at shutdown
                        self._commit(node)
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
