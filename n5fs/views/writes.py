"""Writes through ``--as zarr3`` / ``--as zarr2`` over an N5 hierarchy: they land as N5.

Each file a Zarr writer writes is *staged* by the gateway under its view name, like any
file (:meth:`~n5fs.gateway.write.filecalls.FileCalls.open_translated`: its handles, the one
staging budget, spilling to disk), and *committed* by this view (:meth:`ViewWrites.commit`,
the gateway's :class:`~n5fs.gateway.write.handles.Translator`) when flushed, released or
renamed under a name the view translates: a metadata document (``zarr.json``;
``.zarray``, ``.zgroup``, ``.zattrs``) becomes the folder's ``attributes.json`` (axes
reversed: N5 lists the fastest first; ``dataType``, ``compression`` from the codec; the
attributes), a chunk (the view's flat ``z.y.x`` keys, or the keys of the encoding the writer
declared) is decoded with the codecs of the document it was written for and stored as the N5
block at the reversed position, clipped at the dataset's end as N5 Java writes it. Both go to
the gateway as writes of native names: its commit rules validate and record them. What N5
cannot hold (a codec it lacks, a checksum, sharding, a transposition, a type it has no name
for, a fill value other than 0, filters) is refused before anything is written:
:class:`~n5fs.errors.Rejected` (EINVAL), recorded in the gateway's rejections.

Any other name (zarr-python's ``zarr.<uuid>.partial`` temp files) stays staged, never
stored: a rename or hard link into a translated name commits it, an unlink drops it. Folders
made inside an array (``c/0``) exist in the view only: N5 has its own block folders.

A translation holds the written chunk, its values and the encoded block at once; it runs in
working memory borrowed from the gateway's staging budget
(:meth:`~n5fs.gateway.write.staging.StagingBudget.borrow`), so large chunks committed at once
take turns instead of each holding its own copies.

Thread-safety: ``_lock`` is a leaf lock around the view's own tables (folders made inside an
array, the documents writers declared, subscribers); the staged files are the gateway's, and
a commit runs under the view file's node lock (the gateway's), outside ``_lock``.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from n5fs.detect import Folder, FolderKind
from n5fs.errors import KeyNotFound, PrefixNotEmpty, Rejected
from n5fs.formats.base import ArrayNode, KeyKind
from n5fs.formats.n5 import ATTRIBUTES, N5ArrayNode, load_attributes
from n5fs.gateway.commit.committer import MAX_VALIDATED_BYTES
from n5fs.gateway.namespace.paths import Attr, EntryKind
from n5fs.kvstore.keys import basename, parent
from n5fs.views.n5 import N5_VERSION
from n5fs.views.removal import ARRAY, GROUP, Removals
from n5fs.views.removal import ATTRIBUTES as ATTRS
from n5fs.views.tree import Entry, document
from n5fs.views.zarr_to_n5 import n5_attributes, parse_document

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from n5fs.gateway import Gateway
    from n5fs.gateway.write.staging import BaseObject, StagedFile
    from n5fs.views.access import StoreAccess
    from n5fs.views.zarr import ZarrTree

_META = {"zarr3": ("zarr.json",), "zarr2": (".zarray", ".zgroup", ".zattrs")}


class _Recorded(Exception):
    """A refusal of the gateway's commit rules, already in its rejections."""

    def __init__(self, rejected: Rejected) -> None:
        super().__init__(str(rejected))
        self.rejected = rejected


@dataclass(frozen=True)
class _Declared:
    """An array's document as its writer wrote it in this mount."""

    node: ArrayNode
    name: str
    doc: bytes


