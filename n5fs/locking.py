"""Ranked locks: the gateway's lock order as code, checked on every acquire when asked.

Why: the order is what keeps the gateway free of deadlocks (``docs/internals.md``, "Lock
discipline"), and prose does not stop a change from breaking it. Every lock of the gateway
(and of :mod:`n5fs.singleflight`) is made here with its *rank*; a thread may only take a lock
of a later rank than every lock it holds:

1. :data:`NODE`: a node's lock (an open file's staged bytes and its commit); two of them only
   in key order (:func:`acquire_in_order`: a rename or a link);
2. :data:`ORDER`: a commit-order hold (:class:`~n5fs.gateway.commit.ordering.ArrayOrder`), one
   per thread, all its folders at once; it is not a mutex, so it is a :func:`ranked_hold`;
3. :data:`CONSOLIDATED`: the consolidated-metadata lock;
4. leaf locks (caches, tables, counters, budgets), held for dictionary and counter work only:
   :data:`LEAF` takes nothing inside; :data:`OUTER_LEAF` is a leaf that takes a :data:`LEAF`
   inside and nothing else (a read flight table reserving in the byte cache, a chunk check
   reserving from the staging budget: each names why in its module).

Modes: with ``N5FS_DEBUG_LOCKS=1`` in the environment when a lock is *made*, the factories
return checked locks. Each thread keeps a stack of the ranked locks it holds; an acquire that
breaks the order, or a second acquire of a non-reentrant lock by its holder (a certain
deadlock), raises :class:`LockOrderError` naming both locks and the thread; it is logged
(``n5fs.locking``) and kept for :func:`take_violations`, so one raised on a thread whose
errors are swallowed is still found. A try-lock (``blocking=False``) is not checked: it
cannot wait. :func:`assert_held` and :func:`assert_none_held` turn "caller holds ..." into
checks. Without the variable the factories return plain ``threading`` locks and the asserts
return after one global check: nothing on the hot path changes. The race and stress tests
run with the checks on (``tests/conftest.py``, the ``debug_locks`` marker).

State and locks: each thread's stack is thread-local. A checked lock's owner and depth are
written only by the thread that holds its inner lock. The violations are kept under
``_violations_lock``, the checker's own, unranked, with nothing taken under it. This module
imports only the standard library: every layer may use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import cast

log = logging.getLogger(__name__)

#: the environment variable that turns the checks on (for locks made while it is "1")
ENV = "N5FS_DEBUG_LOCKS"

#: a view file's node (:meth:`~n5fs.gateway.write.handles.OpenFiles.open_translated`): its
#: commit writes native files, so it comes before every native node
VIEW_NODE = 5
NODE = 10
ORDER = 20
CONSOLIDATED = 30
OUTER_LEAF = 35
LEAF = 40

_RANK_NAMES = {
    VIEW_NODE: "view file node",
    NODE: "node",
    ORDER: "commit order",
    CONSOLIDATED: "consolidated",
    OUTER_LEAF: "outer leaf",
    LEAF: "leaf",
}

#: True once a checked lock or hold was made in this process: until then every assert
#: returns at once
_checking = False

_local = threading.local()
_violations: list[str] = []
_violations_lock = threading.Lock()
#: violations kept (the oldest are dropped past this)
_KEPT = 1000


class LockOrderError(AssertionError):
    """A thread broke the lock order, re-took a lock it holds, or misses a lock it must hold."""


def checks_requested() -> bool:
    """Would a lock made now be checked?"""
    return os.environ.get(ENV) == "1"


def ranked_lock(name: str, rank: int) -> threading.Lock:
    """A lock of ``rank`` (checked in debug mode, else a plain ``threading.Lock``)."""
    if not checks_requested():
        return threading.Lock()
    return cast("threading.Lock", _Checked(name, rank, reentrant=False))


def ranked_rlock(name: str, rank: int) -> threading.RLock:
    """A reentrant lock of ``rank`` (checked in debug mode, else a plain ``threading.RLock``)."""
    if not checks_requested():
        return threading.RLock()
    return cast("threading.RLock", _Checked(name, rank, reentrant=True))


def ranked_condition(name: str, rank: int) -> threading.Condition:
    """A condition over a :func:`ranked_lock` of ``rank``."""
    return threading.Condition(ranked_lock(name, rank))


def ranked_hold(name: str, rank: int) -> contextlib.AbstractContextManager[None]:
    """The rank a thread holds while inside a ``with`` of it, for a hold that is no mutex of
    its own (a commit-order hold: many threads hold it at once, each as one rank). Checked in
    debug mode; else a no-op context."""
    if not checks_requested():
        return contextlib.nullcontext()
    return _Hold(name, rank)


def acquire_in_order(lock: threading.RLock | threading.Lock, key: str) -> None:
    """Acquire ``lock``, one of several of the same rank the caller takes in ascending
    ``key`` order (two nodes of a rename): in debug mode a lock of the same rank already held
    is allowed only under a smaller key."""
    checked: object = lock  # typed as the plain lock it stands for
    if isinstance(checked, _Checked):
        checked.acquire_ordered(key)
    else:
        lock.acquire()


def assert_held(lock: object) -> None:
    """Raise :class:`LockOrderError` unless the calling thread holds ``lock`` (a ranked lock
    or hold, or a condition over a ranked lock); a plain lock is not checked."""
    if not _checking:
        return
    if isinstance(lock, threading.Condition):
        lock = getattr(lock, "_lock", None)
    if isinstance(lock, _Checked | _Hold) and not lock.held_here():
        _fail(f"thread {_thread_name()} does not hold {lock}, which it must hold here")


def assert_none_held(from_rank: int = NODE) -> None:
    """Raise :class:`LockOrderError` if the calling thread holds a ranked lock of rank
    ``from_rank`` or later: ``assert_none_held()`` where no gateway lock may be held (a
    pool worker), ``assert_none_held(OUTER_LEAF)`` where no leaf lock may be (store I/O)."""
    if not _checking:
        return
    held = [entry for entry, _ in _stack() if entry.rank >= from_rank]
    if held:
        names = ", ".join(str(entry) for entry in held)
        _fail(f"thread {_thread_name()} holds {names} where it may hold none of that rank")


def held_locks() -> list[str]:
    """The ranked locks the calling thread holds, oldest first (debug mode; tests)."""
    return [str(entry) for entry, _ in _stack()]


def take_violations() -> list[str]:
    """The violations found in this process since the last call (the last :data:`_KEPT`),
    oldest first; they are forgotten."""
    with _violations_lock:
        found = list(_violations)
        _violations.clear()
    return found


# -- the checker -------------------------------------------------------------------------------


def _stack() -> list[tuple[_Checked | _Hold, str | None]]:
    """The calling thread's held ranked locks, with the key each was taken under."""
    try:
        stack: list[tuple[_Checked | _Hold, str | None]] = _local.stack
    except AttributeError:
        stack = _local.stack = []
    return stack


