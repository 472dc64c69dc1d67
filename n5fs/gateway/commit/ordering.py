"""The order of commits: chunk commits of one array run in parallel, a metadata commit
excludes them.

Why: a metadata commit checks the stored chunks ("no chunk exists, so the dtype may change";
"every chunk already copied in is valid under the new ``.zarray``") and a chunk commit checks
its bytes against the metadata it finds. Unordered, a chunk validated against the old metadata
can land after a dtype change passed its "no chunks exist" check, and the strict-mode
invariant (every stored chunk decodes under its array's current metadata) breaks.

The rule, in terms of folders (``""``, ``"a/"``, ``"a/b/"``): a commit of key ``k`` holds every
folder above ``k`` *shared*, except that a commit of a metadata file holds its own folder
*exclusive*. A chunk lies below its array's folder, so it shares that folder; a metadata change
of the array (or of any ancestor, which could make the folder something else) excludes it.
Commits of different arrays, and chunk commits of one array, never wait for each other.

Lock discipline: :meth:`ArrayOrder.hold` acquires the folder locks of one operation in one
global order (sorted by prefix), each once, in the strongest mode needed: no two operations
can wait for each other in a cycle. A thread holds at most one ``hold`` at a time (the locks
are not re-entrant); callers take a node lock *before* ``hold`` and leaf locks (caches,
counters) inside it, never the reverse. Writers are preferred, so a stream of chunk commits
cannot starve a metadata commit. Folder locks exist only while held or awaited.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from n5fs.kvstore.keys import folders_above
from n5fs.locking import LEAF, ORDER, ranked_condition, ranked_hold, ranked_lock

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterable, Iterator


@dataclass(eq=False)
class _FolderLock:
    """A readers-writer lock with writer preference; ``users`` counts holders and waiters."""

    readers: int = 0
    writer: bool = False
    writers_waiting: int = 0
    users: int = 0
    cond: threading.Condition = field(
        default_factory=partial(ranked_condition, "commit order folder", LEAF)
    )

    def acquire(self, exclusive: bool) -> None:
        with self.cond:
            if exclusive:
                self.writers_waiting += 1
                self.cond.wait_for(lambda: not self.writer and not self.readers)
                self.writers_waiting -= 1
                self.writer = True
            else:
                self.cond.wait_for(lambda: not self.writer and not self.writers_waiting)
                self.readers += 1

    def release(self, exclusive: bool) -> None:
        with self.cond:
            if exclusive:
                self.writer = False
            else:
                self.readers -= 1
            self.cond.notify_all()


class ArrayOrder:
    """Folder locks by prefix, created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._locks: dict[str, _FolderLock] = {}
        self._lock = ranked_lock("commit order table", LEAF)
        #: what a thread holds, as a rank, while inside :meth:`hold` (lock-order checks)
        self.holding = ranked_hold("commit order hold", ORDER)

    def _get(self, prefix: str) -> _FolderLock:
        with self._lock:
            lock = self._locks.get(prefix)
            if lock is None:
                lock = self._locks[prefix] = _FolderLock()
            lock.users += 1
            return lock

    def _put(self, prefix: str, lock: _FolderLock) -> None:
        with self._lock:
            lock.users -= 1
            if not lock.users and self._locks.get(prefix) is lock:
                del self._locks[prefix]

    @contextlib.contextmanager
    def hold(self, *, shared: Iterable[str] = (), exclusive: Iterable[str] = ()) -> Iterator[None]:
        """Hold the folders in ``shared`` shared and those in ``exclusive`` exclusive."""
        plan: dict[str, bool] = dict.fromkeys(shared, False)
        plan.update(dict.fromkeys(exclusive, True))
        held: list[tuple[str, _FolderLock, bool]] = []
        with self.holding:
            try:
                for prefix in sorted(plan):
                    lock = self._get(prefix)
                    try:
                        lock.acquire(plan[prefix])
                    except BaseException:
                        self._put(prefix, lock)
                        raise
                    held.append((prefix, lock, plan[prefix]))
                yield
            finally:
                for prefix, lock, exclusive_mode in reversed(held):
                    lock.release(exclusive_mode)
                    self._put(prefix, lock)

    def for_keys(
        self, keys: Iterable[str], *, metadata: Iterable[str] = ()
    ) -> contextlib.AbstractContextManager[None]:
        """The hold for committing ``keys`` (plain) and ``metadata`` (metadata files)."""
        shared: set[str] = set()
        exclusive: set[str] = set()
        for key in keys:
            shared.update(folders_above(key))
        for key in metadata:
            above = folders_above(key)
            shared.update(above[:-1])
            exclusive.add(above[-1])
        return self.hold(shared=shared - exclusive, exclusive=exclusive)

    def for_folder(self, prefix: str) -> contextlib.AbstractContextManager[None]:
        """The hold for changing the metadata of folder ``prefix`` (``""`` or ``"a/b/"``),
        whichever of its metadata files the change turns out to write."""
        shared = set(folders_above(prefix.rstrip("/"))) if prefix else set()
        return self.hold(shared=shared, exclusive={prefix})

    def held_count(self) -> int:
        """Folder locks currently held or awaited (0 when the gateway is idle)."""
        with self._lock:
            return len(self._locks)
