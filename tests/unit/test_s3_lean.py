"""The S3 store's lean GETs (:mod:`n5fs.kvstore.s3.lean`): the route is botocore's (learned
from its first GetObject), the request is the one botocore would send (URL, headers, SigV4
signature), and everything the botocore path does on the way holds on this one: retries,
throttling, the silent-endpoint breaker, resumption and checksums, error answers, anonymous
access, requester pays, credentials that change. Faults come from :mod:`n5fs.testing.s3_proxy`
in front of the session's moto server; requests to AWS itself are answered by a stub."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.config import Config
from botocore.credentials import Credentials

from n5fs.errors import AccessDenied, StoreUnavailable
from n5fs.kvstore.base import ByteRange
from n5fs.kvstore.s3 import S3Store
from n5fs.kvstore.s3.lean import _Keys, _Route, sign
from n5fs.kvstore.s3.retries import MAX_ATTEMPTS
from n5fs.kvstore.spec import S3Spec
from n5fs.testing.s3_proxy import Fault, FaultProxy, fault_proxy
from tests.bucket import Sends

pytestmark = pytest.mark.s3

PREFIX = "lean/"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("N5FS_STATE_DIR", str(path))
    return path


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint, seed=3) as running:
        yield running


def botocore_sends(store: S3Store) -> Sends:
    """The GetObject requests botocore sent for ``store`` from now on."""
    return Sends(store, "GetObject")


def lean(store: S3Store) -> Sends:
    """Teach ``store`` its route with one GET (of an absent key) and count botocore's
    GetObjects from then on."""
    sends = botocore_sends(store)
    assert store.get("primer-that-is-absent") is None
    assert store._lean.ready, store._lean.refused
    sends.requests.clear()
    return sends


@pytest.fixture
def store(proxy: FaultProxy, s3_bucket: str) -> Iterator[S3Store]:
    spec = S3Spec(
        bucket=s3_bucket, path=PREFIX, endpoint=proxy.endpoint, connect_timeout=1, read_timeout=1
    )
    with S3Store(spec) as opened:
        yield opened


def value(i: int, size: int = 256) -> bytes:
    return random.Random(i).randbytes(size)


# -- the requests are botocore's ---------------------------------------------------------------


def test_reads_after_the_first_skip_botocore_and_answer_alike(
    store: S3Store, proxy: FaultProxy
) -> None:
    for i in range(10):
        store.set(f"k/{i} +x", value(i, 3000))
    sends = lean(store)
    proxy.reset_counts()
    assert [store.get(f"k/{i} +x") for i in range(10)] == [value(i, 3000) for i in range(10)]
    data = value(3, 3000)
    assert store.get("k/3 +x", ByteRange(100, 50)) == data[100:150]
    assert store.get("k/3 +x", ByteRange(-70)) == data[-70:]
    assert store.get("absent") is None
    versioned = store.get_versioned("k/3 +x")
    assert versioned is not None
    assert versioned.version == f'"{hashlib.md5(data).hexdigest()}"'
    assert len(sends) == 0
    assert proxy.counts["GET"] + proxy.counts["GET range"] == 14
    # answers this path leaves to botocore: a range past the end (416) is asked again there
    assert store.get("k/3 +x", ByteRange(5000, 10)) == b""
    assert len(sends) == 1


def test_a_ranged_first_read_teaches_the_route(store: S3Store) -> None:
    data = value(4, 1000)
    store.set("ranged", data)
    assert store.get("ranged", ByteRange(-100)) == data[-100:]  # botocore's, with a Range
    assert store._lean.ready, store._lean.refused
    sends = botocore_sends(store)
    assert store.get("ranged", ByteRange(10, 20)) == data[10:30]
    assert store.get("ranged") == data
    assert len(sends) == 0


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("token", [None, "session-token"])
def test_the_signature_is_botocores(scheme: str, token: str | None) -> None:
    credentials = Credentials("AKIDEXAMPLE", "secret/key", token)
    url = f"{scheme}://bkt.s3.eu-west-1.amazonaws.com/p/a%20b%2Bc~d"
    headers = {
        "x-amz-request-payer": "requester",
        "x-amz-checksum-mode": "ENABLED",
        "User-Agent": "test agent",
        "Range": "bytes=5-  9",
        "If-Match": '"abc"',
    }
    request = AWSRequest("GET", url, headers=dict(headers))
    S3SigV4Auth(credentials, "s3", "eu-west-1").add_auth(request)
    payload = request.headers["X-Amz-Content-SHA256"]
    assert payload in (EMPTY_SHA256, "UNSIGNED-PAYLOAD")  # a constant of the route
    route = _Route(url, "bkt.s3.eu-west-1.amazonaws.com", (), payload, "eu-west-1", "s3", True)
    mine = dict(headers)
    mine["X-Amz-Date"] = request.headers["X-Amz-Date"]
    mine["X-Amz-Content-SHA256"] = payload
    if token:
        mine["X-Amz-Security-Token"] = token
    signed = sign(
        _Keys(), route, "/p/a%20b%2Bc~d", mine, credentials.get_frozen_credentials(),
        request.headers["X-Amz-Date"],
    )  # fmt: skip
    assert signed == request.headers["Authorization"]


class StubSession:
    """Stands in for the HTTP session: records requests, answers ``status`` with ``body``."""

    def __init__(self, status: int = 200, body: bytes = b"hello") -> None:
        self.status = status
        self.body = body
        self.requests: list[Any] = []

    def send(self, request: Any) -> AWSResponse:
        self.requests.append(request)
        return answer(request, self.status, self.body)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def read(self, amt: int | None = None) -> bytes:
        cut = len(self._body) if amt is None else amt
        out, self._body = self._body[:cut], self._body[cut:]
        return out

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield self.read()

    def close(self) -> None:
        pass


def answer(request: Any, status: int, body: bytes) -> AWSResponse:
    headers = {"content-length": str(len(body)), "etag": f'"{hashlib.md5(body).hexdigest()}"'}
    if status != 200:
        body = b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>"
        headers = {"content-length": str(len(body))}
    return AWSResponse(request.url, status, HTTPHeaders.from_dict(headers), _Raw(body))


def aws_store(monkeypatch: pytest.MonkeyPatch, **spec: Any) -> tuple[S3Store, Sends, StubSession]:
    """A store for a bucket on AWS itself, whose botocore requests are answered 404 by a
    hook and whose lean requests go to a :class:`StubSession`."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    store = S3Store(S3Spec(bucket="my-bucket", path="p/", aws_region="eu-west-1", **spec))
    sends = botocore_sends(store)
    store.client.meta.events.register(
        "before-send.s3.GetObject", lambda request, **_: answer(request, 404, b"")
    )
    stub = store._lean._session = StubSession()
    assert store.get("a key") is None  # botocore, answered by the hook
    assert store._lean.ready, store._lean.refused
    return store, sends, stub


