"""Keep the kernel's view true: tell it which cached attributes went stale, off the request path.

The kernel caches what n5fs answered (attributes for ``attr_timeout``, names for
``entry_timeout``; the front makes both as long as the gateway's TTL, so one listing answers the
kernel's lookups as long as it answers the gateway's). After a commit, a refusal, a rename or an
unlink the gateway announces the paths whose cached view is now wrong (``Gateway.subscribe``): a
refused new name, the files it rewrote on its own (``.zmetadata``, a parent ``zarr.json``),
renamed and unlinked paths. Not the committed file itself when its bytes are the ones the kernel
wrote (``own_writes=False``): its pages and name are true, and FUSE drops a file's cached size
and times after each write. An :class:`Invalidator` passes each to libfuse
(:func:`n5fs.fuse_front._lib.invalidate_path`), so ``cat .zmetadata`` after another metadata
commit is not cut at the old size, and ``stat`` of a refused name asks again.

State and locks (the invalidator owns them): the pending paths (an insertion-ordered dict, so a
burst is deduplicated and served in order), the ticket counters used by :meth:`settle`, the
life-cycle state and the counters all live under one condition variable, ``_cond`` (the
ticket a thread must see served before its :meth:`settle` returns is that thread's own, in a
``threading.local``). ``_cond`` is a
leaf lock: held only for dict and counter updates, never while calling libfuse or anyone else.
So :meth:`enqueue` never blocks, and the gateway may call it from any thread while holding its
own locks. One worker thread calls ``invalidate`` for each path, outside the lock.

Why a thread, not a call inside the request: the kernel deadlocks when a notification runs in
the execution path of a related operation, for instance invalidating a name while a lookup,
create, unlink or rename on its folder holds that folder's lock (libfuse's
``fuse_lowlevel_notify_inval_entry``), or dropping the page cache of a file whose read or write
holds its pages locked. The worker holds nothing the requests need; it waits for them at worst.

The consequence is a window: the errno (or the commit's success) reaches the caller, and only
then, microseconds later, does the kernel drop its cached attributes. To close the window where
it is visible, operations that end with a commit (flush, fsync, rename, unlink, link, symlink)
:meth:`settle` before answering: they wait until everything announced so far has been passed to
the kernel, at most :data:`SETTLE_SECONDS`. The wait cannot deadlock there: libfuse's path
invalidation takes its node-table lock for a moment and, in the kernel, no folder or inode lock,
only the locks of the file's cached pages, and the kernel holds no page lock while it waits for
those six requests. Reads and writes never wait (the kernel holds their pages locked). A retried
``open(O_CREAT)`` of a new name whose commit failed (refused, a conflict, a full or failing
store) is the gateway's to accept: the path invalidation drops attributes and cached pages but
not the name, so until ``entry_timeout`` the kernel sends that open as a plain open of an
existing file (``stat`` does ask again, and answers ENOENT).

Overflow: at most :data:`MAX_PENDING` distinct paths wait. The worker passes paths to the kernel
far faster than requests announce them, so the bound is reached only when the kernel stops taking
notifications; then new paths are dropped, counted (``dropped``) and logged once per episode.
That is not free: a dropped path keeps its cached attributes until ``attr_timeout``, as on a
mount without invalidation, so the kernel may show a stale size or entry that long. It never
makes a stored byte wrong: every commit decision is the gateway's, made on its own caches.
"""

from __future__ import annotations

import enum
import errno
import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

#: distinct paths that may wait for the worker; more are dropped (see the module docstring)
MAX_PENDING = 1 << 16
#: the longest an operation waits in :meth:`Invalidator.settle` before it answers anyway
SETTLE_SECONDS = 1.0
#: how long :meth:`Invalidator.stop` waits for the worker to drain and end
STOP_SECONDS = 10.0


class _State(enum.Enum):
    NEW = "new"  # paths queue up; nothing is sent until start()
    RUNNING = "running"
    STOPPING = "stopping"  # the worker drains what is queued; new paths are dropped
    STOPPED = "stopped"


