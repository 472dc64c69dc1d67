"""The thread pools of one owner: each named and bounded, started at its first job, and all
shut down once.

Why one owner: the pieces of a gateway each need a few threads (read-ahead, walks of arrays,
chunk checks while writes arrive, checks of stored chunks, refreshes of slow listings). When
each started and stopped a pool of its own, nothing knew them all, and a gateway's close
stopped some and left others running until the process ended. A :class:`Workers` knows every
pool declared on it and reports them (:meth:`Workers.sizes`, :meth:`Workers.started`), and
:meth:`Workers.shutdown` stops them all in one place. The gateway makes one, hands it to its
pieces, and shuts it down in its ``close`` after the committer drained.

Invariants:

- a pool is declared once per name (the prefix of its threads' names) with its bound and its
  shutdown rule (:meth:`Workers.pool`); no thread starts before its first job, and it never
  runs more threads than its bound;
- after :meth:`Workers.shutdown` every submit raises :class:`WorkersClosed`, a RuntimeError,
  so a caller that runs the job on its own thread when the pool is gone still does; a second
  shutdown does nothing;
- at shutdown a *draining* pool runs the jobs already queued (someone waits on each: a
  read-ahead flight, a listing refresh); the others drop them (their callers do the work
  themselves, or do without it); both wait for the jobs already running.

Lock discipline: ``Workers._lock``, a leaf, guards the table of pools, their executors and
the closed flag. A submit holds it to start the pool's executor and hand it the job (a queue
put, and at most the start of one thread), so no job slips in once shutdown began; it is
never held while a job runs or while shutdown waits for one. A job may submit further jobs.

Standard library only: the module sits below every layer, so the gateway and anything under
it may use it.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Pool", "Workers", "WorkersClosed"]

P = ParamSpec("P")
R = TypeVar("R")


class WorkersClosed(RuntimeError):
    """A job was submitted to a pool whose owner has shut its pools down."""


class Pool:
    """One named pool of a :class:`Workers`: a handle to submit jobs to. Its threads are its
    owner's, started at the first job and shut down with the others."""

    __slots__ = ("_owner", "drain", "name", "size")

    def __init__(self, owner: Workers, name: str, size: int, drain: bool) -> None:
        self._owner = owner
        #: the prefix of the threads' names (``n5fs-read_0``, ...)
        self.name = name
        #: at most this many threads
        self.size = size
        #: at shutdown, queued jobs run (True) or are dropped (False)
        self.drain = drain

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Run ``fn(*args, **kwargs)`` on one of the pool's threads (started if need be);
        WorkersClosed once the owner shut down."""
        return self._owner._submit(self, fn, functools.partial(fn, *args, **kwargs))

    @property
    def closed(self) -> bool:
        """Has the owner shut its pools down? (a submit would raise WorkersClosed)"""
        return self._owner.closed

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, size={self.size}, drain={self.drain})"


class Workers:
    """The named pools of one owner (a gateway); see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, Pool] = {}
        self._executors: dict[str, ThreadPoolExecutor] = {}
        self._closed = False

    def pool(self, name: str, size: int, *, drain: bool = False) -> Pool:
        """The pool ``name`` of at most ``size`` threads, declared now or earlier with the
        same bound and rule (another bound under the same name is a ValueError: one name, one
        pool). No thread starts here."""
        if size < 1:
            raise ValueError(f"pool {name!r} needs at least one thread, not {size}")
        with self._lock:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = Pool(self, name, size, drain)
            elif (pool.size, pool.drain) != (size, drain):
                raise ValueError(f"{pool!r} is declared already; asked for size={size}")
            return pool

    def _submit(self, pool: Pool, fn: Callable[..., R], job: Callable[[], R]) -> Future[R]:
        with self._lock:
            if self._closed:
                what = getattr(fn, "__qualname__", repr(fn))
                raise WorkersClosed(f"the {pool.name} threads are shut down: {what} not run")
            executor = self._executors.get(pool.name)
            if executor is None:
                executor = ThreadPoolExecutor(pool.size, thread_name_prefix=pool.name)
                self._executors[pool.name] = executor
            return executor.submit(job)

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def sizes(self) -> dict[str, int]:
        """Every pool declared, by name: its bound (started or not)."""
        with self._lock:
            return {name: pool.size for name, pool in self._pools.items()}

    def started(self) -> frozenset[str]:
        """The pools whose threads were started (by a first job), shut down since or not."""
        with self._lock:
            return frozenset(self._executors)

    def shutdown(self) -> None:
        """Stop every pool, once: no job is taken any more; queued jobs run in draining pools
        and are dropped in the others; returns when every started thread has ended. Must not
        be called from a thread of one of the pools (it would wait for itself)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = [(self._pools[name], ex) for name, ex in self._executors.items()]
        for pool, executor in started:  # all stop taking jobs before any is waited for
            executor.shutdown(wait=False, cancel_futures=not pool.drain)
        for _, executor in started:
            executor.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"Workers({self.sizes()}, closed={self.closed})"