def test_the_route_is_botocores_virtual_host_region_and_requester_pays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, sends, stub = aws_store(monkeypatch, requester_pays=True)
    assert store.get("a key") == b"hello"
    (theirs,), (mine,) = sends.requests, stub.requests
    assert mine.url == theirs.url == "https://my-bucket.s3.eu-west-1.amazonaws.com/p/a%20key"
    per_request = {"x-amz-date", "authorization", "amz-sdk-invocation-id"}
    assert {k.lower(): v for k, v in mine.headers.items() if k.lower() not in per_request} == {
        k.lower(): v.decode() for k, v in theirs.headers.items() if k.lower() not in per_request
    }
    assert mine.headers["x-amz-request-payer"] == "requester"
    assert "/eu-west-1/s3/aws4_request" in mine.headers["Authorization"]
    store.close()


def test_changed_credentials_sign_the_next_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refreshable credentials refresh inside ``get_frozen_credentials``; the lean path asks
    the client's signer for them at every request, as botocore does."""
    store, _, stub = aws_store(monkeypatch)
    signer = store.client._request_signer
    monkeypatch.setattr(signer, "_credentials", Credentials("NEWKEY", "new", "tok"))
    assert store.get("k") == b"hello"
    request = stub.requests[-1]
    assert request.headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=NEWKEY/")
    assert request.headers["X-Amz-Security-Token"] == "tok"
    store.close()


def test_anonymous_reads_are_unsigned(
    proxy: FaultProxy, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_server.client().put_object(
        Bucket=s3_bucket, Key=PREFIX + "open", Body=b"public", ACL="public-read"
    )
    spec = S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=proxy.endpoint, anonymous=True)
    with S3Store(spec) as store:
        sends = lean(store)
        assert store.get("open") == b"public"
        assert len(sends) == 0
        stub = StubSession()
        monkeypatch.setattr(store._lean, "_session", stub)
        assert store.get("open") == b"hello"
        assert "Authorization" not in stub.requests[0].headers