def _thread_name() -> str:
    return repr(threading.current_thread().name)


def _fail(message: str) -> None:
    with _violations_lock:
        _violations.append(message)
        del _violations[:-_KEPT]
    log.error("LockOrderError: %s", message)
    raise LockOrderError(message)


def _check_order(taking: _Checked | _Hold, key: str | None) -> None:
    """May the calling thread take ``taking`` (under ``key``) with what it holds now?"""
    for held, held_key in _stack():
        if held.rank < taking.rank:
            continue
        if held.rank == taking.rank and key is not None and held_key is not None:
            if held_key < key:
                continue
            why = f"same rank, and key {key!r} is not after {held_key!r}"
        elif held.rank == taking.rank:
            why = "same rank, not taken in key order"
        else:
            why = "a later rank is held"
        _fail(
            f"thread {_thread_name()} takes {taking} while it holds {held} ({why}); the "
            "order is node -> commit order -> consolidated -> outer leaf -> leaf"
        )


def _forget(stack: list[tuple[_Checked | _Hold, str | None]], lock: _Checked | _Hold) -> None:
    for at in range(len(stack) - 1, -1, -1):
        if stack[at][0] is lock:
            del stack[at]
            return


class _Checked:
    """A checked lock (debug mode): a plain lock, its owner and depth, and the order checks.
    It offers what ``threading.Condition`` looks for (``_is_owned``, ``_release_save``,
    ``_acquire_restore``), so a condition's wait lets go and takes it back through the
    checks."""

    def __init__(self, name: str, rank: int, *, reentrant: bool) -> None:
        global _checking
        _checking = True
        self.name = name
        self.rank = rank
        self._reentrant = reentrant
        self._inner = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._owner_stack: list[tuple[_Checked | _Hold, str | None]] | None = None

    def __str__(self) -> str:
        return f"{self.name!r} (rank {_RANK_NAMES.get(self.rank, self.rank)})"

    def held_here(self) -> bool:
        return self._owner == threading.get_ident()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._acquire(None, blocking, timeout)

    def acquire_ordered(self, key: str) -> None:
        self._acquire(key, True, -1)

    def _acquire(self, key: str | None, blocking: bool, timeout: float) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            if self._reentrant:
                self._depth += 1
                return True
            if not blocking:
                return False
            _fail(f"thread {_thread_name()} takes {self} again while it holds it (a deadlock)")
        if blocking:  # a try-lock cannot deadlock
            _check_order(self, key)
        if not self._inner.acquire(blocking, timeout):
            return False
        stack = _stack()
        stack.append((self, key))
        self._owner, self._depth, self._owner_stack = me, 1, stack
        return True

    def release(self) -> None:
        if self._owner is None:
            raise RuntimeError(f"release of {self}, which is not held")
        if self._owner != threading.get_ident() and self._reentrant:
            raise RuntimeError(f"release of {self} by a thread that does not hold it")
        if self._depth > 1:
            self._depth -= 1
            return
        stack = self._owner_stack
        if stack is not None:
            _forget(stack, self)
        self._owner, self._depth, self._owner_stack = None, 0, None
        self._inner.release()

    def locked(self) -> bool:
        return self._inner.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # what threading.Condition uses when the lock has it
    def _is_owned(self) -> bool:
        return self.held_here()

    def _release_save(self) -> int:
        depth, self._depth = self._depth, 1
        self.release()
        return depth

    def _acquire_restore(self, depth: int) -> None:
        self.acquire()
        self._depth = depth


class _Hold:
    """A rank held inside a ``with`` (debug mode), by any number of threads at once."""

    def __init__(self, name: str, rank: int) -> None:
        global _checking
        _checking = True
        self.name = name
        self.rank = rank

    def __str__(self) -> str:
        return f"{self.name!r} (rank {_RANK_NAMES.get(self.rank, self.rank)})"

    def held_here(self) -> bool:
        return any(entry is self for entry, _ in _stack())

    def __enter__(self) -> None:
        _check_order(self, None)
        _stack().append((self, None))

    def __exit__(self, *exc: object) -> None:
        _forget(_stack(), self)
