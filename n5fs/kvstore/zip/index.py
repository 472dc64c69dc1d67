"""The index of a zip archive as a store exposes it, and reads of its members by range.

Why apart from :mod:`~n5fs.kvstore.zip.store`: the store owns what changes (the overlay of pending
writes, the swap of a rewritten archive, the locks that order them); what an archive *holds*
is an immutable value built once per load or flush, and reading a member through it takes no
lock (the store counts the read as a reader, so the archive is not swapped underneath it). So
the store holds its condition for the pointer to the current :class:`ArchiveIndex` only,
never around the ranged GETs of a member.

An index maps every exposed key (a member name under the store's inner ``path``, minus that
path) to its :class:`~n5fs.kvstore.zip.format.Member`, keeps the keys sorted for listings by
bisection, and names the directory entries (they make prefixes). Member names that could
escape (:func:`~n5fs.kvstore.zip.format.safe_name` refuses them) are left out; the caller is
told which, to warn once. Of duplicate names, the last member wins, as ``unzip`` has it.

State: an :class:`ArchiveIndex` is frozen except for ``data_offsets``, a cache of where each
member's data starts (found by reading its local header), filled by readers without a lock:
one ``dict`` store per entry, atomic under the GIL, and every reader computes the same value.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.errors import StoreCorrupt
from n5fs.kvstore.base import ByteRange, KeyInfo, slice_bytes
from n5fs.kvstore.zip import format as zf
from n5fs.kvstore.zip import rewrite as zr

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from n5fs.kvstore.base import KvStore

MiB = 1 << 20
_BLOCK = 4 * MiB  # compressed input per ranged read while decoding
_LAST_CHAR = "\U0010ffff"  # sorts after any character a key can hold


@dataclass(frozen=True)
class ArchiveIndex:
    """What the archive in the base holds, as of the last load or flush."""

    size: int = 0
    members: tuple[zf.Member, ...] = ()  # every member once (the last of duplicates wins)
    files: Mapping[str, zf.Member] = field(default_factory=dict)  # exposed key -> member
    order: tuple[str, ...] = ()  # exposed keys, sorted
    dirs: frozenset[str] = frozenset()  # exposed directory entries, relative, ending "/"
    comment: bytes = b""
    start: int = 0
    data_offsets: dict[int, int] = field(default_factory=dict)  # header -> data offset cache


def build_index(
    members: Iterable[zf.Member],
    size: int,
    comment: bytes,
    start: int,
    *,
    inner: str,
    on_hidden: Callable[[list[str]], None],
    data_offsets: dict[int, int] | None = None,
) -> ArchiveIndex:
    """The index of ``members`` as seen under ``inner`` (a prefix, ``""`` for the whole
    archive); ``on_hidden`` gets the sorted names that are never exposed."""
    by_name: dict[str, zf.Member] = {}
    for member in members:
        by_name.pop(member.name, None)
        by_name[member.name] = member
    hidden = {name for name in by_name if not zf.safe_name(name)}
    on_hidden(sorted(hidden))
    files: dict[str, zf.Member] = {}
    dirs: set[str] = set()
    for name, member in by_name.items():
        rel = name[len(inner) :]
        if not name.startswith(inner) or not rel or name in hidden:
            continue
        if member.is_dir:
            dirs.add(rel)
        else:
            files[rel] = member
    order, offsets = tuple(sorted(files)), data_offsets or {}
    kept = tuple(by_name.values())
    return ArchiveIndex(size, kept, files, order, frozenset(dirs), comment, start, offsets)


def load_index(
    base: KvStore,
    archive_key: str,
    fetch: Callable[[int, int], bytes],
    where: str,
    *,
    inner: str,
    on_hidden: Callable[[list[str]], None],
) -> ArchiveIndex:
    """Read the archive's tail (a ``stat`` too when it is larger than the tail), then its
    central directory; an absent or empty archive is an empty index."""
    tail = base.get(archive_key, ByteRange(-zf.TAIL_SIZE))
    if tail is None:
        return ArchiveIndex()
    size = len(tail)
    if size == zf.TAIL_SIZE:
        info = base.stat(archive_key)
        size = info.size if info is not None else size
    if size == 0:
        return ArchiveIndex()
    directory = zf.read_directory(tail, size, fetch, where)
    return build_index(
        directory.members,
        size,
        directory.comment,
        directory.start,
        inner=inner,
        on_hidden=on_hidden,
    )


def live_infos(
    index: ArchiveIndex,
    overlay: Mapping[str, zr.Pending | None],
    prefix: str,
    delimiter: str | None,
) -> Iterator[KeyInfo]:
    """Live keys under ``prefix``: the overlay's, then the archive's; of the archive's keys
    under one sub-prefix only the first live one (enough for the grouping, and a root listing
    of a large archive skips its sub-trees by bisection)."""
    for key, pending in overlay.items():
        if pending is not None and key.startswith(prefix):
            yield KeyInfo(key, pending.size, pending.mtime)
    order = index.order
    i = bisect_left(order, prefix)
    while i < len(order) and order[i].startswith(prefix):
        cut = order[i].find(delimiter, len(prefix)) if delimiter else -1
        sub = order[i][: cut + len(delimiter or "")]
        end = bisect_left(order, sub + _LAST_CHAR, i) if cut >= 0 else i + 1
        for key in order[i:end]:
            if key not in overlay:
                member = index.files[key]
                yield KeyInfo(key, member.size, member.mtime)
                if cut >= 0:
                    break
        i = end


class MemberReads:
    """Reads of members' bytes through ``fetch`` (ranged reads of the archive in its base):
    stored members straight by range, compressed ones decoded with their output bounded by
    the size the directory declares, CRC checked on full reads."""

    def __init__(self, fetch: Callable[[int, int], bytes], where: str) -> None:
        self._fetch = fetch
        self._where = where

    def read(self, index: ArchiveIndex, m: zf.Member, byte_range: ByteRange | None) -> bytes:
        m.check_readable(self._where)
        start, stop = (byte_range or ByteRange(0)).resolve(m.size)
        if stop <= start:
            return b""
        full = start == 0 and stop == m.size
        if m.method == zf.STORED:
            data = self._bytes(index, m, start, stop)
        else:
            blocks = self._blocks(index, m)
            data = zf.decode(m, blocks, stop, full=full, what=self._where)[start:]
        if full:
            zf.check_crc(m, data, self._where)
        return data

    def _bytes(self, index: ArchiveIndex, m: zf.Member, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a member's (compressed) data; on a first visit the local
        header is read in the same request when the range starts near it."""
        at = index.data_offsets.get(m.header_offset)
        if at is None:
            guess = zf.LOCAL_HEADER_SIZE + len(m.raw_name) + len(m.extra) + 40
            span = min(index.size, m.header_offset + guess + (stop if start < MiB else 0))
            head = self._fetch(m.header_offset, span)
            at = m.header_offset + zf.local_data_offset(head, m, self._where)
            index.data_offsets[m.header_offset] = at
            if at + stop <= span:
                return slice_bytes(head, ByteRange(at - m.header_offset + start, stop - start))
        if at + m.csize > index.size:
            raise StoreCorrupt(f"{self._where}: member {m.name!r} runs past the archive's end")
        return self._fetch(at + start, at + stop)

    def _blocks(self, index: ArchiveIndex, m: zf.Member) -> Iterator[bytes]:
        for at in range(0, m.csize, _BLOCK):
            yield self._bytes(index, m, at, min(at + _BLOCK, m.csize))
