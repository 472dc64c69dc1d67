"""Chunk checks that run while the chunk arrives, so a commit only finishes them.

Why: ``cp -r`` of compressed chunks spent most of its time inside ``close()``, decoding each
chunk in one go on the thread that answers FUSE, while the next file waited. The streaming
decoders (:mod:`n5fs.gateway.commit.streamcheck`) take their input piece by piece and release the
GIL, so a chunk written sequentially from offset 0 (``cp``, most writers) is decoded on a
worker thread as its writes land, on the other core; ``close()`` waits only for the last
piece. Decoded bytes are counted and dropped, never held: a bomb stops the check at the size
the header allows.

A check is only ever used to *accept*. A flaw, a random-offset write, a truncate, an unusual
but legal layout, a codec not handled, or memory the staging budget does not grant drops it,
and the commit runs the full check, which decides and words any refusal as before. A check
remembers the array node and position it was made for; the commit re-classifies the key
against the metadata current then (inside the commit order) and uses the check only if both
are equal (:meth:`Precheck.holds_for`), else it checks in full.

State and locks: a :class:`ChunkCheck` guards its queue and flags with its own condition, an
outer leaf (:data:`~n5fs.locking.OUTER_LEAF`: the staging budget, a leaf, is taken under it). The writer (``StagedFile.write``, under its node lock) appends a reference to the
written bytes, reserved from the staging budget, and waits while more than
:data:`MAX_BACKLOG` bytes are queued (back-pressure: the decoder, not memory, sets the pace);
a pool worker drains a few pieces at a time, decoding outside the lock; the commit (under
the node lock, before the commit-order hold) waits until the worker is done. Nothing here
takes a node, commit-order or cache lock, so waiting on a check cannot deadlock. The pool is
the gateway's ``n5fs-check`` (:class:`~n5fs.workers.Workers`); :class:`Prechecks` keeps only a
flag, ``_closed`` (set once, at close; read without a lock: a check started just before it is
dropped like any other when the pool stops).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import N5fsError
from n5fs.formats.base import ArrayNode, Format, KeyKind
from n5fs.formats.registry import METADATA_NAMES
from n5fs.gateway.commit.streamcheck import ChunkParser, Unsure, parser_for
from n5fs.kvstore.keys import basename
from n5fs.locking import OUTER_LEAF, assert_held, ranked_condition

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.classify import Classifier, Verdict
    from n5fs.gateway.write.staging import StagedFile, StagingBudget
    from n5fs.workers import Workers

log = logging.getLogger(__name__)

#: the threads' name of the check pool (:class:`~n5fs.workers.Workers`)
CHECK_POOL = "n5fs-check"
#: a writer waits while this many of its bytes wait for the decoder
MAX_BACKLOG = 8 << 20
#: a worker decodes at most this many pieces of one check before letting others run
DRAIN_BATCH = 8


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
    """A :class:`~n5fs.gateway.write.staging.Watcher` that checks a chunk while it is written."""

    def __init__(self, owner: Prechecks, verdict: Verdict, parser: ChunkParser) -> None:
        assert verdict.fmt is not None
        assert verdict.array is not None
        assert verdict.position is not None
        self._owner = owner
        self._made_for = (verdict.fmt, verdict.array, verdict.position)
        self._parser = parser
        # an outer leaf: the writer reserves from the staging budget (a leaf) under it
        self._cond = ranked_condition("chunk check", OUTER_LEAF)
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
        assert_held(self._cond)
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
        except Unsure:
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

    def __init__(
        self, classifier: Classifier, budget: StagingBudget, *, max_bytes: int, workers: Workers
    ) -> None:
        self.classifier = classifier
        self.budget = budget
        self.max_bytes = max_bytes
        #: the check pool (its owner's): queued drains are dropped at shutdown (their commits
        #: check in full)
        self._pool = workers.pool(CHECK_POOL, min(4, os.cpu_count() or 1))
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
        parser = parser_for(array, verdict.position)
        if parser is not None:
            staged.watch(ChunkCheck(self, verdict, parser))

    @staticmethod
    def finish(staged: StagedFile) -> Precheck | None:
        """Take the check off ``staged`` (the commit's) and finish it; None if none ran."""
        watcher = staged.unwatch()
        return watcher.finish() if isinstance(watcher, ChunkCheck) else None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the check pool; a RuntimeError once checks stopped (WorkersClosed
        once the pool is shut down)."""
        if self._closed:
            raise RuntimeError("chunk checks are shut down")
        self._pool.submit(job)

    def close(self) -> None:
        """Start no more checks (after the last commit). The pool's owner stops the workers:
        queued drains are dropped there, running ones finish."""
        self._closed = True


def _no_content() -> bytes:
    raise AssertionError("a chunk key's class never depends on its content")
