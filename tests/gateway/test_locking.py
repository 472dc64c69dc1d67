"""The lock-order checker itself (:mod:`n5fs.locking`): what it refuses, what it allows, and
that without ``N5FS_DEBUG_LOCKS`` it hands out the plain ``threading`` locks. Every test is
single-threaded or hands over with events: none depends on timing."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from n5fs import locking
from n5fs.gateway import Gateway
from n5fs.gateway.commit.ordering import ArrayOrder
from n5fs.kvstore.memory import MemoryStore
from n5fs.locking import (
    CONSOLIDATED,
    LEAF,
    NODE,
    ORDER,
    OUTER_LEAF,
    LockOrderError,
    acquire_in_order,
    assert_held,
    assert_none_held,
    held_locks,
    ranked_condition,
    ranked_hold,
    ranked_lock,
    ranked_rlock,
    take_violations,
)

WAIT = 30.0


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Locks made in the test are checked; the violations it provoked are its own."""
    monkeypatch.setenv(locking.ENV, "1")
    take_violations()
    yield
    take_violations()


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(locking.ENV, raising=False)


def test_a_lock_of_an_earlier_rank_under_a_later_one_is_refused(checked: None) -> None:
    leaf, node = ranked_lock("byte cache", LEAF), ranked_rlock("node", NODE)
    with leaf, pytest.raises(LockOrderError) as caught:
        node.acquire()
    message = str(caught.value)
    assert "'node'" in message
    assert "'byte cache'" in message
    assert repr(threading.current_thread().name) in message
    assert not node.locked()  # refused before it waited
    assert take_violations() == [message]  # kept, for a thread whose errors nobody sees


def test_the_gateway_order_is_allowed_in_full(checked: None) -> None:
    order = [
        ranked_rlock("node", NODE),
        ranked_hold("hold", ORDER),
        ranked_lock("consolidated", CONSOLIDATED),
        ranked_lock("flights", OUTER_LEAF),
        ranked_lock("cache", LEAF),
    ]
    with contextlib.ExitStack() as stack:
        for lock in order:
            stack.enter_context(lock)
        assert held_locks() == [str(lock) for lock in order]
    assert held_locks() == []
    assert take_violations() == []


def test_two_leaves_nest_only_outer_over_inner(checked: None) -> None:
    outer, inner, other = (
        ranked_lock("flights", OUTER_LEAF),
        ranked_lock("cache", LEAF),
        ranked_lock("stamps", LEAF),
    )
    with outer, inner:
        pass
    with inner, pytest.raises(LockOrderError, match="'stamps'"):
        other.acquire()  # nothing is taken under a leaf
    with inner, pytest.raises(LockOrderError, match="'flights'"):
        outer.acquire()


def test_same_rank_nodes_only_in_key_order(checked: None) -> None:
    a, b = ranked_rlock("node", NODE), ranked_rlock("node", NODE)
    acquire_in_order(a, "x/a")
    acquire_in_order(b, "x/b")  # a rename: both nodes, in key order
    b.release()
    a.release()
    acquire_in_order(b, "x/b")
    with pytest.raises(LockOrderError, match="'x/a' is not after 'x/b'"):
        acquire_in_order(a, "x/a")
    with pytest.raises(LockOrderError, match="not taken in key order"):
        a.acquire()  # a second node without a key
    b.release()


def test_a_plain_lock_taken_again_by_its_holder_raises_instead_of_hanging(checked: None) -> None:
    lock = ranked_lock("table", LEAF)
    with lock:
        assert lock.acquire(blocking=False) is False  # a try-lock answers as a Lock does
        with pytest.raises(LockOrderError, match="again while it holds it"):
            lock.acquire()
    assert not lock.locked()


def test_a_reentrant_lock_may_be_taken_again_under_later_ranks(checked: None) -> None:
    node, leaf = ranked_rlock("node", NODE), ranked_lock("table", LEAF)
    with node, leaf, node:  # never blocks: its holder re-enters
        assert_held(node)
    assert not node.locked()
    assert held_locks() == []


