"""Open files: one node per key that is open (the staged bytes all its handles share), and the
handle numbers the kernel holds.

State and locks:
- ``OpenFiles._lock`` guards the three tables (key -> node, view name -> view-file node,
  fh -> handle) and every node's ``refs`` and ``key``; it is a leaf lock, held for table work
  only. A view file's node lock ranks before every native node lock: its commit (the view's
  translation) stores native files, taking their node locks inside it.
- ``Node.lock`` guards the node's staged buffer, its ``base`` version and flags (``dirty``, ``stored``,
  ``written``, ``unlinked``, ``failed``) and the stamps its local readers opened (``reading``).
  Everything that changes a node's content (write, truncate, commit, rename of the key)
  holds it; a read takes it only to go through staging. It is taken *before* any
  commit-order lock (:mod:`n5fs.gateway.commit.ordering`) and never while ``OpenFiles._lock`` is
  held.
- A handle's read-ahead window is one immutable value replaced by assignment. A read-only
  handle over a local file holds its own descriptor (:class:`~n5fs.gateway.read.reader.LocalFile`)
  from open to release; a read uses it while the node stages nothing (one unlocked look at
  ``node.staged``: a read that misses a write starting that instant is ordered before it).

Writes never load what they will not use: a node's staging buffer starts from the stored
object lazily (:class:`StoredObject` fetches ranges on demand), and ``O_TRUNC`` or a new file
starts empty; all buffers draw on one :class:`~n5fs.gateway.write.staging.StagingBudget`.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Protocol

from n5fs.errors import KeyNotFound
from n5fs.gateway.namespace.paths import Attr, EntryKind
from n5fs.gateway.read.reader import LocalFile, PageCache, ReadWindow
from n5fs.gateway.write.staging import BaseObject, StagedFile, StagingBudget
from n5fs.kvstore.base import ByteRange
from n5fs.kvstore.keys import parent
from n5fs.locking import (
    LEAF,
    NODE,
    VIEW_NODE,
    acquire_in_order,
    assert_held,
    ranked_lock,
    ranked_rlock,
)

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator

    from n5fs.gateway.read.byte_cache import Stamp
    from n5fs.gateway.read.reader import ObjectReader
    from n5fs.kvstore.base import KvStore


@dataclass(eq=False)
class StoredObject:
    """The stored value a staged file starts from, fetched by range only when needed."""

    store: KvStore
    key: str
    size: int

    def fetch(self, offset: int, length: int) -> bytes:
        data = self.store.get(self.key, ByteRange(offset, length))
        return data if data is not None else b""


class Translator(Protocol):
    """Commits the files written under names a view makes (:mod:`n5fs.views`): what the view's
    writer wrote is staged here like any file, and turned into native keys by the view."""

    def commit(self, key: str, staged: StagedFile) -> bool:
        """Translate ``staged`` (the view file ``key``) and store what it stands for; False when
        ``key`` is a name the view does not translate (a writer's temp file: it stays staged
        until a rename gives it a name). Raises :class:`~n5fs.errors.Rejected` (EINVAL) for
        content the view refuses, recorded in the gateway's rejections."""
        ...


class Readable(Protocol):
    """Content a handle reads that no key holds (a view's documents and translated chunks)."""

    def read(self, size: int, offset: int) -> bytes: ...


