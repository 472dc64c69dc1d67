"""Walks: one flat listing of a whole array answers every folder of its chunk tree.

Why: listed folder by folder, a chunk tree costs one LIST request per folder on S3 (a Zarr v2
array of 51,200 chunks in 1,641 folders: 1,641 requests, each as slow as a page of 1,000
keys); a flat (delimiter-less) listing of the array answers up to 1,000 keys of any folders
per request. Stores say whether they prefer it (``KvStore.flat_listing_preferred``: S3, zip,
memory; not a directory on disk, where one ``scandir`` lists a folder).

How (:class:`ArrayWalks`):

- the first folder of an array that misses its listing starts the array's *walk* on a
  background worker and waits only until the walk has passed that folder. In key order a
  folder's keys are one run, so a folder is whole as soon as the walk reads a key beyond it,
  and it is stored then: ``find`` and ``ls -R``, which visit folders in that same order, run
  along with the walk instead of after it;
- every other miss in the array waits on the same walk (one walk per array however many
  threads ask), while it runs and for ``ttl`` after it ended; past that, a miss walks again;
- folders go into the listings cache through one :class:`~n5fs.caching.Batch`, each with the
  time the request that read its first key began (a request answers at most :data:`PAGE`
  keys, so it began no later than the walk's ask for the key :data:`PAGE` keys earlier): a
  folder that a commit or invalidation touched after that time is not stored, and no live
  listing is overwritten, so a walk can never hide a commit;
- at most ``budget`` keys are walked; folders the walk did not finish are listed one by one;
- an array whose grid promises more than a page per first-level folder is split: one LIST of
  the array (its own listing) names the first-level folders, walked in parallel on the
  bounded pool (a single first-level folder, Zarr v3's ``c/``, is split one level down).

A walker that fails or stops (budget, a store out of key order) ends its part: the folders it
did not store are listed one by one, as without walks.

State and locks: a table of walks under ``_lock``; each walk's progress under its own
condition; taken in that order, then the listings cache's lock (opening a batch), and held
for table and progress updates only, never around store I/O. A waiter holds none of them
while it waits (the condition's wait releases it). The workers take no other lock than these
and the listings cache's (inside ``Batch.fill``), so a waiter can never block a worker.
"""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.gateway.namespace import DirEntries, FolderSplitter

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.caching import Batch, LoadingCache
    from n5fs.formats.base import ArrayNode
    from n5fs.kvstore.base import KvStore

log = logging.getLogger(__name__)

#: the most keys one listing request answers (S3's cap; the S3 driver asks for pages of it)
PAGE = 1000
#: parallel walkers per gateway (two saturate a local moto server; S3 likes more)
WORKERS = 4
#: first-level folders an array may be split into; more are walked as one
MAX_SPLIT = 256
#: a waiter gives up on a walk (and lists its folder alone) after this many seconds
WAIT_LIMIT = 60.0


@dataclass
class _Part:
    """One prefix a walk reads flat, and how far it has stored."""

    prefix: str
    upto: str = ""  # the last key read; every folder it closed is stored
    ended: bool = False
    whole: bool = False  # ended at the end of the prefix, not cut short

    def answers(self, folder: str) -> bool:
        """Has this part stored ``folder`` (or found it absent, or given up)?"""
        if self.ended:
            return True
        return self.upto > folder and not self.upto.startswith(folder)


@dataclass(eq=False)
class _Walk:
    array: str
    batch: Batch[DirEntries]
    budget: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    planned: bool = False
    levels: set[str] = field(default_factory=set)  # folders the plan listed by themselves
    parts: list[_Part] = field(default_factory=list)
    running: int = 0
    ended_at: float | None = None

    def answers(self, folder: str) -> bool:
        """Under ``cond``: may a waiter for ``folder`` stop waiting?"""
        if self.ended_at is not None:
            return True
        if not self.planned:
            return False
        if folder in self.levels:
            return True  # stored by the plan's LIST before any part began
        part = next((p for p in self.parts if folder.startswith(p.prefix)), None)
        return part.answers(folder) if part is not None else True

    def take(self, wanted: int) -> int:
        """Under ``cond``: reserve up to ``wanted`` keys of the budget."""
        granted = min(wanted, self.budget)
        self.budget -= granted
        return granted


