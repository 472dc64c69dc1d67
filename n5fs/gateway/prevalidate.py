"""Chunk checks that run while the chunk arrives, so a commit only finishes them.

Why: ``cp -r`` of compressed chunks spent most of its time inside ``close()``, decoding each
chunk in one go on the thread that answers FUSE, while the next file waited. Decoders of
zlib/gzip, bzip2 and xz take their input piece by piece and release the GIL, so a chunk
written sequentially from offset 0 (``cp``, ``rsync``, most writers) is decoded on a worker
thread as its writes land, on the other core; ``close()`` waits only for the last piece. The
decoded bytes are counted and dropped (64 KiB at a time), never held: a bomb stops the check
at the size the block header allows.

The result is only ever used to *accept*: a check passes when everything the full check
(:meth:`~n5fs.formats.base.ArrayNode.validate_chunk`) looks at agrees - header, its fit at
the position, one compressed stream that ends exactly at the end of the file and decodes to
exactly the expected size. Anything else (a flaw, a random-offset write, a truncate, an
unusual but legal layout such as concatenated gzip members, a codec not handled here, memory
the staging budget does not grant) drops the check, and the commit runs the full check,
which decides and words any refusal as before. A check also remembers the array node and
position it was made for; the commit re-classifies the key against the metadata current
then (inside the commit order) and uses the check only if both are equal
(:meth:`Precheck.holds_for`), else it checks in full.

Formats handled: N5 with raw, gzip (both framings), bzip2 and xz; other formats and codecs
(blosc, zstd, lz4, Zarr v2/v3) are checked in full at commit as before.

State and locks: a :class:`ChunkCheck` guards its queue and flags with its own condition, a
leaf lock. The writer (``StagedFile.write``, under its node lock) appends a reference to the
written bytes, reserved from the staging budget, and waits while more than
:data:`MAX_BACKLOG` bytes are queued (back-pressure: the decoder, not memory, sets the pace);
a pool worker drains a few pieces at a time, decoding outside the lock; the commit (under
the node lock, before the commit-order hold) waits until the worker is done. Nothing here
takes a node, commit-order or cache lock, so waiting on a check cannot deadlock.
"""

from __future__ import annotations

import bz2
import logging
import lzma
import os
import threading
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from n5fs.codecs.limits import CodecError
from n5fs.codecs.n5_compression import (
    Bzip2Compression,
    GzipCompression,
    N5Compression,
    RawCompression,
    XzCompression,
)
from n5fs.codecs.n5_header import BlockHeader, decode_header
from n5fs.errors import N5fsError
from n5fs.formats.base import ArrayNode, Format, KeyKind
from n5fs.formats.n5 import N5ArrayNode
from n5fs.formats.registry import METADATA_NAMES
from n5fs.kvstore.keys import basename

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.classify import Classifier, Verdict
    from n5fs.gateway.staging import StagedFile, StagingBudget

log = logging.getLogger(__name__)

Buffer = bytes | memoryview

#: decoded output is produced (and dropped) at most this much at a time
OUTPUT_PIECE = 64 << 10
#: :func:`passes` feeds a whole chunk in pieces of this size (zlib copies the input its
#: output limit leaves over: fed whole, a 4 MiB chunk would be copied ~60 times)
FEED_PIECE = 128 << 10
#: a writer waits while this many of its bytes wait for the decoder
MAX_BACKLOG = 8 << 20
#: a worker decodes at most this many pieces of one check before letting others run
DRAIN_BATCH = 8


class _Unsure(Exception):
    """The check cannot vouch for the chunk: the full check decides."""


# == payload decoders ================================================================================


