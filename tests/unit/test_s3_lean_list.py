"""The S3 store's lean LISTs (:mod:`n5fs.kvstore.s3.leanlist`): the route is botocore's
(learned from its first ListObjectsV2), the request is the one botocore would send (URL and
query, headers, SigV4 signature), the parse is botocore's (checked once against botocore's
own parse of a page), and the listing never comes out short: broken and cut answers are
retried, anything unexpected is asked again through botocore. Faults come from
:mod:`n5fs.testing.s3_proxy` in front of the session's moto server; requests to AWS itself
are answered by a stub."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials

from n5fs.errors import AccessDenied, StoreUnavailable
from n5fs.kvstore.s3 import S3Store
from n5fs.kvstore.s3 import leanlist as leanlist_module
from n5fs.kvstore.s3 import store as store_module
from n5fs.kvstore.s3.client import client_for
from n5fs.kvstore.s3.lean import Fallback, _Keys, _Route, sign
from n5fs.kvstore.s3.leanlist import _read_of, parse_page, query_of
from n5fs.kvstore.s3.retries import MAX_ATTEMPTS
from n5fs.kvstore.spec import S3Spec
from n5fs.testing.s3_proxy import Fault, FaultProxy, fault_proxy
from tests.bucket import Sends

pytestmark = pytest.mark.s3

PREFIX = "lean/"
#: names that need care on the way: spaces, ``+``, ``%``, unicode, ``~``, query characters
ODD = ["a b", "a+b", "a%b", "a%2Bb", "t~", "q=&r", "sp end ", "é/x", "日本/語", "x/y z/+"]
LIST_ONLY = "^$"  # the proxy's faults by key: a LIST's is empty


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("N5FS_STATE_DIR", str(path))
    return path


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint, seed=5) as running:
        yield running


def open_store(endpoint: str, bucket: str, path: str = PREFIX, **spec: Any) -> S3Store:
    return S3Store(
        S3Spec(
            bucket=bucket,
            path=path,
            endpoint=endpoint,
            connect_timeout=1,
            read_timeout=1,
            **spec,
        )
    )


@pytest.fixture
def store(proxy: FaultProxy, s3_bucket: str) -> Iterator[S3Store]:
    with open_store(proxy.endpoint, s3_bucket) as opened:
        yield opened


def botocore_sends(store: S3Store) -> Sends:
    """The ListObjectsV2 requests botocore sent for ``store`` from now on."""
    return Sends(store, "ListObjectsV2")


def lean(store: S3Store, prefix: str = "") -> Sends:
    """Teach ``store`` its LIST route and check its parse with one listing (of a prefix
    with keys) and count botocore's ListObjectsV2 from then on."""
    sends = botocore_sends(store)
    store.list(prefix, delimiter=None)
    assert store._lean_lists.ready, store._lean_lists.refused
    sends.requests.clear()
    return sends


def botocore_store(endpoint: str, bucket: str, path: str = PREFIX) -> S3Store:
    """A store whose LISTs all go through botocore (the reference)."""
    opened = open_store(endpoint, bucket, path)
    opened._lean_lists.refused = "the reference"
    return opened


def pages(store: S3Store, prefix: str, delimiter: str | None, size: int) -> list[dict[str, Any]]:
    return [_read_of(page) for page in store._pages(prefix, delimiter, page_size=size)]


def put(s3_server: Any, bucket: str, names: list[str], prefix: str = PREFIX) -> None:
    client = s3_server.client()
    for name in names:
        client.put_object(Bucket=bucket, Key=prefix + name, Body=name.encode())


# -- the requests and the pages are botocore's ------------------------------------------------


def test_lists_after_the_first_skip_botocore_and_equal_its_pages(
    store: S3Store, proxy: FaultProxy, s3_server: Any, s3_bucket: str
) -> None:
    names = ODD + [f"many/{i:03d}" for i in range(23)]
    put(s3_server, s3_bucket, names)
    put(s3_server, s3_bucket, ["outside"], prefix="leaner/")  # beside the store's prefix
    sends = lean(store)
    reference = botocore_store(s3_server.endpoint, s3_bucket)
    proxy.reset_counts()
    for prefix, delimiter, size in [
        ("", "/", 1000),
        ("", None, 1000),
        ("", None, 4),
        ("", "/", 3),
        ("many/", None, 5),
        ("x/y z/", "/", 2),
        ("é/", None, 1),
        ("nothing/", "/", 10),
    ]:
        mine = pages(store, prefix, delimiter, size)
        assert mine == pages(reference, prefix, delimiter, size), (prefix, delimiter, size)
    assert len(sends) == 0
    assert proxy.counts["LIST"] > 20
    assert store.list("") == reference.list("")
    assert store.list("many/") == reference.list("many/")
    assert list(store.walk("")) == list(reference.walk(""))
    assert len(sends) == 0
    reference.close()


