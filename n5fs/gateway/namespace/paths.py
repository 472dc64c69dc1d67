"""Paths and keys, and the entries that live only in the gateway.

Key ``a/b/c`` is file ``/a/b/c``; a prefix with keys under it is a directory, and where a key
and a prefix share a name (``a`` and ``a/x``) the directory wins. The control folder
``/.n5fs/`` is never stored; a store key under that name is hidden.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import operator
import os
from array import array
from collections.abc import Collection, ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.keys import check_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.kvstore.base import Listing

CONTROL = ".n5fs"
CONTROL_FILES = ("rejections", "stats.json")
_CONTROL_RAW = CONTROL.encode()


class EntryKind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class Attr:
    kind: EntryKind
    size: int = 0
    mtime: float = 0.0
    writable: bool = True


def path_to_key(path: str) -> str:
    """``"/a/b"`` -> ``"a/b"``; the root is ``""``. Raises InvalidKey for ``..`` and friends."""
    key = path.strip("/")
    return check_key(key) if key else ""


def is_control(key: str) -> bool:
    return key == CONTROL or key.startswith(CONTROL + "/")


#: how names are kept packed: as FUSE hands them to the kernel (mfusepy's default), so a
#: readdir passes each name's bytes on as they are; UTF-8 bytes sort as their code points do
ENCODING, ERRORS = "utf-8", "surrogateescape"
#: a packed file's size before its first ``stat`` (a listing of names), and after a ``stat``
#: that found no file there
UNKNOWN, GONE = -1, -2
#: what one packed entry costs beyond its bytes (the cache's weight of a listing): eight
#: bytes of size, eight of mtime, and its offset
_PACKED_ENTRY = 16
#: what an entry held as Python objects costs (a dict item, its name, a KeyInfo; an overlay's)
_OBJECT_ENTRY = 250


def _joined(pieces: list[bytes]) -> bytes:
    """``b"".join(pieces)`` a slice at a time: a join holds a buffer view of 80 bytes per
    piece while it runs (80 MB for a million names, three times the names themselves)."""
    step = 8192
    if len(pieces) <= step:
        return b"".join(pieces)
    return b"".join([b"".join(pieces[i : i + step]) for i in range(0, len(pieces), step)])


def _offsets(pieces: list[bytes]) -> array[int]:
    """Where each piece starts in ``b"".join(pieces)``, and the end: ``len(pieces) + 1``
    offsets, four bytes each while the blob is under 4 GiB."""
    try:
        return array("I", itertools.accumulate(map(len, pieces), initial=0))
    except OverflowError:
        return array("Q", itertools.accumulate(map(len, pieces), initial=0))


class PackedFiles(Mapping[str, "KeyInfo"]):
    """A folder's files as one listing showed them, packed: the names sorted (by their
    bytes) and joined in one ``bytes`` with an array of offsets, sizes and mtimes in two
    arrays, ETags (where the store keeps them) joined like the names. Some 30 bytes per
    chunk file instead of some 250 for a dict of :class:`KeyInfo` (a Zarr v2 folder of a
    million chunks: 30 MB, not 250); a name is found by binary search, and a
    :class:`KeyInfo` is made only when one is asked for.

    Immutable but for a memo: a listing of names alone (:meth:`of_names`, a store with
    :class:`~n5fs.kvstore.abilities.NameListings`) leaves each size :data:`UNKNOWN` until the
    first question about that file, answered by one ``stat`` (``stat_key``) and remembered
    (mtime first, then size: a reader that sees the size sees its mtime). Two threads may
    both ask; either answer is a true one, and once known a file's answer never changes.
    A file that ``stat`` no longer finds is :data:`GONE`: listed, but with no info.
    """

    __slots__ = ("_blob", "_etags", "_mtimes", "_offsets", "_prefix", "_sizes", "_stat")

    def __init__(
        self,
        prefix: str,
        names: list[bytes],
        sizes: array[int],
        mtimes: array[float],
        etags: list[bytes] | None = None,
        stat_key: Callable[[str], KeyInfo | None] | None = None,
    ) -> None:
        """``names`` sorted, encoded as :data:`ENCODING` says; ``etags`` each encoded, b"\\0"
        for none (None: the store keeps none)."""
        self._prefix = prefix
        self._blob = _joined(names)
        self._offsets = _offsets(names)
        self._sizes = sizes
        self._mtimes = mtimes
        self._etags = None if etags is None else (_joined(etags), _offsets(etags))
        self._stat = stat_key

    # -- making ---------------------------------------------------------------------------------

    @classmethod
    def of_infos(cls, prefix: str, infos: Collection[KeyInfo]) -> PackedFiles | None:
        """The files ``infos`` (full keys below ``prefix``, any order); None where a name
        cannot be encoded (a lone surrogate): such a folder stays a dict."""
        cut = len(prefix)
        return cls.of_items(prefix, [(info.key[cut:], info) for info in infos])

    @classmethod
    def of_items(cls, prefix: str, items: list[tuple[str, KeyInfo]]) -> PackedFiles | None:
        """The files of ``items`` (name, info; any order), as :meth:`of_infos`."""
        try:
            names = [name.encode(ENCODING, ERRORS) for name, _ in items]
        except UnicodeEncodeError:
            return None
        sizes = array("q", [info.size for _, info in items])
        mtimes = array("d", [info.mtime for _, info in items])
        etags = None
        if any(info.etag is not None for _, info in items):
            etags = [b"\0" if i.etag is None else i.etag.encode(ENCODING, ERRORS) for _, i in items]
        if not _ascending(names):
            order = sorted(range(len(names)), key=names.__getitem__)
            names = [names[i] for i in order]
            sizes = array("q", [sizes[i] for i in order])
            mtimes = array("d", [mtimes[i] for i in order])
            etags = None if etags is None else [etags[i] for i in order]
        return cls(prefix, names, sizes, mtimes, etags)

    @classmethod
    def of_names(
        cls, prefix: str, names: list[bytes], stat_key: Callable[[str], KeyInfo | None]
    ) -> PackedFiles:
        """The files named ``names`` (encoded as :data:`ENCODING` says, any order; sorted in
        place), each size and mtime asked of ``stat_key(prefix + name)`` when first wanted."""
        names.sort()
        unknown = array("q", [UNKNOWN]) * len(names)
        return cls(prefix, names, unknown, array("d", bytes(8 * len(names))), None, stat_key)

    def changed(self, added: Mapping[str, KeyInfo], removed: Collection[str]) -> PackedFiles | None:
        """A new packing: these files less ``removed`` and those ``added`` replaces, plus
        ``added`` (an overlay folded in); sizes not known yet stay unknown. None as
        :meth:`of_infos`."""
        try:
            extra = sorted((name.encode(ENCODING, ERRORS), info) for name, info in added.items())
            gone = {name.encode(ENCODING, ERRORS) for name in removed}
        except UnicodeEncodeError:
            return None
        gone.update(raw for raw, _ in extra)
        names: list[bytes] = []
        sizes, mtimes = array("q"), array("d")
        etags: list[bytes] | None = (
            []
            if self._etags is not None or any(info.etag is not None for _, info in extra)
            else None
        )
        at = 0
        for i in range(len(self)):
            raw = self.raw_name(i)
            while at < len(extra) and extra[at][0] < raw:
                _append(names, sizes, mtimes, etags, *extra[at])
                at += 1
            if raw not in gone:
                names.append(raw)
                sizes.append(self._sizes[i])
                mtimes.append(self._mtimes[i])
                if etags is not None:  # b"\0": no ETag (a packing that kept none has none)
                    etags.append(b"\0" if self._etags is None else self._raw_etag(i))
        for raw, info in extra[at:]:
            _append(names, sizes, mtimes, etags, raw, info)
        return PackedFiles(self._prefix, names, sizes, mtimes, etags, self._stat)

    # -- reading --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def raw_name(self, index: int) -> bytes:
        offsets = self._offsets
        return self._blob[offsets[index] : offsets[index + 1]]

    def name(self, index: int) -> str:
        return self.raw_name(index).decode(ENCODING, ERRORS)

    def find(self, raw: bytes) -> int:
        """Where name ``raw`` is, or would be inserted (binary search)."""
        blob, offsets = self._blob, self._offsets
        lo, hi = 0, len(offsets) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if blob[offsets[mid] : offsets[mid + 1]] < raw:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def index(self, name: str) -> int:
        """Where ``name`` is listed, -1 where it is not."""
        try:
            raw = name.encode(ENCODING, ERRORS)
        except UnicodeEncodeError:
            return -1
        at = self.find(raw)
        return at if at < len(self) and self.raw_name(at) == raw else -1

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.index(name) >= 0

    def __getitem__(self, name: str) -> KeyInfo:
        at = self.index(name)
        info = None if at < 0 else self.info(at)
        if info is None:
            raise KeyError(name)
        return info

    def __iter__(self) -> Iterator[str]:
        return map(self.name, range(len(self)))

    def size_mtime(self, index: int) -> tuple[int, float] | None:
        """The size and mtime of the file at ``index`` (asked of ``stat`` the first time in
        a listing of names), None where it is gone."""
        size = self._sizes[index]
        if size == UNKNOWN and self._stat is not None:
            found = self._stat(self._prefix + self.name(index))
            if found is None:
                self._sizes[index] = size = GONE
            else:
                self._mtimes[index] = found.mtime
                self._sizes[index] = size = found.size
        if size < 0:
            return None
        return size, self._mtimes[index]

    def known(self, index: int) -> tuple[int, float] | None:
        """:meth:`size_mtime` where it is known without a ``stat`` (else None)."""
        size = self._sizes[index]
        return None if size < 0 else (size, self._mtimes[index])

    def info(self, index: int) -> KeyInfo | None:
        known = self.size_mtime(index)
        if known is None:
            return None
        raw = None if self._etags is None else self._raw_etag(index)
        etag = None if raw is None or raw == b"\0" else raw.decode(ENCODING, ERRORS)
        return KeyInfo(self._prefix + self.name(index), known[0], known[1], etag)

    def _raw_etag(self, index: int) -> bytes:
        assert self._etags is not None
        blob, offsets = self._etags
        return blob[offsets[index] : offsets[index + 1]]

    def items(self) -> ItemsView[str, KeyInfo]:
        return _PackedItems(self)

    @property
    def nbytes(self) -> int:
        """About what this packing holds in memory."""
        extra = 0 if self._etags is None else len(self._etags[0]) + 4 * len(self._etags[1])
        return 200 + len(self._blob) + (_PACKED_ENTRY + self._offsets.itemsize) * len(self) + extra


def _ascending(names: list[bytes]) -> bool:
    return all(map(operator.lt, names, itertools.islice(names, 1, None)))


def _append(
    names: list[bytes],
    sizes: array[int],
    mtimes: array[float],
    etags: list[bytes] | None,
    raw: bytes,
    info: KeyInfo,
) -> None:
    names.append(raw)
    sizes.append(info.size)
    mtimes.append(info.mtime)
    if etags is not None:
        etags.append(b"\0" if info.etag is None else info.etag.encode(ENCODING, ERRORS))


class _PackedItems(ItemsView[str, "KeyInfo"]):
    _mapping: PackedFiles

    def __iter__(self) -> Iterator[tuple[str, KeyInfo]]:
        files = self._mapping
        for index in range(len(files)):
            info = files.info(index)
            if info is not None:
                yield files.name(index), info


class FileMap(Mapping[str, "KeyInfo"]):
    """An immutable name -> KeyInfo map that changes cheaply: a shared base (one LIST, never
    mutated; a :class:`PackedFiles`, or a dict) plus a small overlay of names added and
    removed since.

    Why not a plain dict copied on every change: writing 50,000 chunks into one Zarr v2
    folder would copy the folder's map 50,000 times (quadratic). Here a change copies only
    the overlay, and the overlay is folded into a new base once it outgrows the square root
    of the base: O(sqrt n) per change, amortized.
    """

    __slots__ = ("_added", "_base", "_packed", "_removed")

    def __init__(
        self,
        base: Mapping[str, KeyInfo],
        added: Mapping[str, KeyInfo] | None = None,
        removed: frozenset[str] = frozenset(),
    ) -> None:
        self._base = base
        self._added = added or {}
        self._removed = removed
        self._packed: PackedFiles | None = None

    def __getitem__(self, name: str) -> KeyInfo:
        info = self._added.get(name)
        if info is not None:
            return info
        if name in self._removed:
            raise KeyError(name)
        return self._base[name]

    def __contains__(self, name: object) -> bool:
        if name in self._added:
            return True
        return name not in self._removed and name in self._base

    def __iter__(self) -> Iterator[str]:
        if not self._added and not self._removed:
            return iter(self._base)
        return self._merged()

    def _merged(self) -> Iterator[str]:
        yield from self._added
        for name in self._base:
            if name not in self._added and name not in self._removed:
                yield name

    def __len__(self) -> int:
        base = self._base
        new = sum(1 for name in self._added if name not in base)
        return len(base) - len(self._removed) + new  # (removed: names of the base only)

    def items(self) -> ItemsView[str, KeyInfo]:
        """Every name with its info; a folder listed once and not changed since yields its
        listing's own pairs (readdir of 50,000 files asks for all of them: a lookup per name
        through :meth:`__getitem__` cost a quarter of the gateway's part)."""
        return _FileMapItems(self)

    def packed(self) -> PackedFiles | None:
        """These files as one :class:`PackedFiles` (the overlay folded in, once per value),
        None where a name cannot be packed: what a readdir pages through."""
        if self._packed is None:
            base = self._base
            if isinstance(base, PackedFiles):
                clean = not self._added and not self._removed
                self._packed = base if clean else base.changed(self._added, self._removed)
            else:  # a dict (made by hand): its keys' folder is what their names leave over
                items = [*self.items()]
                key, name = (items[0][1].key, items[0][0]) if items else ("", "")
                prefix = key[: len(key) - len(name)] if key.endswith(name) else ""
                self._packed = PackedFiles.of_items(prefix, items)
        return self._packed

    def with_item(self, name: str, info: KeyInfo) -> FileMap:
        return self._compacted({**self._added, name: info}, self._removed - {name})

    def without(self, name: str) -> FileMap:
        if name not in self:
            return self
        added = {k: v for k, v in self._added.items() if k != name}
        removed = self._removed | {name} if name in self._base else self._removed
        return self._compacted(added, removed)

    def _compacted(self, added: dict[str, KeyInfo], removed: frozenset[str]) -> FileMap:
        changed = FileMap(self._base, added, removed)
        if len(added) + len(removed) <= max(32, math.isqrt(len(self._base))):
            return changed
        base = self._base
        if isinstance(base, PackedFiles):
            folded = base.changed(added, removed)
            if folded is not None:
                return FileMap(folded)
        merged = {k: v for k, v in base.items() if k not in removed}
        merged.update(added)
        return FileMap(merged)

    @property
    def nbytes(self) -> int:
        """About what this map holds in memory (a cache weighs listings by it)."""
        base = self._base
        held = base.nbytes if isinstance(base, PackedFiles) else _OBJECT_ENTRY * len(base)
        return held + _OBJECT_ENTRY * (len(self._added) + len(self._removed))