def test_a_route_this_path_cannot_sign_like_botocore_is_not_used(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from n5fs.kvstore.s3 import lean as lean_module

    monkeypatch.setattr(lean_module, "sign", lambda *a, **k: "AWS4-HMAC-SHA256 wrong")
    sends = botocore_sends(store)
    store.set("x", b"1")
    assert store.get("x") == b"1"
    assert store.get("x") == b"1"
    assert not store._lean.ready
    assert "differs" in (store._lean.refused or "")
    assert len(sends) == 2


# -- faults on the lean path -------------------------------------------------------------------


def test_resets_and_5xx_are_retried_by_the_stores_policy(store: S3Store, proxy: FaultProxy) -> None:
    store.set("r", value(1))
    sends = lean(store)
    proxy.inject(
        Fault("reset_before", method="GET", times=2),
        Fault("status", method="GET", status=500, code="InternalError", times=2),
    )
    assert store.get("r") == value(1)
    assert sum(proxy.injected.values()) == 4
    assert store.fault_counters()["s3_retries"] == 4
    assert len(sends) == 0


def test_one_key_that_always_resets_fails_after_the_policys_attempts(
    store: S3Store, proxy: FaultProxy
) -> None:
    store.set("cursed", b"x")
    store.set("fine", b"y")
    lean(store)
    proxy.inject(Fault("reset_before", method="GET", key="cursed"))
    with pytest.raises(StoreUnavailable):
        store.get("cursed")
    assert proxy.injected["reset_before"] == MAX_ATTEMPTS
    assert store.get("fine") == b"y"


def test_slow_down_throttles(store: S3Store, proxy: FaultProxy) -> None:
    store.set("t", b"x")
    lean(store)
    proxy.inject(Fault("status", method="GET", status=503, code="SlowDown", times=2))
    assert store.get("t") == b"x"
    assert store.throttle.throttles == 2
    assert store.fault_counters()["s3_throttled"] == 2


def test_access_denied_is_botocores_answer(store: S3Store, proxy: FaultProxy) -> None:
    sends = lean(store)
    proxy.inject(Fault("status", method="GET", status=403, code="AccessDenied"))
    with pytest.raises(AccessDenied):
        store.get("secret")
    assert len(sends) == 1  # asked again through botocore, which raised


def test_a_silent_endpoint_fails_the_next_read_at_once(store: S3Store, proxy: FaultProxy) -> None:
    store.set("s", b"x")
    lean(store)
    proxy.inject(Fault("stall", method="GET", seconds=3, times=2))
    with pytest.raises(StoreUnavailable):
        store.get("s")
    assert store.fault_counters()["s3_timeouts"] == 2
    probe: dict[str, Any] = {}
    store._silent.before_call(probe)  # another request goes out as the probe
    with pytest.raises(StoreUnavailable, match="did not answer"):
        store.get("s")
    assert store.fault_counters()["s3_failed_fast"] == 1
    store._silent.answered(probe)  # the probe got its answer
    assert store.get("s") == b"x"


def test_a_body_that_breaks_is_resumed(store: S3Store, proxy: FaultProxy) -> None:
    for i in range(4):
        store.set(f"g/{i}", value(i, 64 * 1024))
    sends = lean(store)
    proxy.reset_counts()
    proxy.inject(Fault("reset_mid_body", method="GET", key="^lean/g/", once_per_key=True))
    assert [store.get(f"g/{i}") for i in range(4)] == [value(i, 64 * 1024) for i in range(4)]
    assert proxy.counts["GET range"] == 4
    assert store.fault_counters()["s3_reads_resumed"] == 4
    assert len(sends) == 0


@pytest.mark.parametrize("checksum", ["crc32", "md5 etag"])
def test_damaged_bytes_are_read_again_then_refused(
    store: S3Store, proxy: FaultProxy, s3_server: Any, s3_bucket: str, checksum: str
) -> None:
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
    lean(store)
    proxy.reset_counts()
    proxy.inject(Fault("corrupt", method="GET", times=1))
    assert store.get("damaged") == data
    assert proxy.counts["GET"] == 2
    proxy.inject(Fault("corrupt", method="GET"))
    with pytest.raises(StoreUnavailable, match="could not be read intact"):
        store.get("damaged")


# -- timestamps ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-28T09:42:08.000Z",
        "2026-11-28T09:42:08.123Z",
        "2026-11-28T09:42:08.5Z",
        "2026-11-28T09:42:08.123456Z",
        "2026-11-28T09:42:08Z",
        "2026-11-28T09:42:08.000+02:00",
        "Sat, 28 Nov 2026 09:42:08 GMT",
        "1764322928",
    ],
)
def test_timestamps_parse_as_botocore_parses_them(text: str) -> None:
    from botocore.utils import parse_timestamp as botocores

    from n5fs.kvstore.s3.client import parse_timestamp

    mine, theirs = parse_timestamp(text), botocores(text)
    assert mine == theirs
    assert mine.utcoffset() == theirs.utcoffset()
    assert type(mine.tzinfo) is type(theirs.tzinfo)


def test_listings_carry_the_times_botocore_would_parse(store: S3Store, s3_server: Any) -> None:
    store.set("when", b"x")
    (info,) = store.list("").keys
    head = s3_server.client().head_object(Bucket=store.spec.bucket, Key=PREFIX + "when")
    assert info.mtime == head["LastModified"].timestamp()
