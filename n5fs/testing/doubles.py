"""Test doubles: store wrappers that count, pause or misbehave on demand, and a clock that
moves only when a test moves it.

Not product code: nothing under ``n5fs`` outside ``n5fs.testing`` imports this module. A store
double wraps a real store (:class:`~n5fs.kvstore.wrappers.ForwardingStore`) and changes only
what a test asks for; it passes on the abilities of the store it wraps as any wrapper does
(:mod:`n5fs.kvstore.abilities`), except those a fault would be gone around by.

- :class:`CountingStore` records every call (method, keys, byte range) and runs hooks before
  or after a named method for matching keys. A :class:`Gate` is such a hook that pauses the
  call until the test releases it: the deterministic way to make a race happen, by stopping
  one thread between a load and a store while another does its part.
- :class:`FaultyStore` raises backend errors on chosen operations.

Lock discipline: each double has one lock, held only to record a call and pick its hooks or
faults; hooks run outside it (a gate may pause for as long as its test wants). A
:class:`Gate` has a condition of its own.
"""

from __future__ import annotations

import fnmatch
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias, TypeVar

from n5fs.errors import N5fsError, StoreUnavailable
from n5fs.kvstore.abilities import LocalFiles, NameListings
from n5fs.kvstore.wrappers import ForwardingStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, Versioned
    from n5fs.kvstore.tempnames import Leftover

    #: which keys a hook or a query is about: None for any, a glob (``fnmatch``: ``*`` also
    #: crosses ``/``; a name without ``*?[`` matches exactly), or a predicate
    KeyPattern: TypeAlias = str | Callable[[str], bool] | None

__all__ = ["WAIT", "Call", "Clock", "CountingStore", "FaultyStore", "Gate", "Hook"]

#: how long a gate waits to be reached or released: a deadlock fails its test, never hangs it
WAIT = 30.0

_T = TypeVar("_T")

#: the KvStore operations a :class:`CountingStore` records and can hook (the capability
#: properties and ``fault_counters`` are answered, not recorded)
OPERATIONS = frozenset(
    {
        "get",
        "get_versioned",
        "get_many",
        "stat",
        "list",
        "walk",
        "nothing_at",
        "local_path",
        "local_folder",
        "set",
        "set_if",
        "set_with_mtime",
        "set_mtime",
        "put_file",
        "put_file_with_mtime",
        "move_file",
        "delete",
        "delete_many",
        "delete_prefix",
        "copy",
        "copy_many",
        "rename",
        "rename_prefix",
        "make_prefix",
        "remove_prefix",
        "leftovers",
        "remove_leftover",
        "probe_conditional_writes",
        "flush",
        "refresh",
        "close",
    }
)


@dataclass(frozen=True)
class Call:
    """One call a :class:`CountingStore` passed on.

    ``keys`` are what the call names: its key, the prefix of a listing or a walk, the
    destination of a copy or a rename, every key of a batch (``get_many``, ``delete_many``,
    the destinations of ``copy_many``); empty for calls about no key (``flush``). ``src`` is
    the source key of a copy or a rename, or the local file of ``put_file``/``move_file``.
    """

    op: str
    keys: tuple[str, ...] = ()
    byte_range: ByteRange | None = None
    src: str | None = None

    @property
    def key(self) -> str:
        """The first key named ('' for none): the one key of every call but a batch's."""
        return self.keys[0] if self.keys else ""


def _ops(op: str | Iterable[str]) -> frozenset[str]:
    ops = frozenset([op] if isinstance(op, str) else op)
    unknown = ops - OPERATIONS
    if unknown or not ops:
        raise ValueError(f"unknown operations {sorted(unknown)}; any of {sorted(OPERATIONS)}")
    return ops


def _matcher(key: KeyPattern) -> Callable[[str], bool] | None:
    if key is None or callable(key):
        return key
    pattern = key
    return lambda name: fnmatch.fnmatchcase(name, pattern)


def _names(call: Call, match: Callable[[str], bool] | None) -> bool:
    return match is None or any(match(key) for key in call.keys)


@dataclass
class Hook:
    """An action a :class:`CountingStore` runs before or after the calls it matches.

    ``times`` is how many more calls it runs for (None: every one); ``fired`` how many it ran
    for. An action that raises fails the call with that error (after the inner call has run,
    for an ``after`` hook).
    """

    ops: frozenset[str]
    action: Callable[[Call], object]
    match: Callable[[str], bool] | None
    when: Literal["before", "after"]
    times: int | None
    fired: int = field(default=0, init=False)