def test_a_store_at_the_buckets_root_lists_alike(
    proxy: FaultProxy, s3_server: Any, s3_bucket: str
) -> None:
    put(s3_server, s3_bucket, ODD, prefix="")
    with open_store(proxy.endpoint, s3_bucket, path="") as root:
        sends = lean(root)
        reference = botocore_store(s3_server.endpoint, s3_bucket, path="")
        assert pages(root, "", None, 3) == pages(reference, "", None, 3)
        assert root.list("") == reference.list("")
        assert len(sends) == 0
        reference.close()


def test_a_walk_asks_for_a_page_only_when_the_caller_gets_to_it(
    store: S3Store,
    proxy: FaultProxy,
    s3_server: Any,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    put(s3_server, s3_bucket, [f"w/{i:02d}" for i in range(10)])
    lean(store)
    monkeypatch.setattr(store_module, "WALK_PAGE", 3)
    proxy.reset_counts()
    walking = store.walk("w/")
    assert proxy.counts["LIST"] == 0
    assert [next(walking).key for _ in range(3)] == ["w/00", "w/01", "w/02"]
    assert proxy.counts["LIST"] == 1
    assert next(walking).key == "w/03"
    assert proxy.counts["LIST"] == 2
    assert [info.key for info in walking] == [f"w/{i:02d}" for i in range(4, 10)]
    assert proxy.counts["LIST"] == 4


def test_the_query_is_botocores() -> None:
    """The URL botocore makes for the store's arguments, odd characters and all."""
    client = client_for(S3Spec(bucket="b", endpoint="http://127.0.0.1:9"), 1)
    urls: list[str] = []

    def answer(request: Any, **_: Any) -> AWSResponse:
        urls.append(request.url)
        return AWSResponse(request.url, 200, HTTPHeaders(), _Raw(page_xml([])))

    client.meta.events.register("before-send.s3.ListObjectsV2", answer)
    odd = "a b+c/é~d=e&f%g*'()!$,;:@?#[]\x01"
    for args in [
        {"Prefix": ""},
        {"Prefix": odd, "Delimiter": "/"},
        {"Prefix": "p/", "Delimiter": odd, "MaxKeys": 7, "ContinuationToken": odd + "=="},
        {"Prefix": "p/", "MaxKeys": 1000, "ContinuationToken": "1/Ab+c="},
    ]:
        client.list_objects_v2(Bucket="b", **args)
        assert urls[-1] == f"http://127.0.0.1:9/b?{query_of(args)}"


@pytest.mark.parametrize(
    "url",
    [
        "https://bkt.s3.eu-west-1.amazonaws.com/",
        "http://127.0.0.1:9000/bkt",
    ],
)
@pytest.mark.parametrize("token", [None, "session-token"])
def test_a_list_signature_is_botocores(url: str, token: str | None) -> None:
    credentials = Credentials("AKIDEXAMPLE", "secret/key", token)
    odd = "a b+c/é~d=e&f%g*'()"
    query = query_of(
        {"Prefix": odd, "Delimiter": "/", "MaxKeys": 3, "ContinuationToken": "Zm9v+/bar=="}
    )
    headers = {"x-amz-request-payer": "requester", "User-Agent": "test agent"}
    request = AWSRequest("GET", f"{url}?{query}", headers=dict(headers))
    S3SigV4Auth(credentials, "s3", "eu-west-1").add_auth(request)
    payload = request.headers["X-Amz-Content-SHA256"]
    host = url.split("/")[2]
    route = _Route(url, host, (), payload, "eu-west-1", "s3", True)
    mine = dict(headers)
    mine["X-Amz-Date"] = stamp = request.headers["X-Amz-Date"]
    mine["X-Amz-Content-SHA256"] = payload
    if token:
        mine["X-Amz-Security-Token"] = token
    path = url.split(host, 1)[1]
    frozen = credentials.get_frozen_credentials()
    signed = sign(_Keys(), route, path, mine, frozen, stamp, query)
    assert signed == request.headers["Authorization"]


# -- the parse is botocore's -------------------------------------------------------------------


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield self._body

    def close(self) -> None:
        pass


def page_xml(
    keys: list[str],
    prefixes: tuple[str, ...] = (),
    *,
    encoded: bool = True,
    truncated: bool = False,
    token: str | None = None,
    namespace: str = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"',
    when: str = "2026-11-28T09:42:08.000Z",
) -> bytes:
    """A ListObjectsV2 answer naming ``keys`` (as given: encode them first if need be)."""
    contents = "".join(
        f"<Contents><Key>{escape(key)}</Key><LastModified>{when}</LastModified>"
        f"<ETag>&quot;{hashlib.md5(key.encode()).hexdigest()}&quot;</ETag><Size>{len(key)}"
        "</Size><StorageClass>STANDARD</StorageClass></Contents>"
        for key in keys
    )
    common = "".join(
        f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes
    )
    more = f"<NextContinuationToken>{escape(token)}</NextContinuationToken>" if token else ""
    encoding = "<EncodingType>url</EncodingType>" if encoded else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult{namespace}>'
        f"<Name>b</Name><Prefix></Prefix><KeyCount>{len(keys)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>"
        f"{contents}{common}{more}{encoding}</ListBucketResult>"
    ).encode()