class _Decoder(Protocol):
    """What zlib's decompress objects, ``bz2.BZ2Decompressor`` and ``lzma.LZMADecompressor``
    have in common."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: Buffer, max_length: int = ..., /) -> bytes: ...


class _Payload(Protocol):
    def feed(self, data: Buffer) -> None:
        """Take the next compressed bytes; raise _Unsure at the first doubt."""

    def complete(self) -> bool:
        """Everything fed is one stream that decoded to exactly the expected size."""


class _Raw:
    """N5 raw: the payload is the values; only its length matters."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.total = 0

    def feed(self, data: Buffer) -> None:
        self.total += len(data)
        if self.total > self.expected:
            raise _Unsure

    def complete(self) -> bool:
        return self.total == self.expected


class _Stream:
    """One zlib/gzip, bzip2 or xz stream, decoded as it arrives, output counted and dropped.
    ``tail``: zlib keeps the input its output limit left over in ``unconsumed_tail``; bz2
    and lzma buffer it themselves and say ``needs_input``."""

    def __init__(self, decoder: _Decoder, expected: int, *, tail: bool) -> None:
        self.decoder = decoder
        self.expected = expected
        self.tail = tail
        self.total = 0
        self.ended = False

    def feed(self, data: Buffer) -> None:
        if self.ended:
            raise _Unsure  # bytes after the stream: trailing data, or another gzip member
        try:
            self._decode(data)
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
            raise _Unsure from exc
        if self.decoder.eof:
            self.ended = True
            if self.decoder.unused_data:
                raise _Unsure

    def _decode(self, data: Buffer) -> None:
        dec = self.decoder
        while True:
            out = dec.decompress(data, OUTPUT_PIECE)
            self.total += len(out)
            if self.total > self.expected:
                raise _Unsure  # more than the header allows: the full check refuses the bomb
            if dec.eof:
                return
            if self.tail:
                data = getattr(dec, "unconsumed_tail", b"")
                if not data and len(out) < OUTPUT_PIECE:
                    return
            else:
                data = b""
                if getattr(dec, "needs_input", True):
                    return

    def complete(self) -> bool:
        return self.ended and self.total == self.expected


def _payload(compression: N5Compression, expected: int) -> _Payload | None:
    """A streaming decoder that accepts exactly what ``compression.decode(., expected)``
    followed by the size check accepts in its plain case; None for codecs not handled."""
    if isinstance(compression, RawCompression):
        return _Raw(expected)
    if isinstance(compression, GzipCompression):
        wbits = zlib.MAX_WBITS if compression.use_zlib else 16 + zlib.MAX_WBITS
        return _Stream(zlib.decompressobj(wbits), expected, tail=True)
    if isinstance(compression, Bzip2Compression):
        return _Stream(bz2.BZ2Decompressor(), expected, tail=False)
    if isinstance(compression, XzCompression):
        return _Stream(lzma.LZMADecompressor(format=lzma.FORMAT_XZ), expected, tail=False)
    return None


def handled(array: ArrayNode) -> bool:
    """Can chunks of ``array`` be checked while they arrive?"""
    return isinstance(array, N5ArrayNode) and _payload(array.compression, 0) is not None


# == one N5 chunk =====================================================================================


class _N5Chunk:
    """An N5 block: header first (its dims decide the payload's size), then the payload."""

    def __init__(self, array: N5ArrayNode, position: tuple[int, ...]) -> None:
        self.array = array
        self.position = position
        self.head = bytearray()
        self.payload: _Payload | None = None

    def feed(self, data: Buffer) -> None:
        if self.payload is not None:
            self.payload.feed(data)
            return
        self.head += data
        header = self._header()
        if header is None:
            return
        rest, self.head = bytes(self.head[header.size :]), bytearray()
        try:
            # the array's own rule for a header at this position (dims, varlength cap)
            expected = self.array._expected_bytes(header, self.position)
        except CodecError as exc:
            raise _Unsure from exc
        self.payload = _payload(self.array.compression, expected)
        if self.payload is None:
            raise _Unsure
        if rest:
            self.payload.feed(rest)

    def _header(self) -> BlockHeader | None:
        """The header once all its bytes are here (None before)."""
        head = self.head
        if len(head) < 4:
            return None
        ndim = int.from_bytes(head[2:4], "big")
        needed = 4 + 4 * ndim + (4 if head[:2] == b"\x00\x01" else 0)
        if len(head) < needed:
            return None
        try:
            return decode_header(bytes(head[:needed]))
        except CodecError as exc:
            raise _Unsure from exc

    def complete(self) -> bool:
        return self.payload is not None and self.payload.complete()