class Gate:
    """Pauses each call it is hooked to until :meth:`release`; records the calls that
    reached it.

    A race test installs one with :meth:`CountingStore.gate`, starts the thread that will
    reach it, :meth:`wait_reached`, makes the other party act (a commit, an invalidation),
    then releases. Once released, calls pass without pausing. Waiting past ``timeout``
    (either side) raises AssertionError, so a deadlock fails the test instead of hanging it.
    """

    def __init__(self, timeout: float = WAIT) -> None:
        self.timeout = timeout
        self._cond = threading.Condition()
        self._reached: list[Call] = []
        self._open = False

    def __call__(self, call: Call) -> None:
        with self._cond:
            self._reached.append(call)
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._open, self.timeout):
                raise AssertionError(f"the gate at {call.op} {call.key!r} was never released")

    @property
    def reached(self) -> list[Call]:
        """The calls that got to the gate so far, in order."""
        with self._cond:
            return list(self._reached)

    def wait_reached(self, count: int = 1) -> list[Call]:
        """Wait until ``count`` calls are at (or past) the gate; return them."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._reached) >= count, self.timeout):
                raise AssertionError(
                    f"{count} call(s) expected at the gate, {len(self._reached)} reached it"
                )
            return list(self._reached)

    def release(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()


class CountingStore(ForwardingStore):
    """Records every call it passes on, and runs hooks around them.

    Counting: :meth:`count`, :meth:`per_key`, :meth:`calls_of` and :meth:`ranges` answer from
    the record; :meth:`clear` forgets it. Hooks: :meth:`hook` runs an action before or after
    a named method for matching keys; :meth:`gate` is a hook that pauses the call there.
    Several hooks on one call run in the order they were installed.

    A call is recorded before it reaches the inner store, so one that fails is counted too.
    An ``after`` hook runs once the inner call returned: the value is loaded but not yet
    handed to the caller. For ``walk`` that means the whole walk is read first, only while
    an ``after`` hook matches it; otherwise the inner store's iterator is passed on as is.
    Calls the inner store makes to itself are not seen (a wrapper sees only what comes
    through it).
    """

    def __init__(self, inner: KvStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._log: list[Call] = []
        self._hooks: list[Hook] = []

    # -- hooks --------------------------------------------------------------------------------

    def hook(
        self,
        op: str | Iterable[str],
        action: Callable[[Call], object],
        *,
        key: KeyPattern = None,
        when: Literal["before", "after"] = "before",
        times: int | None = None,
    ) -> Hook:
        """Run ``action(call)`` before (or after) each call of ``op`` (a name or several)
        naming a key that ``key`` matches, for the next ``times`` such calls (None: all)."""
        if when not in ("before", "after"):
            raise ValueError(f"when is 'before' or 'after', not {when!r}")
        hook = Hook(_ops(op), action, _matcher(key), when, times)
        with self._lock:
            self._hooks.append(hook)
        return hook

    def gate(
        self,
        op: str | Iterable[str],
        key: KeyPattern = None,
        *,
        when: Literal["before", "after"] = "after",
        times: int | None = 1,
        timeout: float = WAIT,
    ) -> Gate:
        """Pause the next ``times`` matching calls (None: all) until the gate is released;
        by default the first one, after the inner call returned. Every armed gate a call
        matches pauses it: a gate for the call after that one is installed once the first
        gate is reached."""
        gate = Gate(timeout)
        self.hook(op, gate, key=key, when=when, times=times)
        return gate

    def _take(self, call: Call, when: str) -> list[Callable[[Call], object]]:
        """The actions to run at ``when`` of ``call``, each hook's count taken (lock held)."""
        actions = []
        for hook in self._hooks:
            if hook.when != when or hook.times == 0 or call.op not in hook.ops:
                continue
            if not _names(call, hook.match):
                continue
            if hook.times is not None:
                hook.times -= 1
            hook.fired += 1
            actions.append(hook.action)
        return actions

    def _hooked_after(self, call: Call) -> bool:
        with self._lock:
            return any(
                h.when == "after" and h.times != 0 and call.op in h.ops and _names(call, h.match)
                for h in self._hooks
            )

    def _before(self, call: Call) -> None:
        with self._lock:
            self._log.append(call)
            actions = self._take(call, "before")
        for action in actions:
            action(call)

    def _after(self, call: Call) -> None:
        with self._lock:
            actions = self._take(call, "after")
        for action in actions:
            action(call)

    def _run(self, call: Call, inner: Callable[[], _T]) -> _T:
        self._before(call)
        result = inner()
        self._after(call)
        return result

    # -- the record ---------------------------------------------------------------------------

    def calls_of(
        self,
        op: str | Iterable[str] | None = None,
        key: KeyPattern = None,
    ) -> list[Call]:
        """The recorded calls of ``op`` (None: of any) naming a key ``key`` matches, in order."""
        ops = None if op is None else _ops(op)
        match = _matcher(key)
        with self._lock:
            log = list(self._log)
        return [c for c in log if (ops is None or c.op in ops) and _names(c, match)]

    def count(
        self,
        op: str | Iterable[str] | None = None,
        key: KeyPattern = None,
    ) -> int:
        """How many calls of ``op`` named a key ``key`` matches (a batch counts once)."""
        return len(self.calls_of(op, key))

    def per_key(self, op: str | Iterable[str]) -> Counter[str]:
        """How often ``op`` named each key (each key of a batch counts)."""
        return Counter(key for call in self.calls_of(op) for key in call.keys)

    def ranges(self, key: KeyPattern = None) -> list[ByteRange | None]:
        """The byte range of each ``get`` of a key ``key`` matches (None: the whole value)."""
        return [call.byte_range for call in self.calls_of("get", key)]

    def clear(self) -> None:
        """Forget the calls recorded so far; hooks stay."""
        with self._lock:
            self._log.clear()

    # -- reads --------------------------------------------------------------------------------

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self._run(Call("get", (key,), byte_range), lambda: self.inner.get(key, byte_range))

    def get_versioned(self, key: str) -> Versioned | None:
        return self._run(
            Call("get_versioned", (key,)), lambda: super(CountingStore, self).get_versioned(key)
        )

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = list(keys)
        return self._run(Call("get_many", tuple(keys)), lambda: self.inner.get_many(keys))

    def stat(self, key: str) -> KeyInfo | None:
        return self._run(Call("stat", (key,)), lambda: self.inner.stat(key))

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        return self._run(Call("list", (prefix,)), lambda: self.inner.list(prefix, delimiter))

    def list_names(self, prefix: str) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """Recorded and hooked as a ``list`` of the folder: it is one (without sizes)."""
        return self._run(
            Call("list", (prefix,)), lambda: super(CountingStore, self).list_names(prefix)
        )

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        call = Call("walk", (prefix,))
        self._before(call)
        if not self._hooked_after(call):
            return self.inner.walk(prefix)
        infos = [*self.inner.walk(prefix)]  # the store has answered; the caller has not yet
        self._after(call)
        return iter(infos)

    def nothing_at(self, key: str) -> bool:
        return self._run(Call("nothing_at", (key,)), lambda: self.inner.nothing_at(key))

    def local_path(self, key: str) -> str | None:
        return self._run(
            Call("local_path", (key,)), lambda: super(CountingStore, self).local_path(key)
        )

    def local_folder(self, prefix: str) -> str | None:
        return self._run(
            Call("local_folder", (prefix,)), lambda: super(CountingStore, self).local_folder(prefix)
        )

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        return self._run(Call("leftovers", (prefix,)), lambda: self.inner.leftovers(prefix))

    def probe_conditional_writes(self) -> str | None:
        return self._run(Call("probe_conditional_writes"), super().probe_conditional_writes)

    # -- writes -------------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        self._run(Call("set", (key,)), lambda: self.inner.set(key, value))

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        return self._run(
            Call("set_if", (key,)),
            lambda: super(CountingStore, self).set_if(key, value, version=version),
        )

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        return self._run(
            Call("set_with_mtime", (key,)), lambda: self.inner.set_with_mtime(key, value, mtime)
        )

    def set_mtime(self, key: str, mtime: float) -> None:
        self._run(Call("set_mtime", (key,)), lambda: self.inner.set_mtime(key, mtime))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        call = Call("put_file", (key,), src=os.fspath(path))
        self._run(call, lambda: self.inner.put_file(key, path))

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        call = Call("put_file_with_mtime", (key,), src=os.fspath(path))
        return self._run(call, lambda: self.inner.put_file_with_mtime(key, path, mtime))

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        call = Call("move_file", (key,), src=os.fspath(path))
        self._run(call, lambda: self.inner.move_file(key, path))

    def delete(self, key: str) -> None:
        self._run(Call("delete", (key,)), lambda: self.inner.delete(key))

    def delete_many(self, keys: Sequence[str]) -> None:
        self._run(Call("delete_many", tuple(keys)), lambda: self.inner.delete_many(keys))

    def delete_prefix(self, prefix: str) -> int:
        return self._run(Call("delete_prefix", (prefix,)), lambda: self.inner.delete_prefix(prefix))

    def copy(self, src: str, dst: str) -> None:
        self._run(Call("copy", (dst,), src=src), lambda: self.inner.copy(src, dst))

    def copy_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        call = Call("copy_many", tuple(dst for _, dst in pairs))
        self._run(call, lambda: self.inner.copy_many(pairs))

    def rename(self, src: str, dst: str) -> None:
        self._run(Call("rename", (dst,), src=src), lambda: self.inner.rename(src, dst))

    def rename_prefix(self, src: str, dst: str) -> int:
        call = Call("rename_prefix", (dst,), src=src)
        return self._run(call, lambda: self.inner.rename_prefix(src, dst))

    def make_prefix(self, prefix: str) -> bool:
        return self._run(Call("make_prefix", (prefix,)), lambda: self.inner.make_prefix(prefix))

    def remove_prefix(self, prefix: str) -> None:
        self._run(Call("remove_prefix", (prefix,)), lambda: self.inner.remove_prefix(prefix))

    def remove_leftover(self, leftover: Leftover) -> None:
        call = Call("remove_leftover", (leftover.path,))
        self._run(call, lambda: self.inner.remove_leftover(leftover))

    # -- life ---------------------------------------------------------------------------------

    def flush(self) -> None:
        self._run(Call("flush"), self.inner.flush)

    def refresh(self) -> None:
        self._run(Call("refresh"), self.inner.refresh)

    def close(self) -> None:
        self._run(Call("close"), self.inner.close)