def botocores_parse(body: bytes) -> dict[str, Any]:
    """botocore's page of ``body`` (its whole pipeline: the parse and the key decoding)."""
    client = client_for(S3Spec(bucket="b", endpoint="http://127.0.0.1:9"), 1)
    client.meta.events.register(
        "before-send.s3.ListObjectsV2",
        lambda request, **_: AWSResponse(request.url, 200, HTTPHeaders(), _Raw(body)),
    )
    page: dict[str, Any] = client.list_objects_v2(Bucket="b", Prefix="")
    return page


@pytest.mark.parametrize(
    "body",
    [
        page_xml(
            ["p/a%20b", "p/a+b", "p/a%2Bb", "p/%C3%A9", "p/t~", "p/q%3D%26r"], ("p/%E2%9C%93/",)
        ),
        page_xml(["p/a+b", "p/a%20b", "p/é", "<&>\"'"], ("p/x+y/",), encoded=False),
        page_xml(["k"], truncated=True, token="1/abc+def=="),
        page_xml(["k", ""], namespace=""),
        page_xml(["k"], namespace=' xmlns:s3="urn:other"'),
        page_xml(["k"], when="2026-11-28T09:42:08.5Z"),
        page_xml(["k"], when="2026-11-28T09:42:08+02:00"),
        page_xml(["k"], when="Sat, 28 Nov 2026 09:42:08 GMT"),
        page_xml(["k%ZZ%C3", "%E2%82"]),  # escapes botocore decodes with replacement
        page_xml([], ("a/", "b/")),
        page_xml([]),
        page_xml(["spaced"]).replace(b"<Size>6</Size>", b"<Size> 6 </Size>"),
        page_xml(["cdata"]).replace(b"<Key>cdata</Key>", b"<Key><![CDATA[c&d]]></Key>"),
        page_xml(["k"]).replace(b"<Contents>", b"<Contents><Owner><ID>x</ID></Owner>"),
    ],
)
def test_the_parse_is_botocores(body: bytes) -> None:
    assert parse_page(body) == _read_of(botocores_parse(body))


@pytest.mark.parametrize(
    "body",
    [
        b"<Error><Code>AccessDenied</Code></Error>",
        page_xml(["k"]).replace(b"<Size>1</Size>", b"<Size>1</Size><Size>2</Size>"),
        page_xml(["k"]).replace(b"<Size>1</Size>", b"<Size>one</Size>"),
        page_xml(["k"]).replace(b"<Key>k</Key>", b""),
        page_xml(["k"]).replace(
            b"</IsTruncated>", b"</IsTruncated><IsTruncated>true</IsTruncated>"
        ),
        page_xml([], ("a/",)).replace(b"<Prefix>a/</Prefix>", b""),
    ],
)
def test_xml_this_parse_does_not_expect_goes_to_botocore(body: bytes) -> None:
    with pytest.raises(Fallback):
        parse_page(body)


