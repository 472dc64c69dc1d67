"""Walks: one flat listing of a whole array answers every folder of its chunk tree.

Why: listed folder by folder, a chunk tree costs one LIST request per folder on S3 (a Zarr v2
array of 51,200 chunks in 1,641 folders: 1,641 requests, each as slow as a page of 1,000
keys); a flat (delimiter-less) listing of the array answers up to 1,000 keys of any folders
per request. Stores say whether they prefer it (``StoreTraits.flat_listing_preferred``: S3, zip,
memory; not a directory on disk, where one ``scandir`` lists a folder).

How (:class:`ArrayWalks`):

- the first folder of an array that misses its listing starts the array's *walk* on a
  background worker and waits only until the walk has passed that folder. In key order a
  folder's keys are one run, so a folder is whole as soon as the walk reads a key beyond it,
  and it is stored then: ``find`` and ``ls -R``, which visit folders in that same order, run
  along with the walk instead of after it;
- an array whose grid promises more than a page per first-level folder is split: one LIST of
  the array (its own listing) names the first-level folders (a single one, Zarr v3's ``c/``,
  is split one level down), and each is a *part*, walked when someone needs a folder in it,
  together with the next :data:`AHEAD` parts in key order and in grid order (``find`` goes
  in key order, a reader of chunks in grid order: ``2/`` after ``1/``, not ``10/``), on a
  bounded pool. So the walks follow their readers: a slow reader (a stat storm on S3 pays a
  HEAD per file) does not have the whole array walked again at each TTL;
- every miss in a part waits on that part's walk (one walk per part however many threads
  ask); a part is walked again when it is needed once ``ttl`` has passed since it ended. A
  waiter waits about two pages' time (once pages were timed): a walk further from its folder
  lets it list the folder alone meanwhile;
- folders go into the listings cache through a :class:`~n5fs.singleflight.Batch` per part, each
  with the time the request that read its first key began (a request answers at most
  :data:`PAGE` keys, so it began no later than the walk's ask for the key :data:`PAGE` keys
  earlier): a folder that a commit or invalidation touched after that time is not stored,
  and no live listing is overwritten, so a walk can never hide a commit;
- at most ``budget`` keys are walked per part (a whole array unless it is split); folders a
  walk did not finish (budget, a failure, a store out of key order) are listed one by one,
  as without walks.

State and locks: a table of walks under ``_lock``; each walk's plan and parts under its own
condition; taken in that order, then the listings cache's lock (a batch), and held for
table and progress updates only, never around store I/O. A waiter holds none of them while
it waits (the condition's wait releases it); the workers take no other locks, so a waiter
can never block a worker. The workers are the gateway's ``n5fs-walk`` pool
(:class:`~n5fs.workers.Workers`): started at the first walk, stopped by the gateway's close
(queued parts dropped; once it is shut, folders are listed alone).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from n5fs.gateway.namespace.paths import DirEntries, FolderSplitter
from n5fs.locking import LEAF, assert_none_held, ranked_condition, ranked_lock

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from n5fs.formats.base import ArrayNode
    from n5fs.kvstore.base import KvStore
    from n5fs.singleflight import Batch, LoadingCache
    from n5fs.workers import Workers

log = logging.getLogger(__name__)

#: the most keys one listing request answers (S3's cap; the S3 driver asks for pages of it)
PAGE = 1000
#: the walk pool (:class:`~n5fs.workers.Workers`): its threads' name, and parallel walkers per
#: gateway (two saturate a local moto server; S3 likes more)
WALK_POOL = "n5fs-walk"
WORKERS = 4
#: parts walked ahead of a needed one, in key order and in grid order each
AHEAD = 1
#: first-level folders an array may be split into; more are walked as one
MAX_SPLIT = 256
#: a waiter gives up on a walk (and lists its folder alone) after this many seconds
WAIT_LIMIT = 60.0
#: the least a waiter waits for a walk once pages are timed (seconds)
MIN_PATIENCE = 0.02


@dataclass(eq=False)
class _Part:
    """One prefix a walk reads flat, and how far it has stored."""

    prefix: str
    started: bool = False
    upto: str = ""  # the last key read; every folder it closed is stored
    ended_at: float | None = None  # TTL clock

    def answers(self, folder: str) -> bool:
        """Has this part stored ``folder`` (or found it absent, or given up)?"""
        if self.ended_at is not None:
            return True
        return self.started and self.upto > folder and not self.upto.startswith(folder)


def _grid_order(part: _Part) -> list[str | int]:
    """``a/10/`` after ``a/9/``: digit runs compare as numbers (str and int alternate)."""
    return [int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", part.prefix))]


@dataclass(eq=False)
class _Walk:
    array: str
    cond: threading.Condition = field(default_factory=partial(ranked_condition, "walk", LEAF))
    planned_at: float | None = None  # TTL clock
    levels: set[str] = field(default_factory=set)  # folders the plan listed by themselves
    parts: list[_Part] = field(default_factory=list)  # key order
    by_grid: list[_Part] = field(default_factory=list)  # grid order
    running: int = 0  # the plan or parts being read

    def answers(self, folder: str) -> bool:
        """Under ``cond``: may a waiter for ``folder`` stop waiting?"""
        if self.planned_at is None:
            return False
        if folder in self.levels:
            return True  # stored by the plan's LIST before any part began
        part = self.part_of(folder)
        return part is None or part.answers(folder)

    def part_of(self, folder: str) -> _Part | None:
        return next((p for p in self.parts if folder.startswith(p.prefix)), None)

    def demand(self, folder: str, now: float, ttl: float | None) -> list[_Part]:
        """Under ``cond``: the parts to read now for a waiter of ``folder`` (module
        docstring); each is marked started."""
        part = self.part_of(folder)
        if part is None:
            return []
        wanted = [part]
        for order in (self.parts, self.by_grid):
            at = order.index(part)
            wanted += order[at + 1 : at + 1 + AHEAD]
        out = []
        for want in dict.fromkeys(wanted):
            ended = want.ended_at
            if ended is not None and ttl is not None and now - ended >= ttl:
                fresh = _Part(want.prefix)  # read again: what it stored has expired
                self.parts[self.parts.index(want)] = fresh
                self.by_grid[self.by_grid.index(want)] = fresh
                want = fresh
            if not want.started:
                want.started = True
                out.append(want)
        self.running += len(out)
        return out


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
        workers: Workers,
    ) -> None:
        self.store = store
        self.listings = listings
        self.budget = budget
        self.ttl = ttl
        self._clock = clock
        self._walks: dict[str, _Walk] = {}
        self._lock = ranked_lock("walks", LEAF)
        #: the walk pool (its owner's): queued walks are dropped at shutdown (their waiters
        #: wait with a deadline, then list their folders alone)
        self._pool = workers.pool(WALK_POOL, WORKERS)
        self._page_seconds: float | None = None  # a page of a walk takes this long (average)
        self.started = 0  # plans made (stats, tests)

    @property
    def enabled(self) -> bool:
        """Walks answer misses: the store prefers them, and the pool is not shut down (then
        every folder is listed alone)."""
        return (
            self.budget > 0 and self.store.traits.flat_listing_preferred and not self._pool.closed
        )

    def wait_for(self, array: str, folder: str, node: ArrayNode | None) -> None:
        """Return once the walk of ``array`` has answered ``folder`` (start what it needs),
        or once the waiter's patience ran out: then its caller lists the folder alone."""
        walk = self._walk_of(array, node)
        patience = self._patience()
        deadline = time.monotonic() + (patience or WAIT_LIMIT)
        with walk.cond:
            left = max(0.0, deadline - time.monotonic())
            if not walk.cond.wait_for(lambda: walk.planned_at is not None, left):
                return
            start = walk.demand(folder, self._clock(), self.ttl)
        for part in start:
            self._submit(self._read, walk, part)
        with walk.cond:
            left = max(0.0, deadline - time.monotonic())
            answered = walk.cond.wait_for(lambda: walk.answers(folder), left)
        if not answered and patience is None:
            log.warning("walk of %r: no answer for %r in %g s", array, folder, WAIT_LIMIT)

    def _patience(self) -> float | None:
        """How long a waiter waits before it lists its folder alone: two pages of a walk. A
        reader that goes in key order is never much more than a page behind its part's walk;
        one that jumps ahead would otherwise wait for the walk to get there. None until a
        page was timed (the first walk of a gateway): then a waiter waits for its answer."""
        with self._lock:
            page = self._page_seconds
        return None if page is None else max(MIN_PATIENCE, 2 * page)

    def _timed_page(self, seconds: float) -> None:
        with self._lock:
            old = self._page_seconds
            self._page_seconds = seconds if old is None else 0.7 * old + 0.3 * seconds

    def clear(self) -> None:
        """Forget every walk: the next miss walks again (a running walk finishes; what it
        stores after this is as current as a new walk's)."""
        with self._lock:
            self._walks.clear()

    def _walk_of(self, array: str, node: ArrayNode | None) -> _Walk:
        """The array's walk; a new one (its plan made) at the first miss since ``clear``.

        A plan outlives the TTL: it only names the parts (a first-level folder made since is
        in none, so its folders are listed one by one, as without walks)."""
        with self._lock:
            walk = self._walks.get(array)
            if walk is not None:
                return walk
            walk = self._walks[array] = _Walk(array, running=1)
            self.started += 1
        self._submit(self._plan, walk, node)
        return walk

    def _submit(self, job: Callable[..., None], *args: object) -> None:
        self._pool.submit(job, *args)

    # -- the workers ---------------------------------------------------------------------------

    def _plan(self, walk: _Walk, node: ArrayNode | None) -> None:
        assert_none_held()  # a worker: no gateway lock, so a waiter may hold any
        try:
            levels, prefixes = self._split(walk.array, node)
        except Exception:  # a failed plan: every folder is listed alone
            log.warning("walk of %r failed", walk.array, exc_info=True)
            levels, prefixes = set(), []
        parts = [_Part(prefix) for prefix in prefixes]
        with walk.cond:
            walk.levels, walk.parts = levels, parts
            walk.by_grid = sorted(parts, key=_grid_order)
            walk.planned_at = self._clock()
            walk.running -= 1
            walk.cond.notify_all()

    def _split(self, array: str, node: ArrayNode | None) -> tuple[set[str], list[str]]:
        """The prefixes to walk: the array's own, or its first-level folders when the grid
        promises more than a page for each; the folders listed to find them are stored."""
        keys = math.prod(node.grid) if node is not None else 0
        level, levels = array, set[str]()
        while keys >= 2 * PAGE and len(levels) < 4:
            with self.listings.batch(level) as batch:
                born = self._clock()
                listing = self.store.list(level)
                batch.fill([(level, DirEntries.from_listing(level, listing), born)])
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
        assert_none_held()
        try:
            with self.listings.batch(part.prefix) as batch:
                self._stream(walk, part, batch)
        except Exception:  # the folders it did not store are listed alone
            log.warning("walk of %r failed", part.prefix, exc_info=True)
        with walk.cond:
            part.ended_at = self._clock()
            walk.running -= 1
            walk.cond.notify_all()

    def _stream(self, walk: _Walk, part: _Part, batch: Batch[DirEntries]) -> None:
        earlier = now = self._clock()  # asks for key i began after `earlier` was read ...
        splitter = FolderSplitter(part.prefix, now)
        keys = self.store.walk(part.prefix)
        budget = self.budget
        try:
            while True:
                allowed = min(PAGE, budget)
                budget -= allowed
                if not allowed:
                    return  # the budget is spent: the rest is listed folder by folder
                closed, last, read = [], "", 0
                began = time.monotonic()  # real time, for patience (not the TTL clock)
                for info in keys:
                    closed += splitter.add(info, earlier)  # ... so it is no older than that
                    last, read = info.key, read + 1
                    if read == allowed:
                        break
                else:
                    batch.fill(closed + splitter.finish())
                    self._timed_page(time.monotonic() - began)
                    return
                batch.fill(closed)
                with walk.cond:
                    part.upto = last
                    walk.cond.notify_all()
                self._timed_page(time.monotonic() - began)
                earlier, now = now, self._clock()  # a page later: the next asks start here
        finally:
            close = getattr(keys, "close", None)
            if close is not None:
                close()  # a paging walk stops requesting where we stopped reading