def passes(array: ArrayNode | None, position: tuple[int, ...] | None, data: bytes) -> bool:
    """Do the streaming decoders accept the whole chunk ``data`` at ``position``? True only
    where :meth:`~n5fs.formats.base.ArrayNode.validate_chunk` accepts it too, and at less
    cost (no decoded copy is kept); False says nothing: the full check then decides."""
    if position is None or not isinstance(array, N5ArrayNode) or not handled(array):
        return False
    if not array.in_grid(position):
        return False
    parser = _N5Chunk(array, position)
    view = memoryview(data)
    try:
        for offset in range(0, len(data), FEED_PIECE):
            parser.feed(view[offset : offset + FEED_PIECE])
    except _Unsure:
        return False
    except Exception:  # a bug must not fail a commit the full check would decide
        log.exception("chunk check failed; the full check decides")
        return False
    return parser.complete()


# == the check a commit finishes ======================================================================


@dataclass(frozen=True)
class Precheck:
    """What a finished check found, and what it was made for."""

    fmt: Format
    array: ArrayNode
    position: tuple[int, ...]
    size: int
    passed: bool

    def holds_for(self, verdict: Verdict, size: int) -> bool:
        """Does this check decide the commit of ``size`` bytes classified as ``verdict``
        now? Only a pass made against equal metadata, at the same position, of the same
        bytes (a dataclass-equal node validates alike; its ``raw`` attributes are not
        compared, and play no part in a chunk's validity)."""
        return (
            self.passed
            and self.size == size
            and verdict.kind is KeyKind.CHUNK
            and verdict.fmt is self.fmt
            and verdict.position == self.position
            and verdict.array == self.array
        )


