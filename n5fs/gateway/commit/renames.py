"""Renames, hard links and symlinks: the commits that move or copy content to a new name.

A rename (or hard link, which zarr-python 3 uses for exclusive writes) into a chunk or
metadata name validates the content at its new name, like any commit.

Locks, in the order taken: the nodes of both names (:meth:`OpenFiles.pinned`, in key order:
the bytes validated are the bytes stored, no other handle can commit either name meanwhile,
and two links to one new name cannot both succeed), then the commit order of both names
(:mod:`n5fs.gateway.commit.ordering`), then leaf locks. A directory rename holds both directories
exclusively: no commit runs below either while keys move.

Known limit: files open *below* a directory while it is renamed keep their old names and
commit there at their next flush (the store has no inodes to follow).
"""

from __future__ import annotations

from functools import cache, partial
from typing import TYPE_CHECKING

from n5fs.errors import (
    InvalidKey,
    IsAPrefix,
    KeyExists,
    KeyNotFound,
    NotAPrefix,
    PrefixNotEmpty,
    Rejected,
)
from n5fs.gateway.commit.committer import is_metadata
from n5fs.gateway.commit.rules import Mode
from n5fs.gateway.namespace.links import add_link, remove_link
from n5fs.gateway.namespace.paths import Attr, EntryKind
from n5fs.gateway.read.byte_cache import version_of
from n5fs.kvstore.keys import basename, folder_of, folders_above
from n5fs.locking import assert_held

if TYPE_CHECKING:
    from n5fs.detect import Detector
    from n5fs.gateway.commit.committer import Committer
    from n5fs.gateway.namespace.listings import NamespaceView
    from n5fs.gateway.read.reader import ObjectReader
    from n5fs.gateway.write.handles import Node, OpenFiles
    from n5fs.kvstore.base import KvStore


