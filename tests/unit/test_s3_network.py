"""The S3 store through the faults real networks and endpoints produce: resets before, after
and in the middle of a body, ``5xx`` and ``SlowDown`` answers, stalls, and bodies cut short
that the server stores and answers ``200``. Nothing the store acknowledges may differ from what
is in the bucket, no read may hand on wrong bytes, and one bad key must not fail the others.

The faults come from :mod:`n5fs.testing.s3_proxy` between the store and the session's moto
server; what the bucket holds is read behind the proxy's back, straight from moto.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore import exceptions as bce
from botocore.config import Config

from n5fs.errors import StoreUnavailable, VersionConflict
from n5fs.kvstore.s3 import MiB, S3Store
from n5fs.kvstore.s3.retries import MAX_ATTEMPTS, RetryPolicy, SilentEndpoint, Throttle
from n5fs.kvstore.spec import S3Spec
from n5fs.testing.s3_proxy import Fault, FaultProxy, fault_proxy
from tests.bucket import held

pytestmark = pytest.mark.s3

PREFIX = "net/"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("N5FS_STATE_DIR", str(path))
    return path


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint, seed=7) as running:
        yield running


@pytest.fixture
def store(proxy: FaultProxy, s3_bucket: str) -> Iterator[S3Store]:
    spec = S3Spec(
        bucket=s3_bucket, path=PREFIX, endpoint=proxy.endpoint, connect_timeout=1, read_timeout=2
    )
    with S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB) as opened:
        yield opened


@pytest.fixture
def bucket(s3_server: Any, s3_bucket: str) -> Any:
    """What the bucket holds, read straight from moto (no proxy, no faults)."""
    client = s3_server.client()
    return lambda key: held(client, s3_bucket, key, PREFIX)


def value(i: int, size: int = 256) -> bytes:
    return random.Random(i).randbytes(size)


# -- writes ------------------------------------------------------------------------------------


def test_a_put_body_cut_short_and_answered_200_is_never_acknowledged(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    """The first PUT of each key reaches the server half-length and is stored (moto checks
    no Content-MD5): the store sees the ETag differ, sends again, and only then says yes."""
    proxy.inject(Fault("truncate", method="PUT", once_per_key=True))
    for i in range(16):
        store.set(f"c/{i}", value(i))
    assert proxy.injected["truncate"] == 16
    assert all(bucket(f"c/{i}") == value(i) for i in range(16))
    assert store.fault_counters()["s3_writes_resent"] == 16


def test_a_put_cut_short_every_time_fails_and_is_never_acknowledged(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    proxy.inject(Fault("truncate", method="PUT", key="bad"))
    with pytest.raises(StoreUnavailable, match="other bytes than sent"):
        store.set("bad", value(1))
    assert proxy.injected["truncate"] == 5
    assert bucket("bad") is None  # the damaged bytes the last attempt stored are removed
    assert store.fault_counters()["s3_damaged_removed"] == 1
    store.set("good", value(2))
    assert bucket("good") == value(2)


def test_a_multipart_part_cut_short_is_sent_again(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    data = value(3, 11 * MiB)
    proxy.inject(Fault("truncate", method="PUT", times=1))
    store.set("big", data)
    assert proxy.injected["truncate"] == 1
    assert proxy.counts["PUT part"] == 4  # three parts, one of them twice
    held = bucket("big")
    assert held is not None
    assert hashlib.md5(held).digest() == hashlib.md5(data).digest()


@pytest.mark.slow
def test_one_key_that_always_resets_fails_alone(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    proxy.inject(Fault("reset_before", method="PUT", key="cursed"))
    with pytest.raises(StoreUnavailable):
        store.set("cursed", b"x")
    assert proxy.injected["reset_before"] == MAX_ATTEMPTS
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.set(f"fine/{i}", value(i)), range(16)))
    assert all(bucket(f"fine/{i}") == value(i) for i in range(16))


def test_a_write_whose_answer_is_lost_is_resolved_before_the_caller_hears(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    """A create-only write reaches the server and its answer is reset: the retry is refused
    (the object exists now), and a HEAD shows it holds exactly these bytes: success."""
    proxy.inject(Fault("reset_after", method="PUT", times=1))
    doc = b'{"a": 1}'
    etag = store.set_if("doc.json", doc, version=None)
    assert proxy.injected["reset_after"] == 1
    assert bucket("doc.json") == doc
    assert etag == '"' + hashlib.md5(doc).hexdigest() + '"'
    # another writer's bytes are still a conflict
    with pytest.raises(VersionConflict):
        store.set_if("doc.json", b'{"a": 2}', version=None)


@pytest.mark.slow
def test_resets_and_5xx_on_a_tenth_of_requests_cost_no_write(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    proxy.inject(
        Fault("reset_before", probability=0.05),
        Fault("reset_after", probability=0.05),
        Fault("status", status=500, code="InternalError", probability=0.05),
    )
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.set(f"r/{i}", value(i)), range(64)))
    assert sum(proxy.injected.values()) > 0
    assert all(bucket(f"r/{i}") == value(i) for i in range(64))
    assert store.get_many([f"r/{i}" for i in range(64)]) == {f"r/{i}": value(i) for i in range(64)}


@pytest.mark.slow
def test_slow_down_throttles_the_store_instead_of_failing_writers(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    proxy.inject(Fault("status", status=503, code="SlowDown", probability=0.2))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.set(f"t/{i}", value(i)), range(64)))
    assert proxy.injected["status"] > 0
    assert store.throttle.throttles == proxy.injected["status"]  # each one slowed the store
    counters = store.fault_counters()
    assert counters["s3_throttled"] == proxy.injected["status"]
    assert counters["s3_retries"] == proxy.injected["status"]
    assert all(bucket(f"t/{i}") == value(i) for i in range(64))


# -- reads -------------------------------------------------------------------------------------


def test_a_body_that_breaks_is_resumed_with_a_ranged_get(store: S3Store, proxy: FaultProxy) -> None:
    for i in range(8):
        store.set(f"g/{i}", value(i, 64 * 1024))
    proxy.reset_counts()
    proxy.inject(Fault("reset_mid_body", method="GET", key="^net/g/", once_per_key=True))
    assert [store.get(f"g/{i}") for i in range(8)] == [value(i, 64 * 1024) for i in range(8)]
    assert proxy.injected["reset_mid_body"] == 8
    assert proxy.counts["GET range"] == 8  # each resumed once, from the byte reached
    assert store.fault_counters()["s3_reads_resumed"] == 8


def test_an_error_answer_whose_body_breaks_is_asked_again(
    store: S3Store, proxy: FaultProxy
) -> None:
    """botocore reads a 404's body itself and lets its faults through unwrapped."""
    store.set("here", b"x")
    proxy.inject(Fault("reset_mid_body", method="GET", once_per_key=True))
    assert store.get("absent") is None
    assert store.get("here") == b"x"
    assert proxy.injected["reset_mid_body"] == 2