def test_a_body_that_is_not_whole_xml_is_never_a_page() -> None:
    from xml.etree.ElementTree import ParseError

    body = page_xml([f"k{i}" for i in range(20)])
    for cut in (0, 1, len(body) // 2, len(body) - 1):
        with pytest.raises(ParseError):
            parse_page(body[:cut])


# -- learning and the one check ----------------------------------------------------------------


def test_the_check_waits_for_a_page_that_names_something(
    store: S3Store, s3_server: Any, s3_bucket: str
) -> None:
    sends = botocore_sends(store)
    assert store.list("").keys == ()
    assert store._lean_lists._route is not None
    assert not store._lean_lists.ready  # an empty page checks nothing
    put(s3_server, s3_bucket, ["k"])
    assert [info.key for info in store.list("").keys] == ["k"]
    assert store._lean_lists.ready
    assert len(sends) == 2
    assert [info.key for info in store.list("").keys] == ["k"]
    assert len(sends) == 2


def test_a_parse_that_differs_keeps_lists_on_botocore(
    store: S3Store, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(s3_server, s3_bucket, ["a", "b"])
    real = parse_page

    def short(body: bytes) -> dict[str, Any]:
        page = real(body)
        page["Contents"] = page["Contents"][:-1]
        return page

    monkeypatch.setattr(leanlist_module, "parse_page", short)
    sends = botocore_sends(store)
    for _ in range(3):
        assert [info.key for info in store.list("").keys] == ["a", "b"]
    assert not store._lean_lists.ready
    assert "parse" in (store._lean_lists.refused or "")
    assert len(sends) == 3


def test_a_route_this_path_cannot_sign_like_botocore_is_not_used(
    store: S3Store, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from n5fs.kvstore.s3 import lean as lean_module

    monkeypatch.setattr(lean_module, "sign", lambda *a, **k: "AWS4-HMAC-SHA256 wrong")
    put(s3_server, s3_bucket, ["a"])
    sends = botocore_sends(store)
    assert [info.key for info in store.list("").keys] == ["a"]
    assert [info.key for info in store.list("").keys] == ["a"]
    assert not store._lean_lists.ready
    assert "differs" in (store._lean_lists.refused or "")
    assert len(sends) == 2


class StubSession:
    """Stands in for the HTTP session: records requests, answers 200 with ``body``."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requests: list[Any] = []

    def send(self, request: Any) -> AWSResponse:
        self.requests.append(request)
        return AWSResponse(request.url, 200, HTTPHeaders(), _Raw(self.body))


def test_the_route_is_botocores_virtual_host_region_and_requester_pays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bucket on AWS itself: botocore's LIST is answered by a hook, the lean path's by a
    stub session; both send the same URL and headers."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    spec = S3Spec(bucket="my-bucket", path="p/", aws_region="eu-west-1", requester_pays=True)
    body = page_xml(["p/a%20b", "p/c"], ("p/d%2B/",))
    with S3Store(spec) as aws:
        sends = botocore_sends(aws)
        aws.client.meta.events.register(
            "before-send.s3.ListObjectsV2",
            lambda request, **_: AWSResponse(request.url, 200, HTTPHeaders(), _Raw(body)),
        )
        first = aws.list("")
        assert aws._lean_lists.ready, aws._lean_lists.refused
        stub = aws._lean_lists._session = StubSession(body)
        assert aws.list("") == first
        assert [info.key for info in first.keys] == ["a b", "c"]
        assert first.prefixes == ("d+/",)
        (theirs,), (mine,) = sends.requests, stub.requests
        assert mine.url == theirs.url
        assert mine.url == (
            "https://my-bucket.s3.eu-west-1.amazonaws.com/"
            "?list-type=2&prefix=p%2F&delimiter=%2F&encoding-type=url"
        )
        per_request = {"x-amz-date", "authorization", "amz-sdk-invocation-id", "amz-sdk-request"}
        assert {k.lower(): v for k, v in mine.headers.items() if k.lower() not in per_request} == {
            k.lower(): v.decode() for k, v in theirs.headers.items() if k.lower() not in per_request
        }
        assert mine.headers["x-amz-request-payer"] == "requester"
        assert "/eu-west-1/s3/aws4_request" in mine.headers["Authorization"]


def test_anonymous_lists_are_unsigned(
    proxy: FaultProxy, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(s3_server, s3_bucket, ["open"])
    with open_store(proxy.endpoint, s3_bucket, anonymous=True) as anon:
        sends = lean(anon)
        assert [info.key for info in anon.list("").keys] == ["open"]
        assert len(sends) == 0
        stub = StubSession(page_xml(["lean/x"]))
        monkeypatch.setattr(anon._lean_lists, "_session", stub)
        assert [info.key for info in anon.list("").keys] == ["x"]
        assert "Authorization" not in stub.requests[0].headers


# -- faults: retried, asked again through botocore, never a short listing --------------------


@pytest.fixture
def listed(store: S3Store, s3_server: Any, s3_bucket: str) -> list[str]:
    """30 keys in the store, which lists them on the lean path from now on."""
    names = [f"f/{i:02d}" for i in range(30)]
    put(s3_server, s3_bucket, names)
    lean(store)
    return names


@pytest.mark.parametrize(
    "fault",
    [
        Fault("reset_before", method="GET", key=LIST_ONLY, times=3),
        Fault("status", method="GET", key=LIST_ONLY, status=500, code="InternalError", times=3),
        Fault("reset_mid_body", method="GET", key=LIST_ONLY, times=3),
        Fault("cut_answer", method="GET", key=LIST_ONLY, times=3),
        Fault("corrupt", method="GET", key=LIST_ONLY, times=3),
    ],
    ids=lambda fault: fault.kind,
)
def test_broken_answers_are_retried_by_the_stores_policy(
    store: S3Store, proxy: FaultProxy, listed: list[str], fault: Fault
) -> None:
    sends = botocore_sends(store)
    proxy.inject(fault)
    assert [info.key for info in store.walk("")] == listed  # 1 page of 30
    assert [page["Contents"][0]["Key"] for page in store._pages("", None, page_size=7)] == [
        PREFIX + name for name in listed[::7]
    ]
    assert proxy.injected[fault.kind] == 3
    assert store.fault_counters()["s3_retries"] == 3
    assert len(sends) == 0


@pytest.mark.parametrize("kind", ["cut_answer", "reset_mid_body"])
def test_an_answer_always_cut_short_fails_never_lists_short(
    store: S3Store, proxy: FaultProxy, listed: list[str], kind: Any
) -> None:
    proxy.inject(Fault(kind, method="GET", key=LIST_ONLY))
    with pytest.raises(StoreUnavailable):
        store.list("")
    with pytest.raises(StoreUnavailable):
        list(store.walk(""))
    assert proxy.injected[kind] == 2 * MAX_ATTEMPTS
    proxy.clear()
    assert [info.key for info in store.walk("")] == listed


def test_a_later_page_cut_short_is_retried_not_ended(
    store: S3Store, proxy: FaultProxy, listed: list[str]
) -> None:
    walking = store._pages("", None, page_size=10)
    first = next(walking)
    proxy.inject(Fault("cut_answer", method="GET", key=LIST_ONLY, times=1))
    rest = list(walking)
    keys = [obj["Key"] for page in [first, *rest] for obj in page["Contents"]]
    assert keys == [PREFIX + name for name in listed]
    assert proxy.injected["cut_answer"] == 1


def test_slow_down_throttles(store: S3Store, proxy: FaultProxy, listed: list[str]) -> None:
    proxy.inject(Fault("status", method="GET", key=LIST_ONLY, status=503, code="SlowDown", times=2))
    assert len(store.list("f/").keys) == len(listed)
    assert store.throttle.throttles == 2
    assert store.fault_counters()["s3_throttled"] == 2


def test_a_403_is_asked_again_through_botocore(
    store: S3Store, proxy: FaultProxy, listed: list[str]
) -> None:
    sends = botocore_sends(store)
    proxy.inject(
        Fault("status", method="GET", key=LIST_ONLY, status=403, code="AccessDenied", times=1)
    )
    assert [info.key for info in store.walk("")] == listed
    assert len(sends) == 1  # the lean path's 403, asked again: botocore's answer is the page
    proxy.inject(Fault("status", method="GET", key=LIST_ONLY, status=403, code="AccessDenied"))
    with pytest.raises(AccessDenied):
        store.list("")
    assert len(sends) == 2
    assert store._lean_lists.ready  # a refusal is an answer, not a reason to stop


def test_a_silent_endpoint_fails_the_next_list_at_once(
    store: S3Store, proxy: FaultProxy, listed: list[str]
) -> None:
    proxy.inject(Fault("stall", method="GET", key=LIST_ONLY, seconds=3, times=2))
    with pytest.raises(StoreUnavailable):
        store.list("")
    assert store.fault_counters()["s3_timeouts"] == 2
    probe: dict[str, Any] = {}
    store._silent.before_call(probe)  # another request goes out as the probe
    with pytest.raises(StoreUnavailable, match="did not answer"):
        store.list("")
    assert store.fault_counters()["s3_failed_fast"] == 1
    store._silent.answered(probe)
    assert len(store.list("f/").keys) == len(listed)