class Renamer:
    def __init__(
        self,
        store: KvStore,
        view: NamespaceView,
        files: OpenFiles,
        committer: Committer,
        reader: ObjectReader,
        detector: Detector,
    ) -> None:
        self.store = store
        self.view = view
        self.files = files
        self.committer = committer
        self.reader = reader
        self.detector = detector

    def content(self, node: Node) -> bytes:
        """What the file holds now: staged bytes, else the stored object (caller holds the
        node's lock)."""
        assert_held(node.lock)
        if node.pending and node.staged is not None:
            return node.staged.getvalue()
        info = self.view.info(node.key)
        data = self.reader.whole(node.key, version_of(info))
        if data is None:
            raise KeyNotFound(f"/{node.key}")
        return data

    # -- files ---------------------------------------------------------------------------------

    def rename_file(self, src: str, dst: str, dst_attr: Attr | None) -> None:
        if src == dst:
            return
        if dst_attr is not None and dst_attr.kind is EntryKind.DIR:
            raise IsAPrefix(f"is a directory: /{dst}")
        base = self.committer.base_of(dst)  # the version of dst this mount saw
        with self.files.pinned(src, dst) as (node, _replaced):
            if node.unlinked or (not node.stored and not node.pending):
                raise KeyNotFound(f"no such file: /{src}")
            pending = node.pending
            with self.committer.hold(src, dst):
                data = node.staged.getvalue() if pending and node.staged is not None else None
                # the bytes validated are the bytes stored: one snapshot, under the node lock
                load = cache(partial(self.content, node)) if data is None else partial(bytes, data)
                if data is None and self.committer.versioned(dst):
                    data = load()  # a compare-and-swap, not a server-side copy
                version = None
                if data is not None:
                    version, _ = self.committer.write(dst, load, len(data), base)
                    if node.stored:
                        self.store.delete(src)
                    size = len(data)
                    mtime = self.committer.keep_mtime(dst, node.mtime)
                else:
                    self.committer.validate(dst, load)
                    cached = self.reader.cache.get(src)
                    moved = self.view.info(src)  # a rename keeps the file's time
                    self.store.rename(src, dst)
                    data = cached
                    size = len(cached) if cached is not None else self._size_of(dst)
                    mtime = moved.mtime if moved is not None else None
                self.files.detach(dst)  # an open file of the old dst lives on unnamed
                self.files.move(node, dst)
                node.dirty, node.stored, node.mtime, node.base = False, True, None, version
                self.committer.after_delete(src)
                self.committer.after_set(dst, size, data, mtime, version)

    def _size_of(self, key: str) -> int:
        info = self.store.stat(key)
        return info.size if info is not None else 0

    def link(self, src: str, dst: str) -> None:
        """A hard link is a validated copy: zarr-python links its temp file to the final name
        for an exclusive create, then unlinks the temp."""
        with self.files.pinned(src, dst) as (node, target):
            if target.pending or self.view.lookup(dst) is not None:
                raise KeyExists(f"file exists: /{dst}")
            data = self.content(node)
            self.committer.commit_bytes(dst, data, self.committer.base_of(dst))

    # -- directories ---------------------------------------------------------------------------

    def rename_dir(self, src: str, dst: str, dst_attr: Attr | None) -> None:
        if dst == src or dst.startswith(src + "/"):
            raise InvalidKey(dst, "cannot move a directory into itself")
        shared = {*folders_above(src), *folders_above(dst)}
        exclusive = {src + "/", dst + "/"}
        with self.committer.order.hold(shared=shared - exclusive, exclusive=exclusive):
            if dst_attr is not None:
                if dst_attr.kind is not EntryKind.DIR:
                    raise NotAPrefix(f"not a directory: /{dst}")
                if self.view.readdir(dst):
                    raise PrefixNotEmpty(f"directory not empty: /{dst}")
            moves = [
                (info.key, dst + info.key[len(src) :])
                for info in self.store.list(src + "/", delimiter=None).keys
            ]
            self._validate_moves(dst, moves)
            if dst_attr is not None and self.store.traits.empty_prefixes:
                self.store.remove_prefix(dst)  # an empty folder is replaced, as rename(2) does
            self._move(src, dst, moves)
            self.view.note_moved_dir(src, dst, empty=not moves)
            self.reader.cache.invalidate_prefix(src + "/")
            self.detector.clear()
            rewritten = self._after_moves(moves)
        self.committer.changed([src, dst, *rewritten])

    def _move(self, src: str, dst: str, moves: list[tuple[str, str]]) -> None:
        """Move the keys; where the store cannot move a folder atomically (S3, zip, memory),
        in an order that is safe to interrupt: chunks are copied, then metadata, then the
        source metadata deleted, then the source chunks. A destination array appears only
        once every chunk sits under it; a source array stops being one before any of its
        chunks goes. A crash leaves at worst a complete copy and a metadata-less remnant."""
        if self.store.traits.atomic_prefix_rename:
            self.store.rename_prefix(src + "/", dst + "/")
            return
        meta = [(old, new) for old, new in moves if is_metadata(old)]
        data = [(old, new) for old, new in moves if not is_metadata(old)]
        self.store.copy_many(data)
        self.store.copy_many(meta)
        self.store.delete_many([old for old, _ in meta])
        self.store.delete_many([old for old, _ in data])

    def _validate_moves(self, dst: str, moves: list[tuple[str, str]]) -> None:
        destination = self.detector.folder(folder_of(dst))
        if destination.array is None and destination.array_prefix is None:
            return
        for old_key, new_key in moves:  # moving into an array: every file is a chunk there
            self.committer.validate(new_key, partial(self._stored, old_key))

    def _stored(self, key: str) -> bytes:
        data = self.store.get(key)
        if data is None:
            raise KeyNotFound(f"/{key}")
        return data

    def _after_moves(self, moves: list[tuple[str, str]]) -> list[str]:
        """Keep consolidated metadata true after moved metadata; the keys it rewrote."""
        if self.committer.mode is Mode.OFF:
            return []
        keeper = self.committer.keeper
        rewritten: list[str] = []
        for old_key, new_key in moves:
            if is_metadata(old_key):
                rewritten += keeper.after_change(old_key, None)
                rewritten += keeper.after_change(new_key, self.store.get(new_key))
        return rewritten

    # -- links (hdmf-zarr) ---------------------------------------------------------------------

    def symlink(self, target: str, key: str) -> None:
        """Inside a group whose format has links (hdmf-zarr), a symlink becomes a link entry
        of the group's metadata; a refused one is recorded like any refused commit."""
        prefix = folder_of(key)
        with self.committer.order.for_folder(prefix):
            try:
                attrs_key, data = add_link(self.detector.folder(prefix), basename(key), target)
            except Rejected as exc:
                self.committer.refused(key, exc)
                raise
            if self.view.lookup(key) is not None:
                raise KeyExists(f"file exists: /{key}")
            self.committer.store_bytes(attrs_key, data, self.committer.base_of(attrs_key))
        self.committer.changed([key])

    def remove_link(self, key: str) -> None:
        prefix = folder_of(key)
        with self.committer.order.for_folder(prefix):
            attrs_key, data = remove_link(self.detector.folder(prefix), basename(key))
            self.committer.store_bytes(attrs_key, data, self.committer.base_of(attrs_key))
        self.committer.changed([key])