class _FileMapItems(ItemsView[str, "KeyInfo"]):
    _mapping: FileMap

    def __iter__(self) -> Iterator[tuple[str, KeyInfo]]:
        files = self._mapping
        if not files._added and not files._removed:
            return iter(files._base.items())
        return _present(files)


def _present(files: FileMap) -> Iterator[tuple[str, KeyInfo]]:
    for name in files:
        info = files.get(name)
        if info is not None:  # (a packed file gone since its listing has none)
            yield name, info


@dataclass(frozen=True)
class DirEntries:
    """One folder's direct children, as one LIST showed them (then changed by our commits).

    Immutable: a change makes a new value (``with_file`` and friends), so a thread iterating
    a listing never sees it change (the sizes a listing of names learns as it is asked are a
    memo: :class:`PackedFiles`).
    """

    files: FileMap = field(default_factory=lambda: FileMap({}))
    dirs: frozenset[str] = frozenset()

    def with_file(self, name: str, info: KeyInfo) -> DirEntries:
        return DirEntries(self.files.with_item(name, info), self.dirs)

    def without_file(self, name: str) -> DirEntries:
        files = self.files.without(name)
        return self if files is self.files else DirEntries(files, self.dirs)

    def with_dir(self, name: str) -> DirEntries:
        return self if name in self.dirs else DirEntries(self.files, self.dirs | {name})

    def without_dir(self, name: str) -> DirEntries:
        return DirEntries(self.files, self.dirs - {name}) if name in self.dirs else self

    @property
    def nbytes(self) -> int:
        """About what this listing holds in memory: the weight the listings cache gives it."""
        return self.files.nbytes + 100 * len(self.dirs)

    @classmethod
    def from_listing(cls, prefix: str, listing: Listing) -> DirEntries:
        keys: Collection[KeyInfo] = listing.keys
        dirs = {p[len(prefix) : -1] for p in listing.prefixes}
        if not prefix:  # the control name shadows any stored key of the same name
            keys = [info for info in keys if info.key != CONTROL]
            dirs.discard(CONTROL)
        return cls(_file_map(prefix, keys), frozenset(dirs))

    @classmethod
    def from_names(
        cls,
        prefix: str,
        files: Sequence[bytes],
        dirs: Sequence[bytes],
        stat_key: Callable[[str], KeyInfo | None],
    ) -> DirEntries:
        """A listing of names alone (:class:`~n5fs.kvstore.abilities.NameListings`, names as
        their bytes): each file's size and mtime asked of ``stat_key`` when first wanted."""
        folders = {name.decode(ENCODING, ERRORS) for name in dirs}
        names = files if isinstance(files, list) else [*files]
        if not prefix:  # the control name shadows any stored key of the same name
            names = [name for name in names if name != _CONTROL_RAW]
            folders.discard(CONTROL)
        return cls(FileMap(PackedFiles.of_names(prefix, names, stat_key)), frozenset(folders))


