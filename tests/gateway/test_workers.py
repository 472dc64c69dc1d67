"""One owner for the thread pools (``n5fs.workers``): a pool's threads start at its first job,
never past its bound; one shutdown stops them all (queued jobs run where the pool drains,
are dropped elsewhere); a submit after it fails at once, saying which pool. A gateway owns
one and shuts it down in ``close``."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from n5fs import workers as workers_module
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.read.reader import READ_WORKERS
from n5fs.kvstore.memory import MemoryStore
from n5fs.workers import Workers, WorkersClosed

WAIT = 30.0  # seconds: only ever reached when the code under test is broken


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix + "_")]


def test_no_thread_starts_before_the_first_job() -> None:
    workers = Workers()
    pool = workers.pool("n5fs-test-lazy", 3)
    assert workers.sizes() == {"n5fs-test-lazy": 3}
    assert workers.started() == frozenset()
    assert threads_named("n5fs-test-lazy") == []
    assert pool.submit(threading.current_thread).result(WAIT).name.startswith("n5fs-test-lazy_")
    assert workers.started() == {"n5fs-test-lazy"}
    workers.shutdown()
    assert threads_named("n5fs-test-lazy") == []


def test_a_pool_never_runs_more_threads_than_its_bound() -> None:
    workers = Workers()
    pool = workers.pool("n5fs-test-bound", 2)
    go = threading.Event()
    futures = [pool.submit(go.wait, WAIT) for _ in range(5)]  # all block: each asks a thread
    assert len(threads_named("n5fs-test-bound")) == 2
    go.set()
    assert all(f.result(WAIT) for f in futures)
    workers.shutdown()


def test_one_name_is_one_pool() -> None:
    workers = Workers()
    assert workers.pool("n5fs-test-same", 2) is workers.pool("n5fs-test-same", 2)
    with pytest.raises(ValueError, match="declared already"):
        workers.pool("n5fs-test-same", 3)
    with pytest.raises(ValueError, match="declared already"):
        workers.pool("n5fs-test-same", 2, drain=True)
    with pytest.raises(ValueError, match="at least one thread"):
        workers.pool("n5fs-test-none", 0)


def test_shutdown_happens_once_and_a_later_submit_fails_clearly() -> None:
    workers = Workers()
    first, second = workers.pool("n5fs-test-a", 1), workers.pool("n5fs-test-b", 2)
    assert first.submit(sum, [1, 2]).result(WAIT) == 3
    workers.shutdown()
    assert workers.closed
    assert first.closed
    assert second.closed
    assert threads_named("n5fs-test-a") == []
    workers.shutdown()  # a second shutdown does nothing
    for pool in (first, second):  # started or not
        with pytest.raises(WorkersClosed, match=f"{pool.name} threads are shut down: sum"):
            pool.submit(sum, [1])
    assert issubclass(WorkersClosed, RuntimeError)  # callers that run the job inline still do
    assert workers.sizes() == {"n5fs-test-a": 1, "n5fs-test-b": 2}  # still reported


@pytest.mark.parametrize("drain", [True, False])
def test_at_shutdown_queued_jobs_run_only_where_the_pool_drains(
    monkeypatch: pytest.MonkeyPatch, drain: bool
) -> None:
    """The hook tells when every pool stopped taking jobs; only then may the running job end,
    so the queued one is still queued when shutdown decides its fate."""
    stopped = threading.Event()

    class Hooked(ThreadPoolExecutor):
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
            if not wait:
                stopped.set()

    monkeypatch.setattr(workers_module, "ThreadPoolExecutor", Hooked)
    workers = Workers()
    pool = workers.pool("n5fs-test-drain", 1, drain=drain)
    go, ran = threading.Event(), []
    running = pool.submit(go.wait, WAIT)
    queued = pool.submit(ran.append, "queued")
    closer = threading.Thread(target=workers.shutdown)
    closer.start()
    assert stopped.wait(WAIT)
    assert queued.cancelled() is not drain
    go.set()  # the running job ends: shutdown may return now
    closer.join(WAIT)
    assert not closer.is_alive()
    assert running.result(WAIT) is True
    assert ran == (["queued"] if drain else [])


def test_a_gateway_owns_every_pool_starts_none_and_stops_all_at_close() -> None:
    cpus = min(4, os.cpu_count() or 1)
    gw = Gateway(MemoryStore(), GatewayConfig())
    assert gw.workers.sizes() == {
        "n5fs-refresh": 2,
        "n5fs-walk": 4,
        "n5fs-read": READ_WORKERS,
        "n5fs-stored-chunks": cpus,
        "n5fs-check": cpus,
    }
    assert gw.workers.started() == frozenset()  # a gateway that did nothing runs no thread
    gw.write_file("/a.txt", b"x")
    gw.close()
    assert gw.workers.closed
    walk = gw.view.walks
    assert not walk.enabled  # shut down: folders are listed alone from now on
    with pytest.raises(WorkersClosed, match="n5fs-walk"):
        walk._submit(print)


def test_a_reader_of_its_own_stops_its_pool_at_close() -> None:
    from n5fs.gateway.read.reader import ObjectReader

    reader = ObjectReader(MemoryStore(), cache_bytes=1 << 20, small_object=1 << 20, readahead=0)
    assert reader.workers.sizes() == {"n5fs-read": READ_WORKERS}
    reader.close()
    assert reader.workers.closed