class ChunkCheck:
    """A :class:`~n5fs.gateway.staging.Watcher` that checks a chunk while it is written."""

    def __init__(self, owner: Prechecks, verdict: Verdict, parser: _N5Chunk) -> None:
        assert verdict.fmt is not None
        assert verdict.array is not None
        assert verdict.position is not None
        self._owner = owner
        self._made_for = (verdict.fmt, verdict.array, verdict.position)
        self._parser = parser
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[bytes] = deque()
        self._backlog = 0  # bytes queued, reserved from the staging budget
        self._next = 0  # where the next sequential write starts (bytes taken so far)
        self._running = False  # a drain is submitted or running
        self._dropped = False

    # -- the writer's side (under its node lock) -------------------------------------------------

    def wrote(self, data: bytes, offset: int) -> None:
        budget = self._owner.budget
        with self._cond:
            if self._dropped:
                return
            if offset != self._next or self._next + len(data) > self._owner.max_bytes:
                self._drop()
                return
            self._cond.wait_for(self._may_queue)  # back-pressure: the decoder sets the pace
            if self._gone() or not budget.reserve(len(data)):
                self._drop()
                return
            self._queue.append(bytes(data))
            self._backlog += len(data)
            self._next += len(data)
            start = not self._running
            self._running = True
        if start:
            self._submit()

    def _may_queue(self) -> bool:
        return self._dropped or self._backlog < MAX_BACKLOG

    def _gone(self) -> bool:
        """Dropped? (a call, not the attribute: another thread may drop us while we wait)"""
        return self._dropped

    def truncated(self, length: int) -> None:
        with self._cond:
            if length != self._next:
                self._drop()

    def abandon(self) -> None:
        with self._cond:
            self._drop()

    def _drop(self) -> None:
        """Give up (caller holds the condition): free the queue, wake everyone."""
        self._dropped = True
        self._owner.budget.release(self._backlog)
        self._backlog = 0
        self._queue.clear()
        self._cond.notify_all()

    # -- the worker's side -------------------------------------------------------------------------

    def _submit(self) -> None:
        try:
            self._owner.submit(self._drain)
        except RuntimeError:  # the pool is shut down (unmounting): the commit checks in full
            with self._cond:
                self._drop()
                self._running = False

    def _drain(self) -> None:
        """Decode a few queued pieces, then queue again at the back of the pool's line (so
        every check moves) unless the queue ran dry. ``_running`` turns False, under the
        lock, exactly when no drain will follow: ``wrote`` then submits one, ``finish``
        stops waiting."""
        try:
            more = self._decode_some()
        except BaseException:
            with self._cond:
                self._drop()
                self._running = False
            raise
        if more:
            self._submit()

    def _decode_some(self) -> bool:
        """Feed up to :data:`DRAIN_BATCH` pieces; False when this drain is the last."""
        for _ in range(DRAIN_BATCH):
            with self._cond:
                if self._dropped or not self._queue:
                    self._running = False
                    self._cond.notify_all()
                    return False
                piece = self._queue[0]
            ok = self._feed(piece)
            with self._cond:
                if not self._dropped:
                    self._queue.popleft()
                    self._backlog -= len(piece)
                    self._owner.budget.release(len(piece))
                    if not ok:
                        self._drop()
                self._cond.notify_all()
        return True

    def _feed(self, piece: bytes) -> bool:
        try:
            self._parser.feed(piece)
        except _Unsure:
            return False
        except Exception:  # a bug must not pass a chunk: the full check runs (and raises)
            log.exception("chunk check failed; the commit checks in full")
            return False
        return True

    # -- the commit's side ---------------------------------------------------------------------

    def finish(self) -> Precheck:
        """Wait for the decoder to reach the end of what was written; say what it found."""
        with self._cond:
            self._cond.wait_for(lambda: not self._running)
            passed = not self._dropped and self._parser.complete()
            fmt, array, position = self._made_for
            result = Precheck(fmt, array, position, self._next, passed)
            self._drop()
            return result


class Prechecks:
    """Starts chunk checks for a gateway and runs them on a small pool of threads."""

    def __init__(self, classifier: Classifier, budget: StagingBudget, *, max_bytes: int) -> None:
        self.classifier = classifier
        self.budget = budget
        self.max_bytes = max_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self, key: str, staged: StagedFile) -> None:
        """Watch ``staged`` (a new, empty file at ``key``) if ``key`` is a chunk whose format
        and codec are handled here; otherwise the commit checks in full, as always."""
        if self._closed or basename(key) in METADATA_NAMES:
            return
        try:
            verdict = self.classifier.classify(key, _no_content)
        except N5fsError:
            return  # the commit classifies again and reports what is wrong
        array = verdict.array
        if verdict.kind is not KeyKind.CHUNK or array is None or verdict.position is None:
            return
        if not isinstance(array, N5ArrayNode) or not handled(array):
            return
        staged.watch(ChunkCheck(self, verdict, _N5Chunk(array, verdict.position)))

    @staticmethod
    def finish(staged: StagedFile) -> Precheck | None:
        """Take the check off ``staged`` (the commit's) and finish it; None if none ran."""
        watcher = staged.unwatch()
        return watcher.finish() if isinstance(watcher, ChunkCheck) else None

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("chunk checks are shut down")
            if self._pool is None:
                workers = min(4, os.cpu_count() or 1)
                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="n5fs-check")
            self._pool.submit(job)

    def close(self) -> None:
        """Stop the workers (queued drains are dropped; their commits check in full)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _no_content() -> bytes:
    raise AssertionError("a chunk key's class never depends on its content")