@dataclass(eq=False)
class Node:
    """An open file: the staging buffer all handles of one key share."""

    key: str
    staged: StagedFile | None = None
    dirty: bool = False
    stored: bool = True  # False while created but not yet committed
    written: bool = False  # any write or truncate since open/create
    refs: int = 0
    unlinked: bool = False
    #: the last commit of this never-stored file failed (refused, or the store failed) and
    #: nothing was written or created since: the name does not exist (it is not shown, and
    #: ``release`` does not try again: the failed ``close()`` was the caller's answer), but
    #: the staged bytes stay for a descriptor still open on the file, whose next write shows
    #: the name again and whose close commits all of it
    failed: bool = False
    #: a modification time set (``utimens``) while content is staged: the commit applies it
    mtime: float | None = None
    #: the stored version a metadata commit compares with (:mod:`n5fs.gateway.commit.conditional`):
    #: what the mount saw when the node was opened for writing, then what it last wrote
    base: str | None = None
    #: how many open handles read each version of the local file (their stamps)
    reading: dict[Stamp, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=partial(ranked_rlock, "node", NODE))
    #: a file of a view, written under a name the view makes and committed by this translator
    #: instead of the committer (:meth:`OpenFiles.open_translated`)
    translator: Translator | None = None

    @property
    def pending(self) -> bool:
        """Does the node hold content the store does not (yet) have?"""
        return self.staged is not None and (self.dirty or not self.stored) and not self.unlinked

    def pending_attr(self, writable: bool) -> Attr | None:
        """What ``stat`` shows of a file being written; None when the node shows no name of
        its own (nothing staged, or a new file whose commit failed: ``failed``)."""
        staged = self.staged
        if staged is None or not self.pending or self.failed:
            return None
        mtime = time.time() if self.mtime is None else self.mtime
        return Attr(EntryKind.FILE, staged.size, mtime, writable)

    def start_reading(self, stamp: Stamp) -> bool:
        """Count a handle reading ``stamp`` (caller holds the lock); True when another open
        handle reads another version."""
        assert_held(self.lock)
        mixed = any(other != stamp for other in self.reading)
        self.reading[stamp] = self.reading.get(stamp, 0) + 1
        return mixed

    def stop_reading(self, stamp: Stamp) -> None:
        with self.lock:
            left = self.reading.pop(stamp, 1) - 1
            if left > 0:
                self.reading[stamp] = left


@dataclass(eq=False)
class Handle:
    node: Node | None
    flags: int
    control: bytes | None = None
    #: content made for this open (a view's document or translated chunk), no key's bytes
    made: Readable | None = None
    window: ReadWindow = field(default_factory=ReadWindow)
    #: the handle's own descriptor of the stored file (read-only handles, local stores)
    local: LocalFile | None = None
    #: what the kernel was told to do with its cached pages at open
    page_cache: PageCache = PageCache.DROP


@dataclass(frozen=True)
class StagingConfig:
    spill_bytes: int
    tmp_dir: str | None
    max_size: int | None


