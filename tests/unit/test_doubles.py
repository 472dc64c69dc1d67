"""The shared test doubles (n5fs/testing/doubles.py): what CountingStore records, when its hooks
run, how a gate pauses one call for a test to act in between, and that the double forwards
every call faithfully (it passes the KvStore contract with hooks on every operation)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from n5fs.errors import InvalidKey, StoreUnavailable
from n5fs.kvstore.base import ByteRange, KvStore
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import OPERATIONS, WAIT, Call, Clock, CountingStore
from n5fs.testing.kvstore_contract import KvStoreContract


@pytest.fixture
def store() -> CountingStore:
    inner = MemoryStore()
    for key in ("a/0", "a/1", "b/0"):
        inner.set(key, key.encode())
    return CountingStore(inner)


# -- the record -----------------------------------------------------------------------------------


def test_calls_are_counted_per_method_and_key(store: CountingStore) -> None:
    store.get("a/0")
    store.get("a/0", ByteRange(0, 1))
    store.get("b/0")
    store.stat("a/1")
    store.list("a/")
    assert store.count("get") == 3
    assert store.count("get", "a/0") == 2
    assert store.count(("get", "stat"), "a/*") == 3  # a glob, over several methods
    assert store.count("get", lambda key: key.endswith("/0")) == 3
    assert store.count("list", "a/") == 1
    assert store.count() == 5
    assert store.per_key("get") == {"a/0": 2, "b/0": 1}
    assert store.ranges("a/0") == [None, ByteRange(0, 1)]
    assert [(c.op, c.key) for c in store.calls_of()] == [
        ("get", "a/0"), ("get", "a/0"), ("get", "b/0"), ("stat", "a/1"), ("list", "a/"),
    ]  # fmt: skip


def test_a_batch_is_one_call_naming_each_key(store: CountingStore) -> None:
    assert store.get_many(["a/0", "a/1", "x"]) == {"a/0": b"a/0", "a/1": b"a/1", "x": None}
    assert store.count("get_many") == 1
    assert store.count("get_many", "a/1") == 1
    assert store.count("get_many", "b/*") == 0
    assert store.per_key("get_many") == {"a/0": 1, "a/1": 1, "x": 1}
    [call] = store.calls_of("get_many")
    assert call == Call("get_many", ("a/0", "a/1", "x"))
    assert call.key == "a/0"


def test_sources_of_copies_renames_and_local_files_are_recorded(
    store: CountingStore, tmp_path: Path
) -> None:
    local = tmp_path / "part"
    local.write_bytes(b"from disk")
    store.put_file("c/0", local)
    store.copy("a/0", "c/1")
    store.rename("a/1", "c/2")
    assert [(c.op, c.key, c.src) for c in store.calls_of()] == [
        ("put_file", "c/0", str(local)), ("copy", "c/1", "a/0"), ("rename", "c/2", "a/1"),
    ]  # fmt: skip
    assert store.inner.get("c/0") == b"from disk"
    assert store.inner.get("a/1") is None


def test_a_failing_call_is_counted_and_clear_forgets_the_record_not_the_hooks(
    store: CountingStore,
) -> None:
    seen: list[str] = []
    store.hook("get", lambda call: seen.append(call.key))
    with pytest.raises(InvalidKey):
        store.get("/not a key")
    assert store.count("get") == 1
    store.clear()
    assert store.count() == 0
    store.get("a/0")
    assert seen == ["/not a key", "a/0"]
    assert store.count("get") == 1


def test_unknown_operations_are_refused(store: CountingStore) -> None:
    with pytest.raises(ValueError, match="lists"):
        store.count("lists")
    with pytest.raises(ValueError, match="gets"):
        store.hook(("get", "gets"), print)
    with pytest.raises(ValueError, match="when"):
        store.hook("get", print, when="during")  # type: ignore[arg-type]


def test_calls_the_inner_store_makes_to_itself_are_not_seen() -> None:
    """The base class's batches run through the store's own methods: a wrapper sees the
    batch, not its parts."""
    store = CountingStore(MemoryStore())
    store.inner.set("a", b"1")
    store.copy_many([("a", "b"), ("a", "c")])
    assert [(c.op, c.keys) for c in store.calls_of()] == [("copy_many", ("b", "c"))]
    assert store.count("copy") == 0


# -- hooks ---------------------------------------------------------------------------------------


def test_hooks_run_before_and_after_the_inner_call(store: CountingStore) -> None:
    order: list[tuple[str, bytes | None]] = []
    store.hook("set", lambda call: order.append(("before", store.inner.get(call.key))))
    store.hook("set", lambda call: order.append(("after", store.inner.get(call.key))), when="after")
    store.set("c/0", b"new")
    assert order == [("before", None), ("after", b"new")]


def test_a_hook_runs_only_for_matching_keys_and_as_many_times_as_asked(
    store: CountingStore,
) -> None:
    seen: list[str] = []
    hook = store.hook("get", lambda call: seen.append(call.key), key="a/*", times=2)
    for key in ("b/0", "a/0", "a/1", "a/0"):
        store.get(key)
    assert seen == ["a/0", "a/1"]
    assert (hook.fired, hook.times) == (2, 0)


def test_hooks_on_one_call_run_in_the_order_installed(store: CountingStore) -> None:
    seen: list[int] = []
    for i in range(3):
        store.hook("stat", lambda call, i=i: seen.append(i))
    store.stat("a/0")
    assert seen == [0, 1, 2]


def test_a_hook_that_raises_fails_the_call(store: CountingStore) -> None:
    def refuse(call: Call) -> None:
        raise StoreUnavailable(f"{call.key}: refused")

    store.hook("set", refuse, key="c/0")  # before: the store is never asked
    with pytest.raises(StoreUnavailable, match="refused"):
        store.set("c/0", b"x")
    assert store.inner.get("c/0") is None
    store.hook("set", refuse, key="c/1", when="after")  # after: it was written, then lost
    with pytest.raises(StoreUnavailable, match="refused"):
        store.set("c/1", b"x")
    assert store.inner.get("c/1") == b"x"


def test_a_walk_is_passed_on_lazily_unless_an_after_hook_waits_for_its_answer() -> None:
    inner = MemoryStore()
    for i in range(3):
        inner.set(f"w/{i}", b"x")
    read: list[str] = []
    real_walk = inner.walk

    def walk(prefix: str = "") -> object:
        for info in real_walk(prefix):
            read.append(info.key)
            yield info

    inner.walk = walk  # type: ignore[assignment,method-assign]
    store = CountingStore(inner)
    walking = store.walk("w/")
    assert read == []  # nothing read yet: the inner iterator, as it is
    assert [i.key for i in walking] == ["w/0", "w/1", "w/2"]
    read.clear()
    at_hook: list[list[str]] = []
    store.hook("walk", lambda call: at_hook.append(list(read)), when="after")
    keys = [info.key for info in store.walk("w/")]
    assert at_hook == [["w/0", "w/1", "w/2"]]  # the store had answered in full
    assert keys == ["w/0", "w/1", "w/2"]
    assert store.count("walk", "w/") == 2


# -- gates: a race on cue -------------------------------------------------------------------------


def test_a_gate_pauses_a_read_between_its_load_and_its_return(store: CountingStore) -> None:
    """The interleaving a race test needs: the reader has loaded the old bytes, a writer
    commits, then the reader goes on with what it loaded."""
    gate = store.gate("get", "a/0")  # after the inner call, once
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(store.get, "a/0")
        [call] = gate.wait_reached()
        assert call == Call("get", ("a/0",))
        store.set("a/0", b"new")  # the writer is not paused: the gate is for reads of a/0
        assert not reading.done()
        gate.release()
        assert reading.result(WAIT) == b"a/0"
    assert store.get("a/0") == b"new"  # a later read passes the spent gate


def test_a_gate_for_every_matching_call_holds_them_all_until_released(
    store: CountingStore,
) -> None:
    gate = store.gate("get", "a/*", when="before", times=None)
    with ThreadPoolExecutor(2) as pool:
        reads = [pool.submit(store.get, key) for key in ("a/0", "a/1")]
        assert {c.key for c in gate.wait_reached(2)} == {"a/0", "a/1"}
        assert store.get("b/0") == b"b/0"  # other keys pass
        gate.release()
        assert [r.result(WAIT) for r in reads] == [b"a/0", b"a/1"]
    assert len(gate.reached) == 2
    assert store.get("a/0") == b"a/0"  # released for good
    assert len(gate.reached) == 3


def test_a_gate_never_released_fails_the_call_instead_of_hanging(store: CountingStore) -> None:
    gate = store.gate("get", "a/0", timeout=0.05)
    with pytest.raises(AssertionError, match="never released"):
        store.get("a/0")
    with pytest.raises(AssertionError, match="2 call"):
        gate.wait_reached(2)


def test_gates_on_different_threads_meet_in_the_order_the_test_chooses() -> None:
    """Two writers, each paused before its store write: the test decides which lands last."""
    store = CountingStore(MemoryStore())
    first = store.gate("set", "k", when="before")
    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(store.set, "k", b"one")
        first.wait_reached()
        second = store.gate("set", "k", when="before")  # installed now: for the next write
        two = pool.submit(store.set, "k", b"two")
        second.wait_reached()
        second.release()
        two.result(WAIT)
        first.release()
        one.result(WAIT)
    assert store.inner.get("k") == b"one"


# -- the clock -----------------------------------------------------------------------------------


def test_the_clock_moves_only_when_told() -> None:
    clock = Clock(1000.0)
    assert clock() == clock() == 1000.0
    clock.advance(5)
    clock.now += 1
    assert clock() == 1006.0


# -- a faithful forwarder -------------------------------------------------------------------------


def _note(call: Call) -> None:
    assert call.op in OPERATIONS


class TestCountingStoreContract(KvStoreContract):
    """Over a FileStore, with a hook before and after every operation: the double changes
    nothing a caller can see (walks then read in full before they are handed over)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> CountingStore:
        store = CountingStore(FileStore(tmp_path / "root"))
        store.hook(OPERATIONS, _note)
        store.hook(OPERATIONS, _note, when="after")
        return store

    @staticmethod
    def _root(store: KvStore) -> Path:
        assert isinstance(store, CountingStore)
        assert isinstance(store.inner, FileStore)
        return store.inner.root

    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        path = self._root(store) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)

    def peek(self, store: KvStore, key: str) -> bytes | None:
        path = self._root(store) / key
        return path.read_bytes() if path.is_file() else None
