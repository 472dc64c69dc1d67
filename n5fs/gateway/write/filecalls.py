"""The POSIX calls on a file's content: open, create, read, write, truncate, flush, fsync,
release and utimens, from the handle the kernel holds to the commit at close.

Why apart from the façade (:mod:`~n5fs.gateway.gateway`): these calls share one life cycle,
a node staged from ``open``/``create`` through ``write`` and ``truncate`` to the commit at
``flush``/``release``, and the rules that go with it (``O_TRUNC`` starts empty, a created
file that nothing was written to is committed at release and its ``close()`` answers what that
commit would, a new name whose commit failed is gone at once and answers a retried ``open``
as a create). The façade keeps the namespace (stat, readdir, mkdir, unlink, rename)
and the mount's housekeeping, and asks this module whether a name may change
(:meth:`FileCalls.check_mutable`) and whether a new name has folders above it
(:meth:`FileCalls.check_ancestors`).

State and locks: the only state of its own is :attr:`FileCalls.failed_creates`
(:class:`~n5fs.gateway.write.handles.FailedCreates`, own leaf lock) and :attr:`FileCalls.unopened`
(:class:`~n5fs.gateway.read.unopened.UnopenedReads`, own leaf lock). Everything else belongs to
its owners: nodes and handles to :class:`~n5fs.gateway.write.handles.OpenFiles` (a node's lock is
held here around every change of its staged content and around its commit, and taken before any
commit-order lock), listings to :class:`~n5fs.gateway.namespace.listings.NamespaceView`, bytes to
:class:`~n5fs.gateway.read.reader.ObjectReader`, commits to
:class:`~n5fs.gateway.commit.committer.Committer`. The lock order of the whole gateway is in
:mod:`~n5fs.gateway.gateway`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from n5fs.errors import (
    AccessDenied,
    IsAPrefix,
    KeyExists,
    KeyNotFound,
    NotAPrefix,
    NothingWritten,
    ReadOnly,
    Rejected,
)
from n5fs.gateway.namespace.paths import EntryKind, is_control, path_to_key
from n5fs.gateway.read.byte_cache import stamp_of, version_of
from n5fs.gateway.read.reader import PageCache
from n5fs.gateway.read.unopened import UnopenedReads
from n5fs.gateway.write.handles import FailedCreates, Handle, Node
from n5fs.kvstore.abilities import write_back
from n5fs.kvstore.keys import basename, parent
from n5fs.kvstore.tempnames import is_partial
from n5fs.locking import assert_held

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.gateway.commit.committer import Committer
    from n5fs.gateway.namespace.listings import NamespaceView
    from n5fs.gateway.namespace.paths import Attr
    from n5fs.gateway.read.byte_cache import Stamp
    from n5fs.gateway.read.reader import ObjectReader
    from n5fs.gateway.write.handles import OpenFiles, Readable, Translator
    from n5fs.gateway.write.staging import BaseObject
    from n5fs.kvstore.base import KvStore

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


class Reads(Protocol):
    """What :func:`read_whole` needs: the gateway's file calls, or a view's."""

    def open(self, path: str, flags: int) -> int: ...
    def read(self, fh: int, size: int, offset: int) -> bytes: ...
    def release(self, fh: int) -> None: ...


def read_whole(calls: Reads, path: str) -> bytes:
    """open + read to the end + release, as ``cat`` does (tests, notebooks, and views that
    read a whole document through the gateway)."""
    fh = calls.open(path, os.O_RDONLY)
    try:
        out = bytearray()
        while chunk := calls.read(fh, 1 << 20, len(out)):
            out += chunk
        return bytes(out)
    finally:
        calls.release(fh)


class FileCalls:
    """The file-content calls of one gateway (module docstring); ``control(key)`` renders a
    control entry of ``/.n5fs/`` when it is opened."""

    def __init__(
        self,
        store: KvStore,
        view: NamespaceView,
        files: OpenFiles,
        reader: ObjectReader,
        committer: Committer,
        *,
        control: Callable[[str], bytes],
        read_only: bool,
    ) -> None:
        self._store = store
        self.view = view
        self.files = files
        self.reader = reader
        self.committer = committer
        self._control = control
        self.read_only = read_only
        self.failed_creates = FailedCreates()
        self.unopened = UnopenedReads(reader)

    def check_mutable(self, key: str) -> None:
        if is_control(key):
            raise AccessDenied(f"/{key} is a read-only control entry of n5fs")
        if self.read_only:
            raise ReadOnly(f"read-only mount: cannot change /{key}")

    def open(self, path: str, flags: int) -> int:
        key = path_to_key(path)
        if is_control(key):
            if flags & (_WRITE_FLAGS | os.O_TRUNC):
                raise AccessDenied(f"{path} is a read-only control entry of n5fs")
            control = self._control(key)  # its size changes between reads: no pages
            return self.files.add_handle(
                Handle(None, flags, control=control, page_cache=PageCache.BYPASS)
            )
        writing = bool(flags & (_WRITE_FLAGS | os.O_TRUNC))
        if not writing:
            return self._open_reading(key, path, flags)
        self.check_mutable(key)
        self.reader.forget_pages(key)  # what it writes reaches the kernel's pages first
        attr = self.view.lookup(key)
        if attr is None:
            if key in self.failed_creates:
                # The kernel still holds the entry our failed create made; the caller's
                # open(O_CREAT) arrives as open(): create it again.
                return self.create(path, flags)
            raise KeyNotFound(f"no such file or directory: {path}")
        if attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        base = self.committer.base_of(key)
        node = self.files.acquire_locked(key)
        try:
            if node.failed:
                # our create of this name failed and another writer's file has it now (a
                # lost conflict): that stored file is what this handle opens
                self.files.drop_staged(node)
            if not node.pending:
                node.base = base  # the version a metadata commit compares with
            if not flags & os.O_TRUNC:
                return self.files.add_handle(Handle(node, flags))
            self.files.empty(node)
            node.dirty = True
        finally:
            node.lock.release()
        return self.files.add_handle(Handle(node, flags))

    def open_translated(
        self, key: str, flags: int, translator: Translator, base: BaseObject | None
    ) -> int:
        """A handle writing the view file ``key`` (a name a view makes, not a store key):
        staged over ``base`` (what the view shows there; None: a new file), empty with
        ``O_TRUNC``, and committed by ``translator`` at flush, release or rename, where a
        native file is committed by the committer. The handle is an ordinary one: read, write,
        truncate, flush and release take it like any other."""
        self.check_mutable(key)
        node = self.files.open_translated(key, translator, base, truncate=bool(flags & os.O_TRUNC))
        return self.files.add_handle(Handle(node, flags))

    def open_made(self, content: Readable, page_cache: PageCache) -> int:
        """A read-only handle of content made for this open (a view's document or translated
        chunk), numbered with every other handle."""
        return self.files.add_handle(Handle(None, os.O_RDONLY, made=content, page_cache=page_cache))

    def store_file(self, path: str, data: bytes) -> None:
        """``path`` made to hold ``data``, as create + write + close would, for content that
        is in memory already (a view's translated chunk): validated and stored as one commit,
        without staging a copy of it. A name being written through a handle meanwhile goes
        the ordinary way, so its writer's node sees the same truncate a create would give.
        Raises :class:`~n5fs.errors.Rejected` if the commit is refused (recorded)."""
        key = path_to_key(path)
        self.check_mutable(key)
        self.reader.forget_pages(key)
        with self.files.pinned(key) as (node,):
            if node.staged is None:
                attr = self.view.lookup(key)
                if attr is not None and attr.kind is EntryKind.DIR:
                    raise IsAPrefix(f"is a directory: {path}")
                if attr is None:
                    self.check_ancestors(key)
                self.committer.commit_bytes(key, data, self.committer.base_of(key))
                self.failed_creates.forget(key)
                return
        self.write_file(path, data)

    def write_file(self, path: str, data: bytes) -> None:
        """create + write + close, as ``cp`` does (staged like any write); raises
        :class:`~n5fs.errors.Rejected` if the commit is refused."""
        fh = self.create(path, os.O_WRONLY | os.O_TRUNC)
        try:
            self.write(fh, data, 0)
            self.flush(fh)
        finally:
            self.release(fh)

    def _open_reading(self, key: str, path: str, flags: int) -> int:
        """A read-only open. Where the store keeps the key in a local file, that file's own
        descriptor (opened and ``fstat``-ed as a regular file, no link out of the root)
        proves the key a file: no lookup first, which on a local disk costs as much again
        (reading 10k small files is five FUSE calls each). Otherwise, and for a writer's
        temp name, the namespace decides and words the error."""
        local = None if is_partial(basename(key)) else self.reader.open_local(key)
        if local is None:
            attr = self.view.lookup(key)
            if attr is None:
                raise KeyNotFound(f"no such file or directory: {path}")
            if attr.kind is EntryKind.DIR:
                raise IsAPrefix(f"is a directory: {path}")
            return self.files.add_handle(
                self.files.reading(key, flags, self.reader, None, lambda: self._listed(key, attr))
            )
        return self.files.add_handle(self.files.reading(key, flags, self.reader, local))

    def _listed(self, key: str, attr: Attr) -> Stamp:
        """What stands for ``key``'s bytes at an open with no local file to ``fstat``: the
        listing's size, mtime and ETag (asked only then: on a local disk the listing would
        cost a ``stat`` of every file of the folder, where the open needs none)."""
        info = self.view.info(key)
        return stamp_of(info) if info is not None else (attr.size, attr.mtime)

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
        self.check_mutable(key)
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
        assert_held(node.lock)
        attr = self.view.lookup(node.key)
        if attr is not None and flags & os.O_EXCL:
            raise KeyExists(f"file exists: {path}")
        if attr is not None and attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: {path}")
        if attr is None:
            self.check_ancestors(node.key)
            node.stored = False
        if not node.pending or node.failed:  # (what a failed commit left is replaced)
            node.base = self.committer.base_of(node.key)
        node.unlinked = node.failed = False
        if attr is None or flags & os.O_TRUNC:
            self.files.empty(node)
        else:
            self.files.staged(node, attr.size)
        node.dirty = True

    def check_ancestors(self, key: str) -> None:
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
        info = self.view.info(node.key) if node.stored and node.translator is None else None
        return info.size if info is not None else None

    def read(self, fh: int, size: int, offset: int) -> bytes:
        handle = self.files.handle(fh)
        node, local = handle.node, handle.local
        if local is not None and node is not None and node.staged is None:
            return self.reader.read_local(local, size, offset)  # the hot path: one pread
        if handle.control is not None:
            return handle.control[offset : offset + size]
        if handle.made is not None:
            return handle.made.read(size, offset)
        assert node is not None
        with node.lock:
            if node.staged is not None:
                return node.staged.read(size, offset)
            if node.translator is not None:
                raise KeyNotFound(f"/{node.key}: the view file is gone (refused or removed)")
            key = node.key
        info = self.view.info(key)
        total, version = (info.size, version_of(info)) if info else (None, None)
        chunk, handle.window = self.reader.read(handle.window, key, size, offset, total, version)
        return chunk

    def read_unopened(self, path: str, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset`` of ``path``, read with no handle (zero-message opens:
        :mod:`~n5fs.gateway.read.unopened`). A control entry is rendered afresh and announced
        stale once read, so the kernel, which keeps the pages of files it opened by itself,
        asks again next time; a file is read from the descriptor :meth:`read_fd_unopened`
        gives (libfuse prefers to read that one itself)."""
        key = path_to_key(path)
        if not is_control(key):
            return os.pread(self.unopened.read_fd(path, size, offset), size, offset)
        self.committer.changed([key])
        return self._control(key)[offset : offset + size]

    def read_fd_unopened(self, path: str, size: int, offset: int) -> int | None:
        """A descriptor to read a file with no handle from (valid until this thread's next
        call), None for a control entry (:meth:`read_unopened`)."""
        if is_control(path_to_key(path)):
            return None
        return self.unopened.read_fd(path, size, offset)

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
            raise AccessDenied("this file is read-only (a control entry, or made by a view)")
        self.check_mutable(node.key)
        with node.lock:
            staged = self.files.staged(node, self._stored_size(node))
            prechecks = self.committer.prechecks
            native = node.translator is None
            if native and not offset and not staged.size and prechecks is not None:
                prechecks.start(node.key, staged)  # a chunk written from 0: check as it comes
            written = staged.write(data, offset)
            node.dirty = node.written = True
            node.failed = False  # new content: the file shows again, its close commits it
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        """With a handle, or while a writer holds unflushed data: staged, committed at its
        flush. Otherwise (``truncate(1)``): committed now, like any other change."""
        key = path_to_key(path)
        self.check_mutable(key)
        if fh is not None:
            node = self.files.handle(fh).node
            if node is None:
                raise AccessDenied(f"{path} is a read-only control entry of n5fs")
            with node.lock:
                self.files.staged(node, self._stored_size(node)).truncate(length)
                node.dirty = node.written = True
                node.failed = False
            return
        if self.view.stat(key).kind is not EntryKind.FILE:
            raise IsAPrefix(f"is a directory: {path}")
        with self.files.pinned(key) as (node,):
            self.files.staged(node, self._stored_size(node)).truncate(length)
            deferred = node.dirty and node.refs > 1  # a writer's flush commits it
            node.dirty = node.written = True
            node.failed = False
            if not deferred:
                self._commit(node)

    def _commit(self, node: Node) -> None:
        """Commit the node (caller holds its lock). A new file whose commit fails, whatever
        the cause, leaves no name: :meth:`_unborn`."""
        assert_held(node.lock)
        if node.translator is not None:
            self._commit_translated(node, node.translator)
            return
        new = not node.stored
        try:
            self.committer.commit_node(node)
        except Rejected:
            if new:
                self._unborn(node)  # the committer told the kernel: every refusal does
            raise
        except Exception:
            if new:
                self._unborn(node)
                self.committer.changed([node.key])  # a failing store tells nobody by itself
            raise
        self.failed_creates.forget(node.key)

    def _commit_translated(self, node: Node, translator: Translator) -> None:
        """Commit a view file (caller holds its lock): the view translates and stores it, or
        keeps it staged under a name it does not translate. A refused file is gone, as a
        refused new file is; one committed with no handle left gives its bytes back."""
        staged = node.staged
        if staged is None:
            return
        try:
            done = translator.commit(node.key, staged)
        except Rejected:
            self.files.drop_translated(node)
            raise
        if done:
            node.dirty = False
            if node.refs <= 0:
                self.files.drop_translated(node)

    def truncate_translated(self, key: str, length: int) -> bool:
        """Cut or grow the staged view file ``key`` (committed at its writer's flush); False
        when no view file of that name is staged."""
        node = self.files.translated(key)
        if node is None:
            return False
        with node.lock:
            if node.staged is None:
                return False
            node.staged.truncate(length)
            node.dirty = node.written = True
        return True

    def unlink_translated(self, key: str) -> bool:
        """Drop the staged view file ``key`` (True), else leave ``key`` to the caller."""
        node = self.files.translated(key)
        if node is None:
            return False
        with node.lock:
            if node.staged is None or node.key != key:
                return False
            node.unlinked = True
            self.files.drop_translated(node)
        return True

    def rename_translated(self, old: str, new: str, *, keep: bool = False) -> bool:
        """Move (``keep``: copy, as a hard link) the staged view file ``old`` to ``new`` and
        commit it there; False when no view file ``old`` is staged. Open handles follow a
        moved file; a view file staged at ``new`` before is gone. The copy reads the staged
        bytes whole, in working memory of the budget."""
        node = self.files.translated(old)
        if node is None or node.translator is None:
            return False
        translator = node.translator
        if keep:
            with node.lock:
                staged = node.staged
                if staged is None or node.key != old:
                    return False
                with self.files.budget.borrow(staged.size):
                    data = staged.getvalue()
            target = self.files.open_translated(new, translator, None, truncate=True)
            try:
                with target.lock:
                    assert target.staged is not None
                    target.staged.write(data, 0)
                    self._commit_translated(target, translator)
            finally:
                self.files.release_translated(target)
            return True
        replaced = None
        try:
            with node.lock:
                if node.staged is None or node.key != old:
                    return False
                replaced = self.files.move_translated(node, new)
                node.dirty = True
                self._commit_translated(node, translator)
        finally:
            if replaced is not None:
                with replaced.lock:
                    replaced.unlinked = True
                    self.files.drop_translated(replaced)
        return True

    def _unborn(self, node: Node) -> None:
        """The first commit of ``node`` failed (caller holds its lock), whatever the cause: a
        refusal (EINVAL), a conflict (EAGAIN), a full or failing store (ENOSPC, EIO). Its
        name is gone now, not at its release: ``stat`` says ENOENT and ``readdir`` leaves it
        out (:attr:`Node.failed`; :meth:`_commit` has the kernel drop what it cached), and
        the caller's retried ``open(O_CREAT)``, which the kernel may send as a plain
        ``open``, is served as a create (:class:`~n5fs.gateway.write.handles.FailedCreates`)."""
        assert_held(node.lock)
        node.failed = True
        self.failed_creates.remember(node.key)

    def flush(self, fh: int) -> None:
        node = self.files.handle(fh).node
        if node is None:
            return
        with node.lock:
            if not node.dirty or node.unlinked:
                return
            if not node.stored and not node.written:
                self._judge_unwritten(node)
                return
            self._commit(node)

    def _judge_unwritten(self, node: Node) -> None:
        """A close of a new file nothing was written to yet (caller holds the node's lock).

        The file is committed when its last handle goes (:meth:`release`), not here: the
        shell's ``cmd > file`` closes its first descriptor before the command writes, and the
        command ``fstat``-s its output (``cat``, Python) - by path, on FUSE, so the name must
        stay while a descriptor holds the file. This close answers what that commit will: 0
        where the format takes an empty file (a plain file), EINVAL where it refuses one (a
        chunk, a metadata document: ``touch arr/0/0``, ``: > arr/0/0``, ``cp`` of an empty
        file), recorded in the rejections when the last handle goes with nothing written. The
        kernel is told to ask again, so a ``stat`` after this close sees the name only while
        a descriptor still holds the file, and then it opens (it reads empty)."""
        assert_held(node.lock)
        refusal = self.committer.would_refuse(node.key, b"")
        if refusal is None:
            return
        self.committer.changed([node.key])
        raise NothingWritten(
            f"closed before anything was written, and {refusal.message}",
            path=node.key,
            fmt=refusal.fmt,
            rule=refusal.rule,
        )

    def fsync(self, fh: int) -> None:
        """Commit what is staged, then make it durable in the store: on a write-back store
        the file's own upload (a view's file, whose keys the view chose: every upload), else
        the store's flush (a zip archive's rewrite, a file store's fsyncs)."""
        self.flush(fh)
        node = self.files.handle(fh).node
        uploads = write_back(self._store)
        if uploads is not None and node is not None and node.translator is None:
            uploads.flush_key(node.key)
        else:
            self._store.flush()

    def release(self, fh: int) -> None:
        """The kernel's last reference to a handle went (after the flush of its last close).
        The last handle of a node commits what no flush committed: a new file nothing was
        written to (:meth:`_judge_unwritten`), bytes the kernel wrote back after the last
        close (``mmap``). Never a new file whose last commit failed (:attr:`Node.failed`):
        the caller was told at ``close()``, and a retry here could make the name appear
        after that ``close()`` said it does not exist."""
        handle = self.files.pop_handle(fh)
        if handle is None or handle.node is None:
            return
        node = handle.node
        try:
            with node.lock:
                if node.dirty and not node.unlinked and not node.failed and node.refs == 1:
                    self._commit(node)  # the kernel always flushes first; this is a safety net
        except Rejected:
            pass  # recorded by the committer; release() cannot report it
        finally:
            if node.translator is not None:
                self.files.release_translated(node)
            else:
                self.files.release(node)

    def utimens(self, path: str, mtime: float) -> None:
        """A file's modification time (``touch -d``, ``cp -a``, ``rsync -a``): kept with staged
        content until its commit, else stored now. Folders and links keep none."""
        key = path_to_key(path)
        self.check_mutable(key)
        if self.view.stat(key).kind is not EntryKind.FILE:
            return
        with self.files.pinned(key) as (node,):
            if node.pending:
                node.mtime = mtime
                return
            info = self.view.info(key)
            if info is not None:
                self.committer.set_mtime(key, mtime, info.size)