def _file_map(prefix: str, infos: Collection[KeyInfo]) -> FileMap:
    """``infos`` packed, or a dict where a name cannot be packed."""
    packed = PackedFiles.of_infos(prefix, infos)
    if packed is not None:
        return FileMap(packed)
    return FileMap({info.key[len(prefix) :]: info for info in infos})


class DirListing(Sequence[tuple[str, Attr]]):
    """A folder's entries as ``readdir`` answers them: ``(name, Attr)`` sorted by name (by
    the names' bytes: for UTF-8 names, their code points), made as they are read, not all
    at once: the stored files are the folder's :class:`PackedFiles` as they are (shared
    with the listings cache), and only the few other entries (folders, links, files being
    written, virtual folders), each of which replaces a stored file of its name, are held
    here. A readdir of a million chunks thus makes no object per entry until it is read, and
    a plain readdir (``ls``, ``find``: the kernel reads the type alone) none at all
    (:meth:`raw_from`), nor a ``stat`` in a listing of names.

    Immutable (a snapshot: a commit since makes a new listing, not a change of this one).
    A stored file gone since its folder was listed by names (:data:`GONE`) shows size 0.
    """

    __slots__ = ("_at", "_file_attr", "_files", "_inserted", "_replaced")

    def __init__(self, files: PackedFiles, extras: Mapping[str, Attr], *, writable: bool) -> None:
        """Raises UnicodeEncodeError where an extra's name cannot be packed."""
        self._files = files
        self._file_attr = Attr(EntryKind.FILE, writable=writable)
        ordered = sorted(
            (name.encode(ENCODING, ERRORS), name, attr) for name, attr in extras.items()
        )
        self._at: list[int] = []  # where each inserted entry is in this listing
        self._inserted: list[tuple[bytes, str, Attr]] = []
        self._replaced: dict[int, tuple[bytes, str, Attr]] = {}  # file index -> entry
        for raw, name, attr in ordered:
            at = files.find(raw)
            if at < len(files) and files.raw_name(at) == raw:
                self._replaced[at] = (raw, name, attr)
            else:
                self._at.append(at + len(self._inserted))
                self._inserted.append((raw, name, attr))

    def __len__(self) -> int:
        return len(self._files) + len(self._inserted)

    @property
    def file_attr(self) -> Attr:
        """An entry's attributes as far as a plain readdir needs them (its type)."""
        return self._file_attr

    def raw_from(self, start: int) -> Iterator[tuple[int, bytes, Attr | None]]:
        """``(index, name's bytes, attributes)`` from ``start`` on; None for a stored file,
        whose attributes :meth:`stored_attr` makes (maybe at the cost of a ``stat``)."""
        at, inserted, replaced, files = self._at, self._inserted, self._replaced, self._files
        k = bisect.bisect_left(at, start)
        f = start - k
        raw_name = files.raw_name
        for index in range(start, len(self)):
            if k < len(at) and at[k] == index:
                raw, _, attr = inserted[k]
                k += 1
                yield index, raw, attr
                continue
            entry = replaced.get(f) if replaced else None
            if entry is None:
                yield index, raw_name(f), None
            else:
                yield index, entry[0], entry[2]
            f += 1

    def stored_attr(self, index: int, *, ask: bool = True) -> Attr | None:
        """The attributes of the stored file at ``index`` of this listing; where they are
        not known yet (a listing of names), asked of ``stat`` or (``ask`` False) None."""
        f = index - bisect.bisect_left(self._at, index)
        known = self._files.size_mtime(f) if ask else self._files.known(f)
        if known is None:
            return self._file_attr if ask else None
        return Attr(EntryKind.FILE, known[0], known[1], self._file_attr.writable)

    @overload
    def __getitem__(self, index: int) -> tuple[str, Attr]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, Attr]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, Attr] | list[tuple[str, Attr]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        _, raw, attr = next(self.raw_from(index))
        return raw.decode(ENCODING, ERRORS), attr or self._stored(index)

    def __iter__(self) -> Iterator[tuple[str, Attr]]:
        for index, raw, attr in self.raw_from(0):
            yield raw.decode(ENCODING, ERRORS), attr or self._stored(index)

    def _stored(self, index: int) -> Attr:
        attr = self.stored_attr(index)
        assert attr is not None  # (asked)
        return attr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # compared by content, as a list

    def __repr__(self) -> str:
        return f"DirListing({len(self)} entries)"


@dataclass
class _OpenFolder:
    """A folder a flat listing is still inside (mutable while it fills)."""

    prefix: str
    born: float  # when the read of its first key began
    files: dict[str, KeyInfo] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    def entries(self) -> tuple[str, DirEntries, float]:
        files = _file_map(self.prefix, [*self.files.values()])
        return self.prefix, DirEntries(files, frozenset(self.dirs)), self.born


class FolderSplitter:
    """Per-folder entries from a flat (delimiter-less) listing of ``prefix`` that comes in
    key order: a folder's keys are then one run, so a folder is whole as soon as a key
    outside it arrives, and is handed out at once (the listing is never held twice: only the
    folders on the path to the latest key are open).

    ``add`` returns the folders the key closed, ``finish`` the rest (call it only when the
    listing ended; a listing cut short leaves its open folders unanswered). Each comes with
    the time the read of its first key began (``born``), the age a cache must give it.
    """

    def __init__(self, prefix: str, born: float) -> None:
        self._open = [_OpenFolder(prefix, born)]
        self._last = ""

    def add(self, info: KeyInfo, born: float) -> list[tuple[str, DirEntries, float]]:
        key = info.key
        if key <= self._last:
            raise ValueError(f"listing not in key order: {key!r} after {self._last!r}")
        self._last = key
        folder = key[: key.rfind("/") + 1]
        root = self._open[0].prefix
        if not folder.startswith(root) or (not root and is_control(key)):
            return []  # not below (a store answering more than asked); the control name hides
        closed = []
        while not folder.startswith(self._open[-1].prefix):
            closed.append(self._open.pop().entries())
        while (top := self._open[-1]).prefix != folder:
            sub = folder[: folder.index("/", len(top.prefix)) + 1]
            top.dirs.add(sub[len(top.prefix) : -1])
            self._open.append(_OpenFolder(sub, born))
        self._open[-1].files[key[len(folder) :]] = info
        return closed

    def finish(self) -> list[tuple[str, DirEntries, float]]:
        closed = [folder.entries() for folder in reversed(self._open)]
        self._open = self._open[:1]
        return closed


def statfs_of(root: object) -> dict[str, int]:
    """The backing filesystem's numbers for a file store; generous fixed ones otherwise."""
    if isinstance(root, (str, os.PathLike)) and os.path.isdir(root):
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