def test_a_ranged_read_that_breaks_resumes_inside_its_range(
    store: S3Store, proxy: FaultProxy
) -> None:
    from n5fs.kvstore.base import ByteRange

    data = value(5, 100_000)
    store.set("ranged", data)
    proxy.inject(Fault("reset_mid_body", method="GET", times=2))
    assert store.get("ranged", ByteRange(1000, 50_000)) == data[1000:51_000]
    assert store.get("ranged", ByteRange(-7000)) == data[-7000:]


@pytest.mark.parametrize("path", ["botocore", "lean"])
def test_an_object_replaced_while_its_body_broke_is_read_again_not_stitched(
    store: S3Store,
    proxy: FaultProxy,
    s3_server: Any,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    old, new = value(1, 200_000), value(2, 200_000)
    store.set("swap", old)
    if path == "lean":
        assert store.get("swap") == old  # botocore's GET shows the lean path its route
        assert store._lean.ready
    else:
        store._lean.refused = "every read on botocore's path"  # nothing is learned
    direct = s3_server.client()
    replaced = threading.Event()
    get_object = store._get_object

    def replacing(full: str, **args: Any) -> Any:
        # the replacement lands between the broken body and its resumption
        if args.get("IfMatch") and not replaced.is_set():
            replaced.set()
            direct.put_object(Bucket=s3_bucket, Key=PREFIX + "swap", Body=new)
        return get_object(full, **args)

    monkeypatch.setattr(store, "_get_object", replacing)
    proxy.inject(Fault("reset_mid_body", method="GET", times=1))
    assert store.get("swap") == new
    assert replaced.is_set()


@pytest.mark.parametrize("checksum", ["crc32", "md5 etag"])
def test_a_read_of_damaged_bytes_is_never_handed_on(
    store: S3Store, proxy: FaultProxy, s3_server: Any, s3_bucket: str, checksum: str
) -> None:
    """A body damaged on the way (one byte flipped, length unchanged) is read again; damaged
    every time, it is refused: EIO, never wrong bytes. Objects n5fs writes carry a CRC32;
    others (written by tools that send none) are checked against their MD5 ETag."""
    data = value(9, 5000)
    if checksum == "crc32":
        store.set("damaged", data)
    else:
        bare = boto3.client(
            "s3",
            endpoint_url=s3_server.endpoint,
            config=Config(request_checksum_calculation="when_required"),
        )
        bare.put_object(Bucket=s3_bucket, Key=PREFIX + "damaged", Body=data)
        assert "ChecksumCRC32" not in bare.head_object(
            Bucket=s3_bucket, Key=PREFIX + "damaged", ChecksumMode="ENABLED"
        )
    proxy.inject(Fault("corrupt", method="GET", times=1))
    assert store.get("damaged") == data
    assert proxy.counts["GET"] == 2
    proxy.inject(Fault("corrupt", method="GET"))
    with pytest.raises(StoreUnavailable, match="could not be read intact"):
        store.get("damaged")


def test_a_put_body_damaged_on_the_way_is_sent_again(
    store: S3Store, proxy: FaultProxy, bucket: Any
) -> None:
    proxy.inject(Fault("corrupt", method="PUT", once_per_key=True))
    for i in range(3):
        store.set(f"flip/{i}", value(i))
    assert all(bucket(f"flip/{i}") == value(i) for i in range(3))


# -- the policy's pieces -----------------------------------------------------------------------


def _request(context: dict[str, Any]) -> dict[str, Any]:
    return {"context": context}


def test_timeouts_are_bounded_by_the_spec_and_resets_by_max_attempts() -> None:
    policy = RetryPolicy(timeout_attempts=2, rng=random.Random(0))
    context: dict[str, Any] = {}
    timeout = bce.ReadTimeoutError(endpoint_url="http://x")
    assert (
        policy.needs_retry(1, caught_exception=timeout, request_dict=_request(context)) is not None
    )
    assert policy.needs_retry(2, caught_exception=timeout, request_dict=_request(context)) is None
    reset = bce.ConnectionClosedError(endpoint_url="http://x")
    context = {}
    delays = [
        policy.needs_retry(n, caught_exception=reset, request_dict=_request(context))
        for n in range(1, MAX_ATTEMPTS + 1)
    ]
    assert all(d is not None for d in delays[:-1])
    assert delays[-1] is None


def test_answers_that_are_not_faults_are_not_retried() -> None:
    policy = RetryPolicy(timeout_attempts=2)

    class Http:
        def __init__(self, status: int) -> None:
            self.status_code = status

    def answer(status: int, code: str) -> tuple[Http, dict[str, Any]]:
        return Http(status), {"Error": {"Code": code}}

    assert (
        policy.needs_retry(1, response=answer(404, "NoSuchKey"), request_dict=_request({})) is None
    )
    assert policy.needs_retry(1, response=answer(412, "PreconditionFailed")) is None
    assert policy.needs_retry(1, response=answer(503, "SlowDown")) is not None
    assert policy.needs_retry(1, response=answer(400, "BadDigest")) is not None
    assert policy.needs_retry(1, response=(Http(200), {})) is None


def test_no_retry_starts_after_the_deadline() -> None:
    now = [0.0]
    policy = RetryPolicy(timeout_attempts=2, deadline=20.0, clock=lambda: now[0])
    context: dict[str, Any] = {}
    reset = bce.ConnectionClosedError(endpoint_url="http://x")
    assert policy.needs_retry(1, caught_exception=reset, request_dict=_request(context)) is not None
    now[0] = 21.0
    assert policy.needs_retry(2, caught_exception=reset, request_dict=_request(context)) is None


def test_a_silent_endpoint_lets_one_probe_through_and_an_answer_clears_it() -> None:
    now = [100.0]
    breaker = SilentEndpoint("s3://b/ at http://x", cooldown=10.0, clock=lambda: now[0])
    breaker._before_call(context={})  # nothing known: requests go out
    breaker._after_error(exception=bce.ConnectionClosedError(endpoint_url="http://x"))
    breaker._before_call(context={})  # a reset is an answer of sorts: not silence
    breaker._after_error(exception=bce.ReadTimeoutError(endpoint_url="http://x"))
    probe: dict[str, Any] = {}
    breaker._before_call(context=probe)  # the probe goes out ...
    now[0] += 2.0
    with pytest.raises(StoreUnavailable, match="did not answer a request 2 s ago"):
        breaker._before_call(context={})  # ... while the others fail at once
    breaker._answered(context=probe)  # the probe got an answer: the endpoint is back
    breaker._before_call(context={})
    assert not breaker.silent
    # a probe that times out keeps it silent until the cooldown ends
    breaker._after_error(exception=bce.ConnectTimeoutError(endpoint_url="http://x"))
    probe = {}
    breaker._before_call(context=probe)
    breaker._after_error(exception=bce.ConnectTimeoutError(endpoint_url="http://x"), context=probe)
    breaker._before_call(context={})  # the next probe
    with pytest.raises(StoreUnavailable):
        breaker._before_call(context={})
    now[0] += 10.5
    breaker._before_call(context={})  # the cooldown is over: everyone asks again


def test_the_throttle_cuts_the_rate_and_gives_it_back_in_calm_time() -> None:
    now = [0.0]
    throttle = Throttle(floor=10.0, clock=lambda: now[0])
    for _ in range(100):  # 100 requests in the first second: unlimited
        assert throttle.acquire() == 0.0
        now[0] += 0.01
    throttle.throttled()
    assert throttle.rate == pytest.approx(70.0, rel=0.05)  # 0.7 x the measured 100/s
    throttle.throttled()  # at most one cut per half second
    assert throttle.rate == pytest.approx(70.0, rel=0.05)
    waits = [throttle.acquire() for _ in range(140)]  # two seconds' worth at once
    assert waits[-1] == pytest.approx(139 / 70.0, rel=0.05)
    for _ in range(6):
        now[0] += 0.6
        throttle.throttled()
    assert throttle.rate == 10.0  # never below the floor
    now[0] += 30.0
    throttle.acquire()
    assert throttle.rate is None  # calm long enough: unlimited again
