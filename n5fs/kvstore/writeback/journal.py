"""The journal on disk: one file per accepted write, durable before the write is acknowledged.

A write-back mount answers ``close()`` once the bytes are here, so this folder is the only
copy of an accepted write until its upload lands; everything about it serves one promise:
after a crash, ``kill -9`` or power loss, the next mount of the same source finds every
acknowledged write, whole, in the order it was accepted.

Layout (under :func:`~n5fs.kvstore.state.state_home`)::

    writeback/<digest>-<n>/        one folder per live mount of a source (digest: of its URL)
        lock                       flock-ed by the mount that owns the folder
        source                     the source's URL, for people and ``n5fs status``
        0000000000000001.put       an accepted write: header, then the value's bytes (a
                                   delete of a key is an entry too, with no bytes)
        .0000000000000002.tmp      being written; not acknowledged yet (removed at replay)

An entry is written to a hidden temp name, fsync-ed, renamed to ``<seq>.put`` and the folder
fsync-ed: only then is the write acknowledged. So a ``.put`` file is whole, or the write was
never acknowledged. Its header carries the key, size, kept mtime and a CRC32 of the bytes, so
replay tells a damaged entry (a disk fault) from a good one: a damaged one is moved to
``writeback/damaged/`` and reported, never uploaded.

Two mounts of one source on one machine each take their own folder (``-1``, ``-2``, ...): a
folder whose lock is free belongs to nobody alive, and the next mount of that source adopts
its entries (renamed into its own folder, after its own in sequence order) and removes it.

Thread safety: :meth:`Journal.append` may run on many threads at once (each writes its own
file; the sequence number comes from an ``itertools.count``, atomic under the GIL). The
in-memory table of what is pending is not kept here (:mod:`~n5fs.kvstore.writeback.pending`).
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
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from n5fs.errors import StoreUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["Entry", "Journal", "journal_root"]

MAGIC = b"n5fs-writeback 1\n"
#: values this large are uploaded from a map of their entry, not read into memory
MAP_FROM = 16 << 20
SUFFIX = ".put"
#: pieces a file is copied into the journal in
_COPY = 1 << 20


def journal_root(state: Path) -> Path:
    """The folder every write-back journal of this user lives in."""
    return state / "writeback"


@dataclass(eq=False, slots=True)
class Entry:
    """One accepted write, as the journal holds it. Identity matters (``eq=False``): the
    pending table compares entries by ``is``."""

    seq: int
    key: str
    size: int
    #: the modification time to keep with the value; None: the store's own
    mtime: float | None
    crc32: int
    path: Path
    #: where the value's bytes start in the file
    offset: int
    #: when the write was accepted (``time.time()``)
    accepted: float
    #: a delete of the key, not a value (a *tombstone*: no bytes)
    deleted: bool = False


class Journal:
    """One mount's journal folder (module docstring); made with :meth:`open`."""

    def __init__(self, folder: Path, lock_fd: int, replayed: list[Entry], source: str) -> None:
        self.folder = folder
        self.source = source
        #: what an earlier mount of the source left, in the order it was accepted
        self.replayed = replayed
        self._lock_fd = lock_fd
        start = max((e.seq for e in replayed), default=0) + 1
        self._seq = itertools.count(start)
        self._closed = False

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, root: Path, source: str) -> Journal:
        """Take a free journal folder of ``source`` under ``root`` (making one where none is
        free), adopt the entries of every other free one, and load what it holds."""
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
            replayed = _load(folder, root / "damaged")
        except BaseException:
            os.close(fd)
            raise
        return cls(folder, fd, replayed, source)

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
        raises OSError (ENOSPC, EIO; FileNotFoundError when ``from_entry`` is gone) with
        nothing acknowledged."""
        seq = next(self._seq)
        final = self.folder / f"{seq:016d}{SUFFIX}"
        tmp = self.folder / f".{seq:016d}.tmp"
        accepted = time.time()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            size, crc, offset = _write_entry(
                fd, key, value, parts, from_file, from_entry, mtime, accepted, deleted=deleted
            )
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        os.rename(tmp, final)
        _fsync_folder(self.folder)
        return Entry(seq, key, size, mtime, crc, final, offset, accepted, deleted)

    # -- reading ---------------------------------------------------------------------------------

    @staticmethod
    def read(entry: Entry, start: int = 0, stop: int | None = None) -> bytes:
        """``entry``'s bytes ``[start:stop]``; FileNotFoundError once the entry is gone."""
        end = entry.size if stop is None else min(stop, entry.size)
        if end <= start:
            # still ask the file: a gone entry must not answer as an empty value
            os.stat(entry.path)
            return b""
        with open(entry.path, "rb", buffering=0) as f:
            f.seek(entry.offset + start)
            return _read_exactly(f.fileno(), end - start, entry)

    @staticmethod
    @contextlib.contextmanager
    def value(entry: Entry) -> Iterator[bytes]:
        """``entry``'s whole value for its upload: read into memory when small, mapped from
        the file when large (its pages then come and go with the page cache)."""
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

    @staticmethod
    def remove(entry: Entry) -> None:
        """The entry's upload landed (or a later write of its key replaced it)."""
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()

    def close(self) -> None:
        """Give the folder up: removed when empty (a later mount then makes a fresh one), kept
        with its entries otherwise, for the next mount of the source."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            if not any(self.folder.glob("*" + SUFFIX)):
                for name in ("source", "lock"):
                    (self.folder / name).unlink(missing_ok=True)
                self.folder.rmdir()
        os.close(self._lock_fd)

    def pending_on_disk(self) -> int:
        """Entries in the folder now (for tests and the last words of an unmount)."""
        return sum(1 for _ in self.folder.glob("*" + SUFFIX))


# == the file format =================================================================================


def _write_entry(
    fd: int,
    key: str,
    value: bytes | memoryview | None,
    parts: Sequence[bytes | memoryview] | None,
    from_file: str | os.PathLike[str] | None,
    from_entry: Entry | None,
    mtime: float | None,
    accepted: float,
    *,
    deleted: bool,
) -> tuple[int, int, int]:
    """Write header and bytes; the header is written last (its size and CRC are known only
    then), at the front: room for it is reserved by writing the bytes after a fixed offset.
    Returns (size, crc32, offset of the bytes)."""
    # the header's length depends on the size and CRC digits: reserve the widest
    reserve = len(_header(key, 2**63, 2**32 - 1, mtime, accepted, deleted=deleted)) + 1
    offset = len(MAGIC) + reserve
    os.lseek(fd, offset, os.SEEK_SET)
    crc, size = 0, 0
    if from_entry is not None:
        with open(from_entry.path, "rb", buffering=0) as src:
            src.seek(from_entry.offset)
            left = from_entry.size
            while left and (piece := src.read(min(_COPY, left))):
                crc = zlib.crc32(piece, crc)
                size += len(piece)
                left -= len(piece)
                _write_all(fd, piece)
        if size != from_entry.size:
            raise StoreUnavailable(f"write-back journal entry {from_entry.path} is short")
    elif from_file is not None:
        with open(from_file, "rb", buffering=0) as src:
            while piece := src.read(_COPY):
                crc = zlib.crc32(piece, crc)
                size += len(piece)
                _write_all(fd, piece)
    else:
        for piece in [value] if value is not None else parts or ():
            crc = zlib.crc32(piece, crc)
            size += len(piece)
            _write_all(fd, piece)
    header = _header(key, size, crc, mtime, accepted, deleted=deleted)
    os.pwrite(fd, MAGIC + header.ljust(reserve - 1) + b"\n", 0)  # JSON has no raw newline
    return size, crc, offset


def _header(
    key: str, size: int, crc: int, mtime: float | None, accepted: float, *, deleted: bool
) -> bytes:
    doc = {
        "key": key,
        "size": size,
        "crc32": crc,
        "mtime": mtime,
        "accepted": accepted,
        "deleted": deleted,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _parse(path: Path) -> Entry:
    """The entry a ``.put`` file holds; ValueError when it is not whole and true."""
    seq = int(path.name[: -len(SUFFIX)])
    with open(path, "rb", buffering=0) as f:
        head = f.read(len(MAGIC) + 16384)
        if not head.startswith(MAGIC):
            raise ValueError("not a journal entry")
        line_end = head.find(b"\n", len(MAGIC))
        if line_end < 0:
            raise ValueError("its header is torn")
        doc = json.loads(head[len(MAGIC) : line_end])
        offset = line_end + 1
        key, size, crc = doc["key"], doc["size"], doc["crc32"]
        mtime, accepted = doc.get("mtime"), doc.get("accepted", 0.0)
        deleted = doc.get("deleted", False) is True
        if not (isinstance(key, str) and isinstance(size, int) and isinstance(crc, int)):
            raise TypeError("its header is not an entry's")
        f.seek(offset)
        got, length = 0, 0
        while piece := f.read(_COPY):
            got = zlib.crc32(piece, got)
            length += len(piece)
    if length != size:
        raise ValueError(f"it holds {length} bytes, its header says {size}")
    if got != crc:
        raise ValueError("its bytes fail their CRC32")
    return Entry(seq, key, size, mtime, crc, path, offset, float(accepted), deleted)


def _load(folder: Path, damaged: Path) -> list[Entry]:
    """The folder's entries in sequence order; temp files (never acknowledged) removed,
    damaged entries moved aside and reported."""
    entries: list[Entry] = []
    for path in sorted(folder.iterdir()):
        name = path.name
        if name.startswith(".") and name.endswith(".tmp"):
            path.unlink(missing_ok=True)
            continue
        if not name.endswith(SUFFIX):
            continue
        try:
            entries.append(_parse(path))
        except (ValueError, KeyError, TypeError) as exc:  # not its bytes: an I/O error raises
            damaged.mkdir(parents=True, exist_ok=True, mode=0o700)
            aside = damaged / f"{folder.name}-{name}"
            log.error(  # noqa: TRY400 (the reason is the message; no traceback)
                "write-back journal entry %s is damaged (%s): moved to %s, not uploaded",
                path,
                exc,
                aside,
            )
            with contextlib.suppress(OSError):
                os.rename(path, aside)
    entries.sort(key=lambda e: e.seq)
    return entries


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
    """Move the entries of every free folder of the same source into ``mine``, in their own
    order, after what ``mine`` holds; remove the emptied folders."""
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
            names = sorted(p.name for p in folder.glob("*" + SUFFIX))
            for name in names:
                last += 1
                os.rename(folder / name, mine / f"{last:016d}{SUFFIX}")
            if names:
                log.info("adopted %d journaled writes of %s", len(names), folder)
                _fsync_folder(mine)
            for path in folder.iterdir():
                if path.name.endswith(".tmp") or path.name in ("lock", "source"):
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


def _read_exactly(fd: int, n: int, entry: Entry) -> bytes:
    out = bytearray()
    while len(out) < n:
        piece = os.read(fd, n - len(out))
        if not piece:
            raise StoreUnavailable(f"write-back journal entry {entry.path} is shorter than it said")
        out += piece
    return bytes(out)
