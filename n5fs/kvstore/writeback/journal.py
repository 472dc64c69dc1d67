"""The journal on disk: an append-only log of accepted writes, durable before a write is
acknowledged.

A write-back mount answers ``close()`` once the bytes are here, so this folder is the only
copy of an accepted write until its upload lands; everything about it serves one promise:
after a crash, ``kill -9`` or power loss, the next mount of the same source finds every
acknowledged write, whole, in the order it was accepted.

Layout (under :func:`~n5fs.kvstore.state.state_home`)::

    writeback/<digest>-<n>/        one folder per live mount of a source (digest: of its URL)
        lock                       flock-ed by the mount that owns the folder
        source                     the source's URL, for people and ``n5fs status``
        00000001.log               segments: records appended one after the other
        done                       "<segment> <offset>" of records whose upload landed

A record is ``N5WB``, the length of its header, the header (JSON: key, size, kept mtime,
when accepted, whether it is a delete), the value's bytes and a CRC32 of header and bytes.
Why a log and not a file per write: a write is then one ``write`` and one ``fdatasync`` of a
file that only grows, where a new file per write costs a create, a rename and two fsyncs (a
file's and its folder's) - on a busy disk 25 times as long. Concurrent writers share one
``fdatasync`` (group commit): each waits until the log is synced past its record.

A segment is removed once every record in it is settled (uploaded, replaced or dropped) and
it is not the one being appended to; ``done`` remembers settled records of the segments
still there (appended without a sync: a mark lost in a crash only makes the next mount upload
that value once more). On replay a record cut short at the end of a segment was never
acknowledged (its writer was still waiting for the sync) and is cut off; a record that fails
its CRC with good records after it is damage (a disk fault): copied to
``writeback/damaged/``, reported, never uploaded.

Two mounts of one source on one machine each take their own folder (``-1``, ``-2``, ...): a
folder whose lock is free belongs to nobody alive, and the next mount of that source adopts
its segments (after its own, in their order) and removes it.

Thread safety: one condition, ``_cond``, guards the segments (appends, the group sync, the
live counts); a sync is done with it released by one writer at a time. Reads open the segment
by path and need no lock (a removed segment is a FileNotFoundError: the caller asks again).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from n5fs.errors import StoreUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["Entry", "Journal", "Orphan", "journal_root", "orphans"]

MAGIC = b"N5WB"
_PREFIX = struct.Struct("<4sI")  # magic, header length
_TRAILER = struct.Struct("<I")  # CRC32 of header and bytes
SUFFIX = ".log"
#: a segment this long is not appended to any more
SEGMENT_BYTES = 64 << 20
#: values this large are uploaded from a map of their segment, not read into memory
MAP_FROM = 16 << 20
#: pieces a file is copied into the journal in
_COPY = 1 << 20
_MAX_HEADER = 1 << 16


def journal_root(state: Path) -> Path:
    """The folder every write-back journal of this user lives in."""
    return state / "writeback"


@dataclass(frozen=True)
class Orphan:
    """A journal folder no live mount holds, with writes in it: the next mount of
    ``source`` uploads them (``n5fs status`` says so)."""

    folder: Path
    source: str
    segments: int
    bytes: int


def orphans(root: Path) -> list[Orphan]:
    """The journal folders under ``root`` whose lock is free and that hold segments."""
    found = []
    for folder in sorted(root.glob("*-*")) if root.is_dir() else []:
        logs = sorted(folder.glob("*" + SUFFIX))
        if not logs:
            continue
        try:
            fd = os.open(folder / "lock", os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live mount's
        finally:
            os.close(fd)  # closing drops a lock this probe took
        try:
            source = (folder / "source").read_text().strip()
        except OSError:
            source = "?"
        size = sum(p.stat().st_size for p in logs if p.exists())
        found.append(Orphan(folder, source, len(logs), size))
    return found


@dataclass(eq=False, slots=True)
class Entry:
    """One accepted write, as the journal holds it. Identity matters (``eq=False``): the
    pending table compares entries by ``is``."""

    seq: int
    key: str
    size: int
    #: the modification time to keep with the value; None: the store's own
    mtime: float | None
    #: the segment holding it, and where in it the value's bytes start
    path: Path
    offset: int
    #: when the write was accepted (``time.time()``)
    accepted: float
    #: a delete of the key, not a value (a *tombstone*: no bytes)
    deleted: bool = False
    #: where its record starts (its name in ``done``)
    record: int = 0


@dataclass(eq=False)
class _Segment:
    number: int
    path: Path
    fd: int = -1
    #: bytes written, and bytes known to be on disk
    end: int = 0
    synced: int = 0
    syncing: bool = False
    #: records not settled yet
    live: int = 0
    done: set[int] = field(default_factory=set)


class Journal:
    """One mount's journal folder (module docstring); made with :meth:`open`."""

    def __init__(
        self,
        folder: Path,
        lock_fd: int,
        segments: list[_Segment],
        replayed: list[Entry],
        source: str,
        highest: int = 0,
    ) -> None:
        self.folder = folder
        self.source = source
        #: what an earlier mount of the source left, in the order it was accepted
        self.replayed = replayed
        self._lock_fd = lock_fd
        self._cond = threading.Condition()
        self._segments = {s.number: s for s in segments}
        self._by_path = {s.path: s for s in segments}
        self._seq = itertools.count(len(replayed) + 1)
        self._current: _Segment | None = None
        #: numbers of new segments: past every number a segment or a ``done`` mark had
        self._numbers = itertools.count(highest + 1)
        self._done_fd = os.open(folder / "done", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._closed = False
        for segment in segments:
            if segment.live == 0:
                self._unlink(segment)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, root: Path, source: str) -> Journal:
        """Take a free journal folder of ``source`` under ``root`` (making one where none is
        free), adopt the segments of every other free one, and load what it holds."""
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder, fd = _take_folder(root, digest)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot keep a write-back journal under {root}: {exc} (set N5FS_STATE_DIR, or "
                "mount with -o writeback=off)"
            ) from exc
        try:
            (folder / "source").write_text(source + "\n")
            _adopt_free_siblings(root, digest, folder)
            segments, replayed, highest = _load(folder, root / "damaged")
        except BaseException:
            os.close(fd)
            raise
        return cls(folder, fd, segments, replayed, source, highest)

    # -- writing ---------------------------------------------------------------------------------

    def append(
        self,
        key: str,
        *,
        value: bytes | memoryview | None = None,
        parts: Sequence[bytes | memoryview] | None = None,
        from_file: str | os.PathLike[str] | None = None,
        from_entry: Entry | None = None,
        mtime: float | None = None,
        deleted: bool = False,
    ) -> Entry:
        """Write one accepted value durably (from ``value``, its ``parts``, a local file or
        another entry's bytes; none of them: a delete of ``key``) and return its entry;
        raises OSError (ENOSPC, EIO; FileNotFoundError when ``from_entry``'s segment is gone)
        with nothing acknowledged."""
        accepted = time.time()
        with self._cond:
            segment = self._segment_to_append()
            start = segment.end
            try:
                size, written, header = _write_record(
                    segment.fd, key, value, parts, from_file, from_entry, mtime, accepted, deleted
                )
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(segment.fd, start)
                raise
            segment.end = start + written
            segment.live += 1
            self._sync_to(segment, segment.end)
        offset = start + _PREFIX.size + header
        return Entry(
            next(self._seq), key, size, mtime, segment.path, offset, accepted, deleted, start
        )

    def _segment_to_append(self) -> _Segment:
        current = self._current
        if current is not None and current.end < SEGMENT_BYTES:
            return current
        number = next(self._numbers)
        path = self.folder / f"{number:08d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        _fsync_folder(self.folder)  # the new name survives a power loss
        segment = _Segment(number, path, fd)
        self._segments[number] = segment
        self._by_path[path] = segment
        self._current = segment
        if current is not None and current.live == 0:
            self._unlink(current)
        return segment

    def _sync_to(self, segment: _Segment, end: int) -> None:
        """Return once ``segment`` is on disk up to ``end``: one writer syncs for everyone
        waiting (caller holds ``_cond``; it is released during the sync)."""
        while segment.synced < end:
            if segment.syncing:
                self._cond.wait()
                continue
            segment.syncing = True
            target = segment.end
            self._cond.release()
            try:
                os.fdatasync(segment.fd)
            finally:
                self._cond.acquire()
                segment.syncing = False
                self._cond.notify_all()
            segment.synced = max(segment.synced, target)

    # -- reading ---------------------------------------------------------------------------------

    @staticmethod
    def read(entry: Entry, start: int = 0, stop: int | None = None) -> bytes:
        """``entry``'s bytes ``[start:stop]``; FileNotFoundError once its segment is gone."""
        end = entry.size if stop is None else min(stop, entry.size)
        with open(entry.path, "rb", buffering=0) as f:
            if end <= start:
                return b""
            return _pread_exactly(f.fileno(), end - start, entry.offset + start, entry)

    @staticmethod
    @contextlib.contextmanager
    def value(entry: Entry) -> Iterator[bytes]:
        """``entry``'s whole value for its upload: read into memory when small, mapped from
        the segment when large (its pages then come and go with the page cache)."""
        if entry.size < MAP_FROM:
            yield Journal.read(entry)
            return
        with open(entry.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)[entry.offset : entry.offset + entry.size]
            try:
                # a bytes-like view where bytes are declared: the stores take any buffer
                yield cast("bytes", view)
            finally:
                view.release()

    # -- settling --------------------------------------------------------------------------------

    def remove(self, entry: Entry) -> None:
        """The entry is settled (uploaded, replaced by a later write, or dropped): marked in
        ``done``, and its segment removed once nothing in it is live. Once per entry."""
        with self._cond:
            segment = self._by_path.get(entry.path)
            if segment is None or entry.record in segment.done:
                return
            segment.done.add(entry.record)
            segment.live -= 1
            if segment.live == 0 and segment is not self._current:
                self._unlink(segment)
                return
        with contextlib.suppress(OSError):
            os.write(self._done_fd, f"{segment.number} {entry.record}\n".encode())

    def _unlink(self, segment: _Segment) -> None:
        """Remove a segment nothing in it is live (caller holds ``_cond``)."""
        self._segments.pop(segment.number, None)
        self._by_path.pop(segment.path, None)
        if segment.fd >= 0:
            os.close(segment.fd)
            segment.fd = -1
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()

    def pending_on_disk(self) -> int:
        """Records not settled (for tests and the last words of an unmount)."""
        with self._cond:
            return sum(s.live for s in self._segments.values())

    def close(self) -> None:
        """Give the folder up: removed when nothing is pending (a later mount then makes a
        fresh one), kept with its segments otherwise, for the next mount of the source."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            live = sum(s.live for s in self._segments.values())
            for segment in list(self._segments.values()):
                if segment.live == 0:
                    self._unlink(segment)
                elif segment.fd >= 0:
                    os.close(segment.fd)
                    segment.fd = -1
            os.close(self._done_fd)
        if not live:
            with contextlib.suppress(OSError):
                for name in ("done", "source", "lock"):
                    (self.folder / name).unlink(missing_ok=True)
                self.folder.rmdir()
        os.close(self._lock_fd)


# == the record format ==============================================================================


def _header(key: str, size: int, mtime: float | None, accepted: float, *, deleted: bool) -> bytes:
    doc = {"key": key, "size": size, "mtime": mtime, "accepted": accepted, "deleted": deleted}
    return json.dumps(doc, separators=(",", ":")).encode()


def _write_record(
    fd: int,
    key: str,
    value: bytes | memoryview | None,
    parts: Sequence[bytes | memoryview] | None,
    from_file: str | os.PathLike[str] | None,
    from_entry: Entry | None,
    mtime: float | None,
    accepted: float,
    deleted: bool,
) -> tuple[int, int, int]:
    """Append one record; returns (value size, bytes written, header length)."""
    if value is not None:
        pieces: Sequence[bytes | memoryview] = [value]
    elif parts is not None:
        pieces = parts
    else:
        pieces = []
    if from_entry is not None:
        size = from_entry.size
    elif from_file is not None:
        size = os.path.getsize(from_file)
    else:
        size = sum(len(memoryview(p).cast("B")) for p in pieces)
    header = _header(key, size, mtime, accepted, deleted=deleted)
    crc = zlib.crc32(header)
    _write_all(fd, _PREFIX.pack(MAGIC, len(header)) + header)
    written = 0
    for piece in _pieces(pieces, from_file, from_entry):
        crc = zlib.crc32(piece, crc)
        written += len(piece)
        _write_all(fd, piece)
    if written != size:
        raise StoreUnavailable(f"/{key}: its source changed while it was journaled")
    _write_all(fd, _TRAILER.pack(crc))
    return size, _PREFIX.size + len(header) + size + _TRAILER.size, len(header)


def _pieces(
    pieces: Sequence[bytes | memoryview],
    from_file: str | os.PathLike[str] | None,
    from_entry: Entry | None,
) -> Iterator[bytes | memoryview]:
    if from_entry is not None:
        with open(from_entry.path, "rb", buffering=0) as src:
            src.seek(from_entry.offset)
            left = from_entry.size
            while left and (piece := src.read(min(_COPY, left))):
                left -= len(piece)
                yield piece
        return
    if from_file is not None:
        with open(from_file, "rb", buffering=0) as src:
            while piece := src.read(_COPY):
                yield piece
        return
    yield from pieces


def _load(folder: Path, damaged: Path) -> tuple[list[_Segment], list[Entry], int]:
    """The folder's segments, their live records in order, and the highest segment number
    named anywhere; a torn tail cut off, damaged records set aside."""
    done: dict[int, set[int]] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in (folder / "done").read_text().splitlines():
            name, _, record = line.partition(" ")
            with contextlib.suppress(ValueError):
                done.setdefault(int(name), set()).add(int(record))
    segments: list[_Segment] = []
    entries: list[Entry] = []
    for path in sorted(folder.glob("*" + SUFFIX)):
        number = int(path.name[: -len(SUFFIX)])
        segment = _Segment(number, path, done=done.get(number, set()))
        for entry in _records(path, damaged):
            if entry.record in segment.done:
                continue
            segment.live += 1
            entries.append(entry)
        segments.append(segment)
    for seq, entry in enumerate(entries, 1):
        entry.seq = seq
    # rewritten with the marks of the segments still there: a segment number is never used
    # again while a mark names it (:attr:`Journal._numbers` starts past every one)
    marks = [f"{s.number} {r}\n" for s in segments if s.live for r in sorted(s.done)]
    tmp = folder / ".done.tmp"
    tmp.write_text("".join(marks))
    os.rename(tmp, folder / "done")
    return segments, entries, max([*done, *(s.number for s in segments)], default=0)


def _records(path: Path, damaged: Path) -> Iterator[Entry]:
    """The good records of one segment, in order (module docstring)."""
    cut: int | None = None
    with open(path, "r+b") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for entry, end in _scan(data, path, damaged):
                if entry is None:
                    cut = end
                    break
                yield entry
        if cut is not None:
            log.info("write-back journal %s: an unacknowledged record cut off at %d", path, cut)
            f.truncate(cut)


def _scan(data: mmap.mmap, path: Path, damaged: Path) -> Iterator[tuple[Entry | None, int]]:
    """(entry, end) per good record; (None, where to cut) for a torn tail, then stop."""
    pos = 0
    while pos < len(data):
        parsed = _parse(data, pos, path)
        if isinstance(parsed, Entry):
            pos = parsed.offset + parsed.size + _TRAILER.size
            yield parsed, pos
            continue
        reason, length = parsed
        if length is None or not _good_record_after(data, pos + length, path):
            yield None, pos
            return
        damaged.mkdir(parents=True, exist_ok=True, mode=0o700)
        aside = damaged / f"{path.parent.name}-{path.name}-{pos}"
        aside.write_bytes(data[pos : pos + length])
        log.error(
            "write-back journal %s: the record at %d is damaged (%s): copied to %s, not uploaded",
            path,
            pos,
            reason,
            aside,
        )
        pos += length


def _parse(data: bytes | mmap.mmap, pos: int, path: Path) -> Entry | tuple[str, int | None]:
    """The record at ``pos``, or (why not, its length where the header says it)."""
    if len(data) - pos < _PREFIX.size:
        return "torn", None
    magic, header_len = _PREFIX.unpack_from(data, pos)
    if magic != MAGIC or header_len > _MAX_HEADER:
        return "no record starts here", None
    start = pos + _PREFIX.size
    try:
        doc = json.loads(data[start : start + header_len])
        key, size = doc["key"], doc["size"]
        if not (isinstance(key, str) and isinstance(size, int)):
            return "its header is not a record's", None
    except (ValueError, KeyError, TypeError):
        return "its header is torn", None
    offset = start + header_len
    length = _PREFIX.size + header_len + size + _TRAILER.size
    if offset + size + _TRAILER.size > len(data):
        return "torn", None
    (crc,) = _TRAILER.unpack_from(data, offset + size)
    if zlib.crc32(data[offset : offset + size], zlib.crc32(data[start:offset])) != crc:
        return "its bytes fail their CRC32", length
    mtime, accepted = doc.get("mtime"), doc.get("accepted", 0.0)
    deleted = doc.get("deleted", False) is True
    return Entry(0, key, size, mtime, path, offset, float(accepted), deleted, pos)


def _good_record_after(data: bytes | mmap.mmap, pos: int, path: Path) -> bool:
    return pos < len(data) and isinstance(_parse(data, pos, path), Entry)


def _take_folder(root: Path, digest: str) -> tuple[Path, int]:
    """The first folder ``<digest>-<n>`` whose lock this process gets (made if absent)."""
    for n in itertools.count(1):
        folder = root / f"{digest}-{n}"
        folder.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not (folder / "lock").exists():  # removed by the mount that gave it up: again
            os.close(fd)
            continue
        return folder, fd
    raise AssertionError("unreachable")


def _adopt_free_siblings(root: Path, digest: str, mine: Path) -> None:
    """Move the segments of every free folder of the same source into ``mine``, after its
    own, in their order (with their ``done`` marks); remove the emptied folders."""
    last = max((int(p.name[: -len(SUFFIX)]) for p in mine.glob("*" + SUFFIX)), default=0)
    for folder in sorted(root.glob(f"{digest}-*")):
        if folder == mine or not folder.is_dir():
            continue
        try:
            fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live mount's
            renumbered: dict[int, int] = {}
            for path in sorted(folder.glob("*" + SUFFIX)):
                last += 1
                renumbered[int(path.name[: -len(SUFFIX)])] = last
                os.rename(path, mine / f"{last:08d}{SUFFIX}")
            marks = []
            with contextlib.suppress(FileNotFoundError):
                for line in (folder / "done").read_text().splitlines():
                    number, _, record = line.partition(" ")
                    if number.isdigit() and int(number) in renumbered:
                        marks.append(f"{renumbered[int(number)]} {record}\n")
            if marks:
                with open(mine / "done", "a") as done:
                    done.writelines(marks)
            if renumbered:
                log.info("adopted %d journal segments of %s", len(renumbered), folder)
                _fsync_folder(mine)
            for path in folder.iterdir():
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()
        finally:
            os.close(fd)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pread_exactly(fd: int, n: int, offset: int, entry: Entry) -> bytes:
    out = bytearray()
    while len(out) < n:
        piece = os.pread(fd, n - len(out), offset + len(out))
        if not piece:
            raise StoreUnavailable(f"write-back journal {entry.path} is shorter than it said")
        out += piece
    return bytes(out)
