"""The namespace of a view: view paths <-> source keys, folder by folder.

A view path is resolved from its parent folder's kind, which the gateway's detector knows
(:meth:`Detector.folder <n5fs.detect.Detector.folder>`, cached): in a group or plain folder
a name is a metadata document the view makes, a source entry shown as it is (a plain file, a
sub-folder, an hdmf-zarr link), or a source metadata file the view hides; in an array (or a
chunk folder of one) it is what the view makes of the array (:meth:`ViewTree.in_array`).
Listing a folder is one listing of the same source folder plus names computed from
metadata; an array's chunk names are computed from the chunks its source listings show.

Entries are values: what ``stat`` answers, and for a file the view makes, how to open it
(:class:`Content`). A *native* entry is the source entry at the same path, served by the
gateway itself (its page cache, local descriptors and all).
"""

from __future__ import annotations

import abc
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from n5fs.detect import FolderKind
from n5fs.gateway.namespace.paths import Attr, EntryKind
from n5fs.gateway.read.reader import PageCache
from n5fs.kvstore.keys import basename, dir_prefix, parent

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from n5fs.detect import Folder
    from n5fs.formats.base import Node
    from n5fs.views.access import StoreAccess

T = TypeVar("T")
#: array plans remembered (each holds parsed metadata and its documents)
_PLANS = 4096


class Content(Protocol):
    """An open file the view makes."""

    def read(self, size: int, offset: int) -> bytes: ...

    @property
    def page_cache(self) -> PageCache: ...


@dataclass(frozen=True)
class Blob:
    """A made file held whole: a document, a chunk. ``claimed`` is the size ``stat`` gave;
    bytes of another length (an N5 varlength block rebuilt) are read around the page cache,
    whose idea of the size is the claimed one."""

    data: bytes
    claimed: int

    def read(self, size: int, offset: int) -> bytes:
        return self.data[offset : offset + size]

    @property
    def page_cache(self) -> PageCache:
        return PageCache.KEEP if len(self.data) == self.claimed else PageCache.BYPASS


@dataclass(frozen=True)
class Entry:
    """What a view path is: its kind and size, and either ``native`` (the source entry at
    the same path) or ``open`` (how to make the file's content)."""

    kind: EntryKind
    size: int = 0
    mtime: float = 0.0
    native: bool = False
    open: Callable[[], Content] | None = None
    #: made from metadata where nothing is stored (an N5 block of an absent chunk, holding the
    #: array's fill value; a block folder with no stored block below): removal counts it absent
    fill: bool = False

    @property
    def attr(self) -> Attr:
        return Attr(self.kind, self.size, self.mtime, writable=False)


DIRECTORY = Entry(EntryKind.DIR)
#: a block folder of the grid with no stored block below it
FILL_DIRECTORY = Entry(EntryKind.DIR, fill=True)


def native(attr: Attr) -> Entry:
    return Entry(attr.kind, attr.size, attr.mtime, native=True)


def document(data: bytes, mtime: float = 0.0) -> Entry:
    return Entry(EntryKind.FILE, len(data), mtime, open=lambda: Blob(data, len(data)))


def made(size: int, mtime: float, make: Callable[[], bytes], *, fill: bool = False) -> Entry:
    """A file of ``size`` bytes whose content ``make`` computes when it is opened (``fill``:
    see :attr:`Entry.fill`)."""
    return Entry(EntryKind.FILE, size, mtime, open=lambda: Blob(make(), size), fill=fill)


def to_json(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


class PlanCache(Generic[T]):
    """What a view made of each array's metadata, by folder, while the node stays the same
    object (the detector hands out a new one when the metadata changes). Bounded; a leaf
    lock around dictionary work only."""

    def __init__(self, limit: int = _PLANS) -> None:
        self._plans: OrderedDict[str, tuple[Node, T]] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, prefix: str, node: Node, make: Callable[[], T]) -> T:
        with self._lock:
            known = self._plans.get(prefix)
            if known is not None and known[0] is node:
                self._plans.move_to_end(prefix)
                return known[1]
        plan = make()
        with self._lock:
            self._plans[prefix] = (node, plan)
            if len(self._plans) > self._limit:
                self._plans.popitem(last=False)
        return plan