class ArrayWalks:
    """The walks of one gateway's arrays (module docstring)."""

    def __init__(
        self,
        store: KvStore,
        listings: LoadingCache[DirEntries],
        *,
        budget: int,
        ttl: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.listings = listings
        self.budget = budget
        self.ttl = ttl
        self._clock = clock
        self._walks: dict[str, _Walk] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.started = 0  # walks begun (stats, tests)

    @property
    def enabled(self) -> bool:
        return self.budget > 0 and self.store.flat_listing_preferred

    def wait_for(self, array: str, folder: str, node: ArrayNode | None) -> None:
        """Return once the walk of ``array`` has answered ``folder``; start it if needed."""
        walk = self._walk_of(array, node)
        with walk.cond:
            if not walk.cond.wait_for(lambda: walk.answers(folder), WAIT_LIMIT):
                log.warning("walk of %r: no answer for %r in %g s", array, folder, WAIT_LIMIT)

    def clear(self) -> None:
        """Forget every walk: the next miss walks again (a running walk finishes; what it
        stores after this is as current as a new walk's)."""
        with self._lock:
            self._walks.clear()

    def _walk_of(self, array: str, node: ArrayNode | None) -> _Walk:
        with self._lock:
            walk = self._walks.get(array)
            if walk is not None and not self._expired(walk):
                return walk
            walk = self._walks[array] = _Walk(array, self.listings.batch(array), self.budget)
            self.started += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="n5fs-walk")
            pool = self._pool
        pool.submit(self._plan, walk, node)
        return walk

    def _expired(self, walk: _Walk) -> bool:
        with walk.cond:
            ended = walk.ended_at
        return ended is not None and self.ttl is not None and self._clock() - ended >= self.ttl

    # -- the workers ---------------------------------------------------------------------------

    def _plan(self, walk: _Walk, node: ArrayNode | None) -> None:
        try:
            levels, prefixes = self._split(walk, node)
        except Exception:  # a failed plan ends the walk: folders listed alone
            log.warning("walk of %r failed", walk.array, exc_info=True)
            levels, prefixes = set(), []
        with walk.cond:
            walk.levels, walk.parts, walk.planned = levels, [_Part(p) for p in prefixes], True
            walk.running = len(walk.parts)
            walk.cond.notify_all()
        if not walk.parts:
            self._end(walk)
        assert self._pool is not None
        for part in walk.parts:
            self._pool.submit(self._read, walk, part)

    def _split(self, walk: _Walk, node: ArrayNode | None) -> tuple[set[str], list[str]]:
        """The prefixes to walk: the array's own, or its first-level folders when the grid
        promises more than a page for each; the folders listed to find them are stored."""
        keys = math.prod(node.grid) if node is not None else 0
        level, levels = walk.array, set[str]()
        while keys >= 2 * PAGE and len(levels) < 4:
            born = self._clock()
            listing = self.store.list(level)
            walk.batch.fill([(level, DirEntries.from_listing(level, listing), born)])
            levels.add(level)
            subs = list(listing.prefixes)
            if len(subs) == 1:
                level = subs[0]  # Zarr v3's c/: split below it
                continue
            if 2 <= len(subs) <= MAX_SPLIT and keys >= PAGE * len(subs):
                return levels, subs
            return levels, [level] if subs else []
        return levels, [level]

    def _read(self, walk: _Walk, part: _Part) -> None:
        """Walk ``part`` flat, storing every folder it leaves, a page at a time."""
        whole = False
        try:
            whole = self._stream(walk, part)
        except Exception:  # the folders it did not store are listed alone
            log.warning("walk of %r failed", part.prefix, exc_info=True)
        with walk.cond:
            part.ended, part.whole = True, whole
            walk.running -= 1
            last = walk.running == 0
            walk.cond.notify_all()
        if last:
            self._end(walk)

    def _stream(self, walk: _Walk, part: _Part) -> bool:
        earlier = now = self._clock()  # asks for key i began after `earlier` was read ...
        splitter = FolderSplitter(part.prefix, now)
        keys = self.store.walk(part.prefix)
        try:
            while True:
                with walk.cond:
                    allowed = walk.take(PAGE)
                if not allowed:
                    return False  # the budget is spent: the rest is listed folder by folder
                closed, last, read = [], "", 0
                for info in keys:
                    closed += splitter.add(info, earlier)  # ... so it is no older than that
                    last, read = info.key, read + 1
                    if read == allowed:
                        break
                else:
                    walk.batch.fill(closed + splitter.finish())
                    return True
                walk.batch.fill(closed)
                with walk.cond:
                    part.upto = last
                    walk.cond.notify_all()
                earlier, now = now, self._clock()  # a page later: the next asks start here
        finally:
            close = getattr(keys, "close", None)
            if close is not None:
                close()  # a paging walk stops requesting where we stopped reading

    def _end(self, walk: _Walk) -> None:
        walk.batch.close()
        with walk.cond:
            walk.ended_at = self._clock()
            walk.cond.notify_all()
