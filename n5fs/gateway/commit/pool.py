"""A few threads for work whose answers are taken in order: validating the chunks a new
metadata file makes chunks of (``cp -r`` often copies them before the metadata).

Why threads: fetching a chunk waits on the store, and the codecs (zlib, bz2, lzma, zstd,
blosc) release the GIL while they decode, so two or more chunks are checked at once on a
machine with two cores; asking in order keeps the answer the one a loop would give (the first
problem in listing order wins).

State and locks: none of its own. The threads are a :class:`~n5fs.workers.Pool` of the
gateway's :class:`~n5fs.workers.Workers` (``n5fs-stored-chunks``), started at the first
``ordered`` call with more than one item and stopped by the owner's shutdown; from then on
the caller's thread does the work. Work submitted here must not take a lock its submitter
holds: the caller may hold a commit-order hold while it waits for the answers (the work reads
the store and decodes, nothing more).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

    from n5fs.workers import Pool

T = TypeVar("T")
R = TypeVar("R")


class OrderedPool:
    """``map`` on a few threads, answers in order, at most ``2 * workers`` in flight."""

    def __init__(self, pool: Pool) -> None:
        self.workers = pool.size
        self._pool = pool

    def ordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Generator[R, None, None]:
        """``fn(item)`` for each item, yielded in the order of ``items``; an exception is
        raised where its item stands. Stopping early (an exception, or the caller leaving
        the loop) cancels what has not started and waits for what has."""
        pool = self._pool
        if len(items) < 2 or self.workers < 2 or pool.closed:
            # one item, one thread, or shut down (unmounting): the caller's thread does it
            yield from map(fn, items)
            return
        pending: deque[Future[R]] = deque()
        rest = iter(items)
        try:
            for item in rest:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * self.workers:
                    break
            while pending:
                answer = pending.popleft().result()
                for item in rest:
                    pending.append(pool.submit(fn, item))
                    break
                yield answer
        finally:
            for future in pending:
                future.cancel()
            wait(pending)