class ViewWrites:
    """The staged files of a writable Zarr view and their translation (see module docs)."""

    def __init__(self, gateway: Gateway, tree: ZarrTree) -> None:
        self.gateway = gateway
        self.tree = tree
        self.calls = gateway.calls
        self._dirs: set[str] = set()
        #: array prefix -> the Zarr document its writer declared (its chunk keys, its codecs)
        self._declared: dict[str, _Declared] = {}
        self._subscribers: list[Callable[[Sequence[str]], None]] = []
        self._lock = threading.Lock()
        self.removals = Removals(self)

    def subscribe(self, callback: Callable[[Sequence[str]], None]) -> None:
        with self._lock:
            self._subscribers.append(callback)

    def changed(self, key: str) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(["/" + key])

    def native_chunk(self, key: str) -> str | None:
        """The N5 block key a view chunk key names (None: ``key`` names no chunk)."""
        found = self._chunk(key, parse_doc=False)
        if found is None:
            return None
        prefix, _, n5node, pos = found
        return prefix + n5node.chunk_key(pos[::-1])

    def implicit(self, key: str) -> bool:
        """Is ``key`` the document the view makes for a folder N5 holds no metadata for (every
        N5 folder is a group)? A writer's create-if-absent may take its place."""
        if basename(key) not in _META[self.tree.name]:
            return False
        folder = self.tree.access.folder(parent(key))
        return folder.kind is FolderKind.GROUP and folder.node is None

    def in_n5(self, key: str) -> bool:
        """Is ``key`` below an N5 group or dataset (the nearest folder with a format), or in
        folders without metadata up to a root without any (where N5 arrays land)?"""
        folder = parent(key)
        while True:
            found = self.tree.access.folder(folder)
            if found.fmt is not None:
                return found.fmt == "n5"
            if not folder:
                return True
            folder = parent(folder)

    # -- namespace -----------------------------------------------------------------------------

    def stat(self, key: str) -> Attr | None:
        node = self.calls.files.translated(key)
        staged = None if node is None else node.staged
        if staged is not None:
            return Attr(EntryKind.FILE, staged.size)
        with self._lock:
            return Attr(EntryKind.DIR) if key in self._dirs else None

    def names(self, folder: str) -> list[tuple[str, Attr]]:
        """What the view lists in ``folder`` beside the tree: staged files, view folders."""
        with self._lock:
            dirs = [d for d in self._dirs if parent(d) == folder]
            declared = self._declared.get(folder + "/")
        found = self.calls.files.translated_children(folder)
        found += [(basename(d), Attr(EntryKind.DIR)) for d in dirs]
        if declared is not None:
            found.append((declared.name, Attr(EntryKind.FILE, len(declared.doc))))
        return found

    def mkdir(self, key: str) -> bool:
        """A folder inside an array lives in the view only (True); else the gateway's."""
        if self._array_of(key) is None:
            return False
        with self._lock:
            self._dirs.add(key)
        return True

    def rmdir(self, key: str) -> bool:
        with self._lock:
            if key not in self._dirs:
                return False
            if self.calls.files.translated_children(key) or any(
                parent(d) == key for d in self._dirs
            ):
                raise PrefixNotEmpty(f"directory not empty: /{key}")
            self._dirs.discard(key)
        return True

    # -- files (staged by the gateway; committed here) -------------------------------------------

    def open(self, key: str, flags: int, base: BaseObject | None) -> int:
        """A gateway handle writing the view file ``key``, over ``base`` (what the view shows
        there now; None: a new file)."""
        return self.calls.open_translated(key, flags, self, base)

    def truncate(self, key: str, length: int) -> bool:
        return self.calls.truncate_translated(key, length)

    def unlink(self, key: str) -> bool:
        """Drop a staged file (True), else leave ``key`` to the caller."""
        return self.calls.unlink_translated(key)

    def rename(self, old: str, new: str, *, keep: bool = False) -> bool:
        """Move (``keep``: link) a staged file to ``new``, committing it there if it is a
        name the view translates. False: ``old`` is no staged file."""
        return self.calls.rename_translated(old, new, keep=keep)

    def commit(self, key: str, staged: StagedFile) -> bool:
        """Translate and store ``key`` if the view translates its name (else False: it stays
        staged). The written bytes, the values and the encoded result are held in working
        memory borrowed from the budget; a document is stored under its folder's removal hold
        (:mod:`n5fs.views.removal`)."""
        if not self._translates(key):
            return False
        if staged.size > MAX_VALIDATED_BYTES:
            self._translated(key, None)  # refused, recorded: never read into memory
        with self.gateway.budget.borrow(self._working_bytes(key, staged.size)):
            data = staged.getvalue()
            with self.removals.writing(key):
                done = self._translated(key, data)
                if done:
                    self.removals.unhide(key)
        if done:
            self.changed(key)
        return done

    def _translates(self, key: str) -> bool:
        """Is ``key`` a name the view translates (a document, a chunk of a dataset)? A chunk
        the view will refuse counts: its commit words the refusal."""
        if basename(key) in self.document_names() and parent(key) not in self._dirs:
            return True
        try:
            return self.native_chunk(key) is not None
        except Rejected:
            return True

    def _working_bytes(self, key: str, size: int) -> int:
        """What a translation of ``size`` written bytes holds at most: those bytes, the
        decoded chunk and the encoded result (about the decoded size again)."""
        try:
            dataset = self._dataset_of(key)
        except Rejected:
            dataset = None
        if dataset is None:
            return size
        return size + 2 * math.prod(dataset.block_size) * dataset.dtype.itemsize

    def _dataset_of(self, key: str) -> N5ArrayNode | None:
        """The N5 dataset whose block the chunk ``key`` is (None: no chunk)."""
        found = self._chunk(key, parse_doc=False)
        return None if found is None else found[2]

    def _translated(self, key: str, data: bytes | None) -> bool:
        """:meth:`_translate`, a refusal recorded (the gateway drops the staged file); None:
        content too large to translate in memory."""
        try:
            return self._translate(key, _within_memory(data))
        except (_Recorded, Rejected) as exc:
            if isinstance(exc, _Recorded):
                raise exc.rejected from None
            why = (
                exc if exc.path else Rejected(exc.message, path="/" + key, fmt="n5", rule=exc.rule)
            )
            self.gateway.committer.refused(key, why)
            raise why from None

    def _translate(self, key: str, data: bytes) -> bool:
        name = basename(key)
        if name in _META[self.tree.name] and parent(key) not in self._dirs:
            self._metadata(key, name, data)
            return True
        found = self._chunk(key)
        if found is None:
            return False
        prefix, node, n5node, pos = found
        assert node is not None
        block = n5node.encode_chunk(pos[::-1], np.asarray(node.decode_chunk(pos, data)).T)
        self._native("/" + prefix + n5node.chunk_key(pos[::-1]), block)
        return True

    def _native(self, path: str, data: bytes) -> None:
        """Store a native file through the gateway (its commit rules record what they refuse)."""
        try:
            self.gateway.calls.store_file(path, data)
        except Rejected as exc:
            raise _Recorded(exc) from exc

    # -- removal (the roles of documents; :mod:`n5fs.views.removal` decides) --------------

    def document_names(self) -> tuple[str, ...]:
        """The names of the documents the view shows in a folder."""
        return _META[self.tree.name]

    def document_role(self, folder: Folder, name: str) -> str | None:
        """What the view document ``name`` of ``folder`` stands for (None: no document)."""
        if name not in _META[self.tree.name] or folder.fmt not in ("n5", None):
            return None
        if folder.kind is FolderKind.ARRAY:
            return ARRAY if name in (".zarray", "zarr.json") else ATTRS
        return GROUP if folder.kind is FolderKind.GROUP else None

    def native_documents(self, prefix: str) -> tuple[str, ...]:
        return (ATTRIBUTES,)

    def clear_attributes(self, prefix: str) -> None:
        """An array's attributes removed (``.zattrs``): its dataset keys stay."""
        self._metadata(prefix + ".zattrs", ".zattrs", b"{}")

    def clear_group(self, prefix: str) -> None:
        """A group's document removed: its attributes go (the root keeps its version)."""
        if not prefix:
            current = self._native_attributes("")
            self._store("", {k: v for k, v in current.items() if k == "n5"})
        elif self.gateway.lookup("/" + prefix + ATTRIBUTES) is not None:
            self.gateway.unlink("/" + prefix + ATTRIBUTES)

    def forget(self, prefix: str) -> None:
        """The array at ``prefix`` is gone: its writer's document no longer holds."""
        with self._lock:
            self._declared.pop(prefix, None)

    def _array_of(self, key: str) -> str | None:
        """The prefix of the N5 dataset ``key`` lies in, if any."""
        folder = self.tree.access.folder(parent(key))
        if folder.kind is FolderKind.CHUNKS and folder.array_prefix is not None:
            return folder.array_prefix
        if folder.kind is FolderKind.ARRAY and folder.fmt == "n5":
            return folder.prefix
        return None

    def _chunk(
        self, key: str, *, parse_doc: bool = True
    ) -> tuple[str, ArrayNode | None, N5ArrayNode, tuple[int, ...]] | None:
        """(array prefix, the Zarr node the chunk was written for, the dataset, position)."""
        prefix = self._array_of(key)
        if prefix is None:
            return None
        folder = self.tree.access.folder(prefix)
        n5node = folder.array
        if not isinstance(n5node, N5ArrayNode):
            return None
        rel = key[len(prefix) :]
        declared = self._declared.get(prefix)
        if declared is not None:
            what = declared.node.classify(rel)
            if what.kind is KeyKind.CHUNK and what.in_grid and what.position is not None:
                return prefix, declared.node, n5node, what.position
        plan = self.tree.plan(folder)
        if isinstance(plan, str):
            return None
        pos = plan.parse(rel)
        if pos is None:
            return None
        return prefix, self._view_node(prefix) if parse_doc else None, n5node, pos

    def _view_node(self, prefix: str) -> ArrayNode:
        """The array as the view's own document declares it (what a reopened writer uses)."""
        plan = self.tree.plan(self.tree.access.folder(prefix))
        assert not isinstance(plan, str)
        doc_name = _META[self.tree.name][0]
        node = self._parse(doc_name, plan.documents[doc_name], prefix + doc_name)
        assert isinstance(node, ArrayNode)
        return node

    def declared(self, key: str) -> Entry | None:
        """``key`` of an array written in this mount as its writer declared it (document as
        written; chunks under its names, in its encoding, made from the N5 blocks): the writer
        keeps its document and reads chunks back to update parts; every reader of this mount
        sees the same array. A later mount shows the view's own document."""
        prefix = self._array_of(key)
        found = None if prefix is None else self._declared.get(prefix)
        if prefix is None or found is None:
            return None
        rel = key[len(prefix) :]
        if rel == found.name:
            return document(found.doc)
        what = found.node.classify(rel)
        if what.kind is not KeyKind.CHUNK or what.position is None:
            return None
        pos = what.position
        shown = self.tree.entry(prefix + (".".join(map(str, pos)) if pos else "0"))
        if shown is None or shown.open is None:
            return None
        values = self._view_node(prefix).decode_chunk(pos, shown.open().read(shown.size, 0))
        return document(found.node.encode_chunk(pos, values), shown.mtime)

    def _parse(self, name: str, data: bytes, key: str) -> Any:
        return parse_document(self.tree.name, name, data, key)

    def _metadata(self, key: str, name: str, data: bytes) -> None:
        folder = parent(key)
        prefix = folder + "/" if folder else ""
        if prefix and self.tree.access.folder("").fmt is None:
            self._make_root()
        current = self._native_attributes(prefix)
        attrs, node = n5_attributes(self.tree.name, name, data, key, current)
        if not prefix and self.tree.access.folder("").fmt is None:
            attrs = {"n5": N5_VERSION, **attrs}
        self._store(prefix, attrs)
        if node is not None:
            with self._lock:
                self._declared[prefix] = _Declared(node, name, data)

    def _make_root(self) -> None:
        """A root without ``attributes.json`` (legal in N5) gets one with the version before
        the first document below it lands: without it the folders between would be no N5
        groups, and a group's attributes no N5 reader would find."""
        current = self._native_attributes("")
        self._store("", {"n5": N5_VERSION, **current})

    def _native_attributes(self, prefix: str) -> dict[str, Any]:
        try:
            data = self.gateway.read_file("/" + prefix + ATTRIBUTES)
        except (KeyNotFound, IsADirectoryError):
            return {}
        return load_attributes(data, path="/" + prefix + ATTRIBUTES)

    def _store(self, prefix: str, attrs: dict[str, Any]) -> None:
        body = (json.dumps(attrs, indent=2) + "\n").encode()
        self._native("/" + prefix + ATTRIBUTES, body)


def _within_memory(data: bytes | None) -> bytes:
    """``data``, or the refusal of content too large to translate in memory (None)."""
    if data is None:
        raise Rejected(
            f"more than the {MAX_VALIDATED_BYTES} bytes n5fs translates in memory "
            "for a chunk or metadata file",
            rule="too-large-to-validate",
        )
    return data


def n5_without_attributes(access: StoreAccess) -> bool:
    """Is the root, which has no metadata, an N5 root without ``attributes.json`` (legal: N5
    groups may have none)? Yes when no folder at its first level holds a hierarchy of another
    format (N5 datasets and groups, plain folders, or nothing yet): a Zarr writer's arrays may
    land there as N5. A root beside Zarr hierarchies stays no N5 root (one detection of each
    first-level folder, once per mount)."""
    for name, attr in access.listing(""):
        if attr.kind is EntryKind.DIR and access.folder(name).fmt not in ("n5", None):
            return False
    return True