class OpenFiles:
    def __init__(self, store: KvStore, budget: StagingBudget, config: StagingConfig) -> None:
        self.store = store
        self.budget = budget
        self.config = config
        self._nodes: dict[str, Node] = {}
        #: the nodes of view files, by their view names (a view name may equal a native key)
        self._translated: dict[str, Node] = {}
        self._handles: dict[int, Handle] = {}
        self._fh = itertools.count(1)
        self._lock = ranked_lock("open files", LEAF)

    # -- handles -------------------------------------------------------------------------------

    def add_handle(self, handle: Handle) -> int:
        with self._lock:
            fh = next(self._fh)
            self._handles[fh] = handle
            return fh

    def handle(self, fh: int) -> Handle:
        # every read asks: one dict lookup, atomic without the table lock
        handle = self._handles.get(fh)
        if handle is None:
            raise KeyNotFound(f"stale file handle {fh}")
        return handle

    def pop_handle(self, fh: int) -> Handle | None:
        """Take the handle out of the table; its local descriptor is closed now."""
        with self._lock:
            handle = self._handles.pop(fh, None)
        local = handle.local if handle is not None else None
        if handle is not None and local is not None:
            handle.local = None
            if handle.node is not None:
                handle.node.stop_reading(local.stamp)
            local.close()
        return handle

    def handle_count(self) -> int:
        with self._lock:
            return len(self._handles)

    def reading(
        self,
        key: str,
        flags: int,
        reader: ObjectReader,
        local: LocalFile | None,
        listed: Callable[[], Stamp] | None = None,
    ) -> Handle:
        """A read-only handle of ``key`` holding ``local``, the caller's descriptor of the
        store's local file (None where there is none), and what the kernel does with its
        cached pages (``listed()``, the listing's stamp, stands for the file where there is no
        local one to ``fstat``: required then). A file being written is read through its
        staging."""
        handle = Handle(self.acquire(key), flags)
        node = handle.node
        assert node is not None
        with node.lock:
            if node.staged is not None:  # being written: reads go through the staging
                if local is not None:
                    local.close()
                return handle
            mixed = local is not None and node.start_reading(local.stamp)
            handle.local = local
        if local is not None:
            stamp = local.stamp
        else:
            assert listed is not None, "a handle without a local file needs the listing's stamp"
            stamp = listed()
        handle.page_cache = reader.page_cache(key, stamp, mixed=mixed)
        return handle

    # -- nodes ---------------------------------------------------------------------------------

    def node(self, key: str) -> Node | None:
        with self._lock:
            return self._nodes.get(key)

    def acquire(self, key: str) -> Node:
        """The node of ``key`` with one more reference; a new node assumes the key is stored
        (``create`` says otherwise under the node's lock). Holding a reference pins the key:
        every open, commit, rename and unlink of it shares this node and its lock."""
        with self._lock:
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = Node(key)
            node.refs += 1
            return node

    def acquire_locked(self, key: str) -> Node:
        """Like :meth:`acquire`, with the node's lock held (the caller releases both), and
        still the key's node once locked: a rename or unlink that replaced it while we waited
        for its lock sends us to the new one."""
        return self._lock_current([key])[0]

    def _lock_current(self, keys: list[str]) -> list[Node]:
        """Reference and lock the current nodes of ``keys`` (distinct, sorted)."""
        while True:
            nodes = [self.acquire(key) for key in keys]
            for key, node in zip(keys, nodes, strict=True):
                acquire_in_order(node.lock, key)
            with self._lock:
                current = all(self._nodes.get(k) is n for k, n in zip(keys, nodes, strict=True))
            if current:
                return nodes
            for node in reversed(nodes):
                node.lock.release()
                self.release(node)

    @contextlib.contextmanager
    def pinned(self, *keys: str) -> Iterator[list[Node]]:
        """The nodes of ``keys``, referenced and locked in key order (no lock-order cycle
        between two operations on the same pair of names), released afterwards."""
        order = sorted(set(keys))
        nodes = dict(zip(order, self._lock_current(order), strict=True))
        try:
            yield [nodes[key] for key in keys]
        finally:
            for node in nodes.values():
                node.lock.release()
            for node in nodes.values():
                self.release(node)

    def release(self, node: Node) -> None:
        """Drop one reference; the last one frees the staged bytes."""
        with self._lock:
            node.refs -= 1
            last = node.refs <= 0
            if last and self._nodes.get(node.key) is node:
                del self._nodes[node.key]
        if last:
            with node.lock:
                if node.staged is not None:
                    node.staged.close()
                    node.staged = None

    def detach(self, key: str) -> Node | None:
        """The name is gone (unlink, or replaced by a rename): its open node, if any, lives
        on without a name, as an unlinked file does, and never commits."""
        with self._lock:
            node = self._nodes.pop(key, None)
        if node is not None:
            with node.lock:
                node.unlinked = True
                node.dirty = False
        return node

    def move(self, node: Node, dst: str) -> None:
        """Open handles follow a renamed file to its new name (caller holds ``node.lock``)."""
        assert_held(node.lock)
        with self._lock:
            if self._nodes.get(node.key) is node:
                del self._nodes[node.key]
            node.key = dst
            self._nodes.setdefault(dst, node)

    def pending_children(self, folder: str, writable: bool) -> list[tuple[str, Attr]]:
        """Files created under ``folder`` (a key, ``""`` for the root) not yet committed."""
        with self._lock:
            nodes = [n for k, n in self._nodes.items() if parent(k) == folder and not n.stored]
        out = []
        for node in nodes:
            attr = node.pending_attr(writable)
            if attr is not None:
                out.append((node.key.rsplit("/", 1)[-1], attr))
        return out

    def all_nodes(self) -> list[Node]:
        with self._lock:
            return list(self._nodes.values())

    # -- view files ----------------------------------------------------------------------------

    def open_translated(
        self, key: str, translator: Translator, base: BaseObject | None, *, truncate: bool
    ) -> Node:
        """The node of the view file ``key`` with one more reference, staged (over ``base``,
        what the view shows there now, or empty): a view's writes draw on the same budget and
        spill like any file. A view file's node stays in its table while it holds
        uncommitted bytes, even with no handle open (:meth:`release_translated`)."""
        with self._lock:
            node = self._translated.get(key)
            if node is None:
                lock = ranked_rlock("view file node", VIEW_NODE)
                node = self._translated[key] = Node(key, translator=translator, lock=lock)
            node.refs += 1
        with node.lock:
            if truncate:
                self.empty(node)
                node.dirty = True
            elif node.staged is None:
                node.staged = self._new_staged(base)
                node.dirty = base is None
        return node

    def translated(self, key: str) -> Node | None:
        with self._lock:
            return self._translated.get(key)

    def translated_children(self, folder: str) -> list[tuple[str, Attr]]:
        """The view files staged in ``folder``, with their staged sizes."""
        with self._lock:
            nodes = [n for k, n in self._translated.items() if parent(k) == folder]
        out = []
        for node in nodes:
            staged = node.staged
            if staged is not None:
                out.append((node.key.rsplit("/", 1)[-1], Attr(EntryKind.FILE, staged.size)))
        return out

    def release_translated(self, node: Node) -> None:
        """Drop one reference; with none left, a view file that holds nothing uncommitted
        leaves the table and gives its staged bytes back."""
        with self._lock:
            node.refs -= 1
        with node.lock:
            if node.refs <= 0 and not (node.dirty and node.staged is not None):
                self.drop_translated(node)

    def drop_translated(self, node: Node) -> None:
        """The view file is gone (committed with no handle left, refused, unlinked, or
        replaced by a rename; caller holds ``node.lock``): out of the table, its staged bytes
        given back. A handle still open on it reads ENOENT."""
        with self._lock:
            if self._translated.get(node.key) is node:
                del self._translated[node.key]
        node.dirty = False
        if node.staged is not None:
            node.staged.close()
            node.staged = None

    def move_translated(self, node: Node, dst: str) -> Node | None:
        """The view file moves to ``dst`` (caller holds ``node.lock``); returns the node that
        had that name (the caller drops it under its own lock), if another did."""
        with self._lock:
            if self._translated.get(node.key) is node:
                del self._translated[node.key]
            replaced = self._translated.get(dst)
            node.key = dst
            self._translated[dst] = node
        return replaced if replaced is not node else None

    # -- staging -------------------------------------------------------------------------------

    def staged(self, node: Node, size: int | None) -> StagedFile:
        """The node's staging buffer (caller holds ``node.lock``): empty for a new file, else
        copy-on-write over the stored object of ``size`` bytes, fetched lazily."""
        assert_held(node.lock)
        if node.staged is None:
            base = None
            if node.stored and size and node.translator is None:
                base = StoredObject(self.store, node.key, size)
            node.staged = self._new_staged(base)
        return node.staged

    def _new_staged(self, base: BaseObject | None) -> StagedFile:
        return StagedFile(
            base,
            budget=self.budget,
            spill_bytes=self.config.spill_bytes,
            tmp_dir=self.config.tmp_dir,
            max_size=self.config.max_size,
        )

    def drop_staged(self, node: Node) -> None:
        """Forget what the node stages (caller holds its lock): its content is the stored
        object's again, read lazily by the next write."""
        assert_held(node.lock)
        if node.staged is not None:
            node.staged.close()
            node.staged = None
        node.stored = True
        node.dirty = node.failed = False
        node.mtime = None

    def empty(self, node: Node) -> StagedFile:
        """A fresh, empty staging buffer for the node (``O_TRUNC``; caller holds the lock):
        nothing of the stored object is ever fetched."""
        assert_held(node.lock)
        if node.staged is not None:
            node.staged.close()
            node.staged = None
        return self.staged(node, 0)


class FailedCreates:
    """Names whose first commit (a new file) failed, for any reason (refused by the commit
    rules, the store full, failing or answering a conflict), most recent ``limit`` of them.

    After a failed ``close()`` the kernel may still hold the entry the ``create`` made (libfuse
    can drop its attributes, not the name); the caller's retried ``open(O_CREAT)`` then
    reaches us as a plain ``open`` of a name that does not exist, and ``FileCalls.open`` serves
    it as a create. A name is forgotten when a commit stores it, or it is unlinked or renamed
    over. Own lock, a leaf.
    """

    def __init__(self, limit: int = 1024) -> None:
        self._names: OrderedDict[str, None] = OrderedDict()
        self._limit = limit
        self._lock = ranked_lock("failed creates", LEAF)

    def remember(self, key: str) -> None:
        with self._lock:
            self._names[key] = None
            self._names.move_to_end(key)
            while len(self._names) > self._limit:
                self._names.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._names.pop(key, None)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._names
