"""A few threads for work whose answers are taken in order: validating the chunks a new
metadata file makes chunks of (``cp -r`` often copies them before the metadata).

Why threads: fetching a chunk waits on the store, and the codecs (zlib, bz2, lzma, zstd,
blosc) release the GIL while they decode, so two or more chunks are checked at once on a
machine with two cores; asking in order keeps the answer the one a loop would give (the first
problem in listing order wins).

State and locks: the executor is created on first use under ``_lock`` (a leaf) and shut down
by :meth:`OrderedPool.close`. Work submitted here must not take a lock its submitter holds:
the caller may hold a commit-order hold while it waits for the answers (the work reads the
store and decodes, nothing more).
"""

from __future__ import annotations

import contextlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, TypeVar

from n5fs.locking import LEAF, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

T = TypeVar("T")
R = TypeVar("R")


class OrderedPool:
    """``map`` on a few threads, answers in order, at most ``2 * workers`` in flight."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = ranked_lock("ordered pool", LEAF)
        self._closed = False

    def ordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Generator[R, None, None]:
        """``fn(item)`` for each item, yielded in the order of ``items``; an exception is
        raised where its item stands. Stopping early (an exception, or the caller leaving
        the loop) cancels what has not started and waits for what has."""
        executor = self._get() if len(items) > 1 and self.workers > 1 else None
        if executor is None:
            for item in items:
                yield fn(item)
            return
        pending: deque[Future[R]] = deque()
        rest = iter(items)
        try:
            for item in rest:
                pending.append(executor.submit(fn, item))
                if len(pending) >= 2 * self.workers:
                    break
            while pending:
                answer = pending.popleft().result()
                for item in rest:
                    pending.append(executor.submit(fn, item))
                    break
                yield answer
        finally:
            for future in pending:
                future.cancel()
            wait(pending)

    def _get(self) -> ThreadPoolExecutor | None:
        with self._lock:
            if self._closed:
                return None  # shutting down: the caller's thread does the work
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=self._name)
            return self._executor

    def close(self) -> None:
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            with contextlib.suppress(RuntimeError):
                executor.shutdown(wait=True, cancel_futures=True)