class Invalidator:
    """A queue of stale paths and the one worker thread that passes them to the kernel.

    ``invalidate(path)`` returns 0 or a negative errno (-ENOENT: nothing cached, not an
    error). It is called only between :meth:`start` and the end of :meth:`stop`, one path at a
    time, from the worker thread.
    """

    def __init__(
        self,
        invalidate: Callable[[str], int],
        *,
        limit: int = MAX_PENDING,
        name: str = "n5fs-invalidate",
    ) -> None:
        self._invalidate = invalidate
        self._limit = limit
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[str, None] = {}
        self._issued = 0  # tickets handed to enqueue() calls
        self._mine = threading.local()  # .ticket: the last one this thread was handed
        self._served = 0  # every ticket up to this one has been passed to the kernel
        self._state = _State.NEW
        self._overflowing = False
        self._thread: threading.Thread | None = None
        self.invalidations = 0  # the kernel dropped a cached view
        self.not_cached = 0  # libfuse held no node for the path: nothing to drop
        self.invalidation_errors = 0
        self.dropped = 0

    # -- the producer side (any thread, never blocks) ---------------------------------------------

    def enqueue(self, paths: Iterable[str]) -> None:
        """The gateway's callback: queue ``paths`` (absolute mount paths) and return at once."""
        with self._cond:
            if self._state not in (_State.NEW, _State.RUNNING):
                return  # the mount is ending: its kernel cache goes with it
            added = waiting = 0
            for path in paths:
                if path in self._pending:
                    waiting += 1  # queued by another call: this one's settle waits for it too
                else:
                    added += self._add(path)
            if added:
                self._issued += 1
                self._cond.notify_all()
            if added or waiting:
                self._mine.ticket = self._issued

    def _add(self, path: str) -> bool:
        """Queue one path that is not waiting yet (caller holds ``_cond``)."""
        if len(self._pending) >= self._limit:
            self.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                log.warning(
                    "cannot keep up: %d paths wait for the kernel; dropping more (their "
                    "cached attributes expire with attr_timeout)",
                    len(self._pending),
                )
            return False
        self._pending[path] = None
        return True

    def settle(self, timeout: float = SETTLE_SECONDS) -> bool:
        """Wait until every path this thread queued has been passed to the kernel (or
        ``timeout`` passed, or nothing serves the queue). True when settled.

        Only this thread's: the operation that settles is the one whose answer must come
        after its own announcements (others settle theirs); an operation that announced
        nothing, the commit of a file the kernel wrote itself, returns at once instead of
        waiting for another thread's burst."""
        target = getattr(self._mine, "ticket", 0)
        if not target:
            return True
        with self._cond:
            self._cond.wait_for(
                lambda: self._served >= target or self._state is not _State.RUNNING, timeout
            )
            return self._served >= target

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker (once the kernel connection is up: libfuse's init)."""
        with self._cond:
            if self._state is not _State.NEW:
                return
            self._state = _State.RUNNING
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Drain what is queued, end the worker, and drop everything queued later. Call it
        before the ``struct fuse`` is freed; ``invalidate`` is never called once it returns
        (unless the worker is stuck in the kernel past ``timeout``: logged)."""
        with self._cond:
            thread = self._thread
            first = self._state in (_State.NEW, _State.RUNNING)
            if self._state is _State.NEW:
                self._pending.clear()  # never started: no kernel to tell
                self._state = _State.STOPPED
            elif self._state is _State.RUNNING:
                self._state = _State.STOPPING
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the kernel invalidation thread did not end within %gs", timeout)
        if not first:
            return
        log.debug(
            "kernel invalidations: %d sent, %d not cached, %d failed, %d dropped",
            self.invalidations,
            self.not_cached,
            self.invalidation_errors,
            self.dropped,
        )

    # -- the worker -------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._state is not _State.RUNNING)
                if not self._pending:  # stopping, and drained
                    self._state = _State.STOPPED
                    self._cond.notify_all()
                    return
                batch, self._pending = list(self._pending), {}
                ticket = self._issued
                self._overflowing = False
            for path in batch:
                self._send(path)
            with self._cond:
                self._served = ticket
                self._cond.notify_all()

    def _send(self, path: str) -> None:
        """One path to the kernel; a failure is counted and logged, never raised."""
        try:
            result = self._invalidate(path)
        except Exception:
            result = -errno.EIO
            log.exception("invalidating %s in the kernel failed", path)
        with self._cond:
            if result == 0:
                self.invalidations += 1
            elif result == -errno.ENOENT:
                self.not_cached += 1
            else:
                self.invalidation_errors += 1
        if result not in (0, -errno.ENOENT):
            log.debug(
                "invalidating %s: errno %d (%s)", path, -result, errno.errorcode.get(-result, "?")
            )