class ViewTree(abc.ABC):
    """Resolution and listing of view paths (keys: ``""`` is the root, ``a/b`` a path)."""

    #: the format the view shows (``zarr3``, ``zarr2``, ``npy``)
    name: str

    def __init__(self, access: StoreAccess) -> None:
        self.access = access

    # -- resolution ----------------------------------------------------------------------------

    def entry(self, key: str) -> Entry | None:
        """What ``key`` is in the view; None when the view has no such path."""
        if not key:
            return DIRECTORY
        owner = self.access.folder(parent(key))
        if owner.kind is FolderKind.CHUNKS and owner.array_prefix is not None:
            array = self.access.folder(owner.array_prefix)
            return self.in_array(array, key[len(owner.array_prefix) :])
        if owner.kind is FolderKind.ARRAY:
            return self.in_array(owner, basename(key))
        return self.in_folder(owner, basename(key), key)

    def in_folder(self, folder: Folder, name: str, key: str) -> Entry | None:
        """``name`` in a group or plain folder."""
        doc = self.documents(folder).get(name)
        if doc is not None:
            return document(doc)
        attr = self.access.lookup(key)
        return None if attr is None else self.shown(folder, name, key, attr)

    def shown(self, folder: Folder, name: str, key: str, attr: Attr) -> Entry | None:
        """A source entry of a group or plain folder, as the view shows it."""
        if attr.kind is EntryKind.DIR:
            return self.subfolder(key, attr)
        if self.hides(folder, name):
            return None
        return native(attr)

    def subfolder(self, key: str, attr: Attr) -> Entry | None:
        """A source folder in a group or plain folder (None: the view leaves it out)."""
        return Entry(EntryKind.DIR, mtime=attr.mtime)

    def hides(self, folder: Folder, name: str) -> bool:
        """Is ``name`` a source metadata file the view replaces?"""
        fmt = folder.format
        return fmt is not None and not self.is_native(folder) and name in fmt.metadata_names

    def is_native(self, folder: Folder) -> bool:
        """Does the view show this folder's hierarchy as it is stored?"""
        return False

    # -- listing -------------------------------------------------------------------------------

    def children(self, key: str) -> list[tuple[str, Entry]]:
        """The entries of the view folder ``key`` (the caller checked it is one)."""
        folder = self.access.folder(key)
        if folder.kind is FolderKind.CHUNKS and folder.array_prefix is not None:
            array = self.access.folder(folder.array_prefix)
            return sorted(self.array_children(array, dir_prefix(key)[len(array.prefix) :]))
        if folder.kind is FolderKind.ARRAY:
            return sorted(self.array_children(folder, ""))
        out: dict[str, Entry] = {}
        for name, attr in self.access.listing(key):
            out.update(self.listed(folder, name, join(key, name), attr))
        for name, doc in self.documents(folder).items():
            out[name] = document(doc)
        return sorted(out.items())

    def listed(
        self, folder: Folder, name: str, key: str, attr: Attr
    ) -> Iterator[tuple[str, Entry]]:
        """What one source entry of a listed group or plain folder becomes."""
        entry = self.shown(folder, name, key, attr)
        if entry is not None:
            yield name, entry

    # -- what each view makes ------------------------------------------------------------------

    @abc.abstractmethod
    def documents(self, folder: Folder) -> Mapping[str, bytes]:
        """The metadata documents the view shows in a group or plain folder."""

    @abc.abstractmethod
    def in_array(self, array: Folder, rel: str) -> Entry | None:
        """``rel`` (relative to the array folder) inside a source array."""

    @abc.abstractmethod
    def array_children(self, array: Folder, rel_dir: str) -> list[tuple[str, Entry]]:
        """The entries of folder ``rel_dir`` (``""``: the array folder) of a source array."""

    @abc.abstractmethod
    def describe(self) -> list[dict[str, Any]]:
        """Every group and array as the view shows it, and every array it leaves out with
        the reason (``n5fs detect --as``)."""


# -- detect --as -------------------------------------------------------------------------------


def describe_tree(
    tree: ViewTree,
    array: Callable[[Folder, str], dict[str, Any]],
    *,
    group_kinds: tuple[FolderKind, ...] = (FolderKind.GROUP,),
) -> list[dict[str, Any]]:
    """Every group (``group_kinds``) and array of the source, groups as ``tree`` shows them
    and arrays as ``array(folder, path)`` describes them (``n5fs detect --as``)."""
    nodes: list[dict[str, Any]] = []
    for folder in tree.access.detector.walk("", on_error=lambda prefix, exc: None):
        path = folder.prefix.rstrip("/")
        if folder.kind in group_kinds:
            fmt = folder.fmt if tree.is_native(folder) else tree.name
            nodes.append({"path": path, "format": fmt, "kind": "group"})
        elif folder.kind is FolderKind.ARRAY:
            nodes.append(array(folder, path))
    return nodes


def native_array(folder: Folder, path: str) -> dict[str, Any]:
    """An array the view shows as it is stored."""
    node = folder.array
    assert node is not None
    return {
        "path": path,
        "format": folder.fmt,
        "kind": "array",
        "dtype": node.dtype.str,
        "shape": list(node.shape),
        "chunks": list(node.chunks),
        "codecs": f"as stored: {node.codec_summary()}",
    }


def left_out(folder: Folder, path: str, reason: str) -> dict[str, Any]:
    """An array the view cannot show, with the reason."""
    return {"path": path, "format": folder.fmt, "kind": "left out", "reason": reason}
