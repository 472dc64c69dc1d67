"""Where writes wait for their commit: a copy-on-write overlay on the stored object, in memory
under one global budget, spilling to a sparse local temp file.

Writes never load what they will not use, so a small change to a huge file costs neither its
download nor its size in memory:

- A new file or an ``O_TRUNC`` open starts empty (``base=None``) and never fetches anything.
- Over a stored object (the *base*) nothing is fetched up front. Writes go to the overlay and
  mark what they cover; reads of untouched ranges are fetched from the base, by range, and not
  kept; ``truncate`` below the base cuts it (bytes past the cut read as zeros if the file grows
  again). Only :meth:`StagedFile.getvalue` and :meth:`StagedFile.spill_path` (the commit, which
  needs every byte) materialize the untouched base ranges, in pieces of ``FETCH_PIECE``.
- The overlay is a bytearray while the file is at most ``spill_bytes`` and the shared
  :class:`StagingBudget` grants the memory; past either it moves to an unlinked temp file.
  Bytes past the bytearray's end read as zeros, so ``truncate`` up costs nothing in memory.
- Sparse stays sparse: the temp file grows with ``ftruncate`` and copies into it (a spill, or
  base ranges at commit) skip all-zero blocks, leaving holes; ``FileStore.put_file`` keeps them.
- A new, empty file may be *watched* (:meth:`StagedFile.watch`): its :class:`Watcher` sees
  every write and truncate in the order they land, so a chunk written sequentially can be
  checked while it arrives (:mod:`n5fs.gateway.commit.prevalidate`) and a commit only finishes the
  check. The watcher is told of each change after it is staged, under the same node lock.

Ownership and locks: a StagedFile is owned by one open-file node of the gateway and used only
under that node's lock; it takes no lock of its own. The StagingBudget is shared by every
StagedFile of a gateway and guards its counter with its own lock, held only for the arithmetic
(never across I/O or a fetch), so taking it inside any node lock cannot deadlock.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Protocol

from n5fs.errors import FileTooLarge
from n5fs.locking import LEAF, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Iterator

#: base bytes are fetched (and copied into the temp file) at most this much at a time
FETCH_PIECE = 8 << 20
#: copies into the temp file skip all-zero blocks of this size (they stay holes)
ZERO_BLOCK = 64 << 10
_ZEROS = bytes(ZERO_BLOCK)
#: a write shorter than this is a *small* piece; the in-memory overlay keeps at most
#: MAX_SMALL_PIECES of them by reference (the tail of a chunk, a header) before copying
SMALL_PIECE = 32 << 10
MAX_SMALL_PIECES = 16


class StagingBudget:
    """One byte budget for the memory a gateway's writes hold: the staged bytes of every open
    file (:meth:`reserve`, never waiting: a file that is refused spills), and the *working
    memory* of a commit that needs content whole (:meth:`borrow`: a full check of a spilled
    chunk, a view's translation of a chunk), which waits its turn instead.

    Why one budget for both: six large chunks committed at once each read their content back
    from disk and decoded it, and a view's translation held the written chunk, its values and
    the encoded block; per call that is bounded, but summed over concurrent commits it was the
    daemon's peak, beyond every limit the user set. Borrowed bytes count as used, so staged
    files spill while a commit works, and commits take turns.

    A borrow is granted when it fits beside what is used, or when no other borrow is out: a
    commit larger than the whole budget still runs, alone, and a borrow never waits for staged
    files, which may stay open for as long as their writers like. A thread that holds a borrow
    is granted the borrows it nests (a translation's native commit) at once: it never waits for
    itself. A borrow that is not granted within ``wait`` seconds goes ahead anyway, counted in
    :attr:`overdrawn`: a commit is delayed by the budget, never stopped by it.

    Lock: ``_lock`` (a leaf, under a condition for the borrowers that wait) guards the
    counters; it is held for the arithmetic only, never across I/O or a fetch, so taking it
    inside any node lock cannot deadlock."""

    #: how long a borrow waits for its turn before it goes ahead over the budget
    WAIT = 30.0

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._used = 0
        self._lent = 0  # how much of _used is borrowed working memory
        self._borrows = 0  # borrows out (nested ones not counted)
        #: borrows granted after waiting ``WAIT`` (over the budget)
        self.overdrawn = 0
        #: the most working memory lent at once
        self.peak_lent = 0
        self._lock = ranked_lock("staging budget", LEAF)
        self._turn = threading.Condition(self._lock)
        self._local = threading.local()

    @property
    def used(self) -> int:
        return self._used

    @property
    def lent(self) -> int:
        """Working memory borrowed now (part of :attr:`used`)."""
        return self._lent

    def reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` from the budget; False (nothing taken) if they are not there."""
        if nbytes <= 0:
            return True
        with self._lock:
            if self._used + nbytes > self.max_bytes:
                return False
            self._used += nbytes
            return True

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            if nbytes > self._used:
                raise ValueError(f"releasing {nbytes} staging bytes, only {self._used} reserved")
            self._used -= nbytes
            self._turn.notify_all()

    @contextlib.contextmanager
    def borrow(self, nbytes: int, *, wait: float | None = None) -> Iterator[None]:
        """Hold ``nbytes`` of working memory for the block (see the class docs)."""
        nbytes = max(nbytes, 0)
        nested = getattr(self._local, "depth", 0) > 0
        with self._lock:
            if not nested:
                granted = self._turn.wait_for(
                    lambda: not self._borrows or self._used + nbytes <= self.max_bytes,
                    self.WAIT if wait is None else wait,
                )
                self.overdrawn += not granted
                self._borrows += 1
            self._used += nbytes
            self._lent += nbytes
            self.peak_lent = max(self.peak_lent, self._lent)
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            with self._lock:
                self._used -= nbytes
                self._lent -= nbytes
                if not nested:
                    self._borrows -= 1
                self._turn.notify_all()


class Watcher(Protocol):
    """Sees a watched file's changes, in the order they are staged (under the node lock)."""

    def wrote(self, data: bytes, offset: int) -> None:
        """``data`` was written at ``offset``; the watcher keeps a reference, never a copy."""

    def truncated(self, length: int) -> None:
        """The file was cut or grown to ``length``."""

    def abandon(self) -> None:
        """The staged content is gone (closed): stop, give back what is held."""


class BaseObject(Protocol):
    """The stored value a staged file starts from (copy on write)."""

    @property
    def size(self) -> int: ...

    def fetch(self, offset: int, length: int) -> bytes:
        """Bytes of the stored object (may be short at its end)."""
        ...


class _Ranges:
    """Disjoint, sorted, merged ``[start, end)`` ranges: what the overlay holds of the base."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        spans = self._spans
        i = bisect.bisect_left(spans, (start, start))
        if i > 0 and spans[i - 1][1] >= start:
            i -= 1
            start = spans[i][0]
        j = i
        while j < len(spans) and spans[j][0] <= end:
            end = max(end, spans[j][1])
            j += 1
        spans[i:j] = [(start, end)]

    def clip(self, length: int) -> None:
        """Forget everything at or past ``length``."""
        spans = self._spans
        del spans[bisect.bisect_left(spans, (length, length)) :]
        if spans and spans[-1][1] > length:
            spans[-1] = (spans[-1][0], length)

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` no range covers."""
        spans, out, pos = self._spans, [], start
        i = max(bisect.bisect_right(spans, (start, sys.maxsize)) - 1, 0)
        while i < len(spans) and spans[i][0] < end and pos < end:
            s, e = spans[i]
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
            i += 1
        if pos < end:
            out.append((pos, end))
        return out


class _Memory:
    """The overlay in memory, ``reserved`` bytes of the budget held for it (at least its
    length). Bytes past the staged size and past the held bytes are zeros.

    While the file is written strictly in order from offset 0 (``cp``, most writers) the
    overlay keeps the written ``bytes`` objects themselves, by reference: the bytes FUSE
    handed over are the staged bytes, and a commit joins them once. Why: copying each write
    into a growing bytearray and then the bytearray into the value to store cost two copies
    (and their page faults) of every byte; a raw 4 MiB chunk then cost the daemon more than
    writing it to disk. Any other write, a truncate below the end, or too many small pieces
    (each one's object header is memory the budget does not count) turn the pieces into the
    bytearray once and go on there."""

    def __init__(self, budget: StagingBudget) -> None:
        self.pieces: list[bytes] | None = []  # in-order writes, by reference; None: ``buf``
        self._pieces_len = 0  # their total length
        self.small = 0  # how many of ``pieces`` are shorter than SMALL_PIECE
        self.buf = bytearray()
        self.reserved = 0
        self._budget = budget

    @property
    def held(self) -> int:
        """How many bytes the overlay holds (zeros follow up to the staged size)."""
        return len(self.buf) if self.pieces is None else self._pieces_len

    def grow(self, end: int, limit: int) -> bool:
        """Room for bytes up to ``end``, or False (the budget said no). The reservation grows
        geometrically up to ``limit`` (one budget call per doubling, not per write); the
        bytearray grows by what is written, never filled with zeros ahead of it (the
        copies and page faults of zero-filling were a large part of a sequential write's
        cost)."""
        if end <= self.reserved:
            return True
        want = min(max(end, 2 * self.reserved), max(limit, end))
        if not self._budget.reserve(want - self.reserved):
            want = end
            if not self._budget.reserve(want - self.reserved):
                return False
        self.reserved = want
        return True

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        pieces = self.pieces
        if pieces is not None:
            if type(data) is bytes and offset == self._pieces_len:
                small = len(data) < SMALL_PIECE
                if not small or self.small < MAX_SMALL_PIECES:
                    pieces.append(data)
                    self._pieces_len += len(data)
                    self.small += small
                    return
            self.flatten()
        if offset > len(self.buf):  # a write past the end: the gap reads as zeros
            self.buf += bytes(offset - len(self.buf))
        self.buf[offset : offset + len(data)] = data  # grow() reserved the room

    def flatten(self) -> bytearray:
        """Leave the piece list for the bytearray (one copy); return the bytearray."""
        if self.pieces is not None:
            self.buf = bytearray().join(self.pieces)
            self.pieces, self._pieces_len, self.small = None, 0, 0
        return self.buf

    def parts(self) -> Iterator[tuple[int, memoryview]]:
        """``(offset, bytes)`` of everything held, without copying it."""
        if self.pieces is None:
            yield 0, memoryview(self.buf)
            return
        offset = 0
        for piece in self.pieces:
            yield offset, memoryview(piece)
            offset += len(piece)

    def pread(self, offset: int, size: int) -> bytes:
        pieces = self.pieces
        if pieces is not None and offset == 0 and size >= self._pieces_len:
            data = b"".join(pieces)  # the commit's one copy (none for a single piece)
            if len(pieces) > 1:
                # the joined value stands for the pieces from now on: the file is held once,
                # not twice, while the commit works on it
                self.pieces, self.small = [data], 0
        else:
            data = bytes(memoryview(self.flatten())[offset : offset + size])
        return data + bytes(size - len(data)) if len(data) < size else data

    def truncate(self, length: int) -> None:
        if length < self.held:
            if length:
                del self.flatten()[length:]
            else:
                self.pieces, self._pieces_len, self.small, self.buf = [], 0, 0, bytearray()
        if length < self.reserved:
            self._budget.release(self.reserved - length)
            self.reserved = length

    def close(self) -> None:
        self.truncate(0)


class _Spill:
    """The overlay in an unlinked temp file, as long as the staged size; holes read as zeros."""

    def __init__(self, tmp_dir: str | None) -> None:
        fd, path = tempfile.mkstemp(dir=tmp_dir, prefix="n5fs-stage-")
        os.unlink(path)
        self.fd = fd

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            done = os.pwrite(self.fd, view, offset)
            view, offset = view[done:], offset + done

    def fill(self, data: bytes | memoryview, offset: int) -> None:
        """Copy into a range that is a hole: all-zero blocks are skipped (stay holes)."""
        view = memoryview(data)
        run: int | None = None  # start of the current run of blocks with data
        for pos in range(0, len(view), ZERO_BLOCK):
            block = view[pos : pos + ZERO_BLOCK]
            if block.tobytes() == _ZEROS[: len(block)]:
                if run is not None:
                    self.pwrite(view[run:pos], offset + run)
                run = None
            elif run is None:
                run = pos
        if run is not None:
            self.pwrite(view[run:], offset + run)

    def pread(self, offset: int, size: int) -> bytes:
        parts, got = [], 0
        while got < size:
            part = os.pread(self.fd, size - got, offset + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts) + bytes(size - got)

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)

    def path(self) -> str:
        """A name that opens this unlinked file (Linux: a fresh open file; macOS: a dup)."""
        folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
        return f"{folder}/{self.fd}"

    def close(self) -> None:
        os.close(self.fd)


class StagedFile:
    """A file's staged content: POSIX write/read/truncate over an optional stored base."""

    def __init__(
        self,
        base: BaseObject | None = None,
        *,
        budget: StagingBudget,
        spill_bytes: int = 64 << 20,
        tmp_dir: str | None = None,
        max_size: int | None = None,
    ) -> None:
        self._budget = budget
        self._spill = spill_bytes
        self._tmp_dir = tmp_dir
        self._max = max_size
        self._overlay: _Memory | _Spill = _Memory(budget)
        self._base = base
        self._base_len = base.size if base is not None else 0
        self._covered = _Ranges()  # the parts of [0, _base_len) the overlay holds
        self._size = self._base_len
        self._watcher: Watcher | None = None

    @property
    def size(self) -> int:
        return self._size

    @property
    def spilled(self) -> bool:
        return isinstance(self._overlay, _Spill)

    @property
    def watcher(self) -> Watcher | None:
        return self._watcher

    def watch(self, watcher: Watcher) -> bool:
        """Let ``watcher`` see every change from now on; only a new, empty file without a
        stored base can be watched (False, nothing attached, otherwise)."""
        if self._watcher is not None or self._base is not None or self._size:
            return False
        self._watcher = watcher
        return True

    def unwatch(self) -> Watcher | None:
        """Detach the watcher (a commit takes it over) and return it."""
        watcher, self._watcher = self._watcher, None
        return watcher

    def write(self, data: bytes, offset: int) -> int:
        if not data:
            return 0
        end = offset + len(data)
        self._check_size(end)
        self._make_room(max(self._size, end), end)
        self._overlay.pwrite(data, offset)
        if offset < self._base_len:
            self._covered.add(offset, min(end, self._base_len))
        self._size = max(self._size, end)
        if self._watcher is not None:
            self._watcher.wrote(data, offset)
        return len(data)

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self._size)
        if offset >= end:
            return b""
        data = self._overlay.pread(offset, end - offset)
        gaps = self._base_gaps(offset, end)
        if not gaps:
            return data
        out = bytearray(data)
        for start, stop in gaps:
            piece = self._fetch(start, stop)
            out[start - offset : start - offset + len(piece)] = piece
        return bytes(out)

    def truncate(self, length: int) -> None:
        if length < 0:
            raise ValueError(f"negative length {length}")
        self._check_size(length)
        self._make_room(length, 0)
        if length < self._base_len:
            self._base_len = length
            self._covered.clip(length)
            if not length:
                self._base = None  # nothing of it is visible any more: never fetch again
        self._overlay.truncate(length)
        self._size = length
        if self._watcher is not None:
            self._watcher.truncated(length)

    def getvalue(self) -> bytes:
        """The whole content (base ranges fetched into the overlay first)."""
        self._materialize()
        return self._overlay.pread(0, self._size)

    def parts(self) -> list[memoryview] | None:
        """The whole content as the pieces it was written in, without a copy, for a store
        that writes parts (:meth:`~n5fs.kvstore.abilities.PartWrites.set_parts`); None when
        it is not held that way (spilled, or zeros past what was written: use
        :meth:`getvalue`)."""
        self._materialize()
        overlay = self._overlay
        if not isinstance(overlay, _Memory) or overlay.held != self._size:
            return None
        return [part for _, part in overlay.parts()]

    def spill_path(self) -> str | None:
        """A path holding the complete content, for ``store.put_file``; None while the content
        is in memory (then use :meth:`getvalue`)."""
        self._materialize()
        return self._overlay.path() if isinstance(self._overlay, _Spill) else None

    def close(self) -> None:
        """Give back the memory and the temp file; idempotent. Leaves an empty file."""
        watcher = self.unwatch()
        if watcher is not None:
            watcher.abandon()
        overlay, self._overlay = self._overlay, _Memory(self._budget)
        overlay.close()
        self._base, self._base_len, self._size = None, 0, 0
        self._covered = _Ranges()

    # -- internals -------------------------------------------------------------------------------

    def _check_size(self, new_size: int) -> None:
        """Growing past ``max_size`` is refused (EFBIG) before anything changes."""
        if self._max is not None and new_size > max(self._size, self._max):
            raise FileTooLarge(
                f"a file may grow to {self._max} bytes (max_file_size), not to {new_size}"
            )

    def _make_room(self, new_size: int, end: int) -> None:
        """Keep the overlay in memory only while the file fits ``spill_bytes`` and the budget
        grants the bytearray room up to ``end``; else move it to a temp file."""
        memory = self._overlay
        if isinstance(memory, _Memory) and (
            new_size > self._spill or not memory.grow(end, self._spill)
        ):
            self._spill_now(memory)

    def _spill_now(self, memory: _Memory) -> None:
        spill = _Spill(self._tmp_dir)
        try:
            for offset, part in memory.parts():  # no copy of the pieces: the budget is full
                spill.fill(part[: max(self._size - offset, 0)], offset)
            spill.truncate(self._size)
        except BaseException:
            spill.close()
            raise
        memory.close()  # the reservation goes back to the budget
        self._overlay = spill

    def _base_gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        if self._base is None or start >= self._base_len:
            return []
        return self._covered.gaps(start, min(end, self._base_len))

    def _fetch(self, start: int, stop: int) -> bytes:
        assert self._base is not None
        return self._base.fetch(start, stop - start)[: stop - start]

    def _materialize(self) -> None:
        """Copy the untouched base ranges into the overlay, then forget the base."""
        if self._base is None:
            return
        self._make_room(self._size, self._base_len)
        overlay = self._overlay
        write = overlay.fill if isinstance(overlay, _Spill) else overlay.pwrite
        for start, stop in self._base_gaps(0, self._base_len):
            for piece in range(start, stop, FETCH_PIECE):
                write(self._fetch(piece, min(piece + FETCH_PIECE, stop)), piece)
        self._base, self._base_len = None, 0
        self._covered = _Ranges()