def test_assert_held_fails_unless_this_thread_holds_the_lock(checked: None) -> None:
    lock, hold = ranked_lock("table", LEAF), ranked_hold("commit order hold", ORDER)
    with pytest.raises(LockOrderError, match="does not hold 'table'"):
        assert_held(lock)
    with lock:
        assert_held(lock)
    with hold:
        assert_held(hold)
    with pytest.raises(LockOrderError, match="does not hold 'commit order hold'"):
        assert_held(hold)
    taken, leave = threading.Event(), threading.Event()

    def other() -> None:
        with lock:
            taken.set()
            leave.wait(WAIT)

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(other)
        assert taken.wait(WAIT)
        with pytest.raises(LockOrderError):
            assert_held(lock)  # held, by another thread
        leave.set()
        done.result(WAIT)


def test_assert_held_sees_through_a_condition(checked: None) -> None:
    cond = ranked_condition("chunk check", OUTER_LEAF)
    with pytest.raises(LockOrderError):
        assert_held(cond)
    with cond:
        assert_held(cond)


def test_assert_none_held_from_a_rank_on(checked: None) -> None:
    node, leaf = ranked_rlock("node", NODE), ranked_lock("cache", LEAF)
    assert_none_held()
    with node:
        assert_none_held(OUTER_LEAF)  # store I/O under a node lock is allowed
        with pytest.raises(LockOrderError, match="'node'"):
            assert_none_held()  # a pool worker holds no gateway lock
        with leaf, pytest.raises(LockOrderError, match="'cache'"):
            assert_none_held(OUTER_LEAF)


def test_a_condition_wait_lets_go_and_takes_back_through_the_checks(checked: None) -> None:
    cond = ranked_condition("walk", LEAF)
    ready: list[bool] = []
    waiting = threading.Event()

    def waiter() -> list[str]:
        with cond:
            waiting.set()
            assert cond.wait_for(lambda: bool(ready), WAIT)
            return held_locks()

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(waiter)
        assert waiting.wait(WAIT)
        with cond:  # the waiter let go: this thread may take it
            ready.append(True)
            cond.notify_all()
        assert done.result(WAIT) == [str(cond._lock)]  # type: ignore[attr-defined]
    assert take_violations() == []


def test_a_commit_order_hold_is_rank_two_while_held(checked: None) -> None:
    order, node = ArrayOrder(), ranked_rlock("node", NODE)
    with node, order.for_keys(["a/0"]):
        assert_held(order.holding)
        assert held_locks() == [str(node), str(order.holding)]
        with pytest.raises(LockOrderError, match="'commit order hold'"), order.for_keys(["b/0"]):
            pass  # one hold per thread: refused before the second is entered
        with pytest.raises(LockOrderError, match="'node'"):
            ranked_rlock("node", NODE).acquire()
    assert held_locks() == []
    assert order.held_count() == 0


def test_a_commit_without_its_node_lock_is_caught(checked: None) -> None:
    with Gateway(MemoryStore()) as gw:
        node = gw.files.acquire("plain.txt")
        with node.lock:
            gw.files.staged(node, None).write(b"x", 0)
            node.dirty = True
        with pytest.raises(LockOrderError, match="does not hold 'node'"):
            gw.committer.commit_node(node)
        with node.lock:
            gw.committer.commit_node(node)
        gw.files.release(node)
        assert gw.read_file("/plain.txt") == b"x"


def test_without_the_variable_the_locks_are_plain(plain: None) -> None:
    assert type(ranked_lock("table", LEAF)) is type(threading.Lock())
    assert type(ranked_rlock("node", NODE)) is type(threading.RLock())
    assert isinstance(ranked_hold("hold", ORDER), contextlib.nullcontext)
    lock = ranked_lock("table", LEAF)
    assert_held(lock)  # a plain lock is not checked: nothing to say
    with ranked_lock("cache", LEAF), ranked_rlock("node", NODE):
        assert_none_held()  # plain locks are not on any stack
    with Gateway(MemoryStore()) as gw:
        assert type(gw.files._lock) is type(threading.Lock())
        gw.write_file("/a.txt", b"a")