class Clock:
    """A clock that moves only when the test moves it (``now``, or :meth:`advance`): caches
    that expire by it expire exactly when the test says."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FaultyStore(ForwardingStore):
    """Injects backend faults on chosen operations, for tests of error paths.

    ``fail("set")`` makes the next ``set`` raise ``StoreUnavailable`` (or the given error);
    ``times=None`` keeps failing until :meth:`heal`. ``when`` narrows it to some keys.
    """

    _OPS = (
        "get",
        "set",
        "delete",
        "list",
        "stat",
        "delete_prefix",
        "copy",
        "put_file",
        "get_many",
        "rename",
        "set_mtime",
        "get_versioned",
        "set_if",
        "leftovers",
    )
    #: not :class:`~n5fs.kvstore.abilities.LocalFiles` nor
    #: :class:`~n5fs.kvstore.abilities.NameListings`: a reader of the local files, or a lister
    #: of names, would go around the faults ``get`` and ``list`` inject
    passes_on = ForwardingStore.passes_on - {LocalFiles, NameListings}

    def __init__(self, inner: KvStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._faults: dict[
            str, tuple[Callable[[str], N5fsError], int | None, Callable[[str], bool]]
        ] = {}
        self.calls: dict[str, int] = dict.fromkeys(self._OPS, 0)

    def fail(
        self,
        op: str,
        error: Callable[[str], N5fsError] = StoreUnavailable,
        *,
        times: int | None = 1,
        when: Callable[[str], bool] = lambda key: True,
    ) -> None:
        if op not in self._OPS:
            raise ValueError(f"unknown operation {op!r}; one of {self._OPS}")
        with self._lock:
            self._faults[op] = (error, times, when)

    def heal(self) -> None:
        with self._lock:
            self._faults.clear()

    def _maybe_fail(self, op: str, key: str) -> None:
        with self._lock:
            self.calls[op] += 1
            fault = self._faults.get(op)
            if fault is None or not fault[2](key):
                return
            error, times, when = fault
            if times is not None:
                if times <= 1:
                    del self._faults[op]
                else:
                    self._faults[op] = (error, times - 1, when)
        raise error(f"injected fault: {op} {key!r}")

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        self._maybe_fail("get", key)
        return super().get(key, byte_range)

    def set(self, key: str, value: bytes) -> None:
        self._maybe_fail("set", key)
        super().set(key, value)

    def delete(self, key: str) -> None:
        self._maybe_fail("delete", key)
        super().delete(key)

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        self._maybe_fail("list", prefix)
        return super().list(prefix, delimiter)

    def stat(self, key: str) -> KeyInfo | None:
        self._maybe_fail("stat", key)
        return super().stat(key)

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        self._maybe_fail("list", prefix)  # a walk is a listing: it fails as one
        return super().walk(prefix)

    def delete_prefix(self, prefix: str) -> int:
        self._maybe_fail("delete_prefix", prefix)
        return super().delete_prefix(prefix)

    def copy(self, src: str, dst: str) -> None:
        self._maybe_fail("copy", dst)
        super().copy(src, dst)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self._maybe_fail("put_file", key)
        super().put_file(key, path)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = list(keys)
        for key in keys:
            self._maybe_fail("get_many", key)
        return super().get_many(keys)

    def rename(self, src: str, dst: str) -> None:
        self._maybe_fail("rename", dst)
        super().rename(src, dst)

    def set_mtime(self, key: str, mtime: float) -> None:
        self._maybe_fail("set_mtime", key)
        super().set_mtime(key, mtime)

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        """Fails as a ``set`` would (its value is what is at stake)."""
        self._maybe_fail("set", key)
        return super().set_with_mtime(key, value, mtime)

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        self._maybe_fail("put_file", key)
        return super().put_file_with_mtime(key, path, mtime)

    def get_versioned(self, key: str) -> Versioned | None:
        self._maybe_fail("get_versioned", key)
        return super().get_versioned(key)

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        self._maybe_fail("set_if", key)
        return super().set_if(key, value, version=version)

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        self._maybe_fail("leftovers", prefix)
        return super().leftovers(prefix)
