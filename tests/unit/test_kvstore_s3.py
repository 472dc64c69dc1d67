"""The S3 driver against a real HTTP S3 server on loopback (moto server, session fixture).

Seeds and peeks go through a separate boto3 client, never through the store under test.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from botocore import UNSIGNED
from botocore.exceptions import ClientError, EndpointConnectionError

from n5fs.errors import (
    AccessDenied,
    InvalidSource,
    KeyNotFound,
    N5fsError,
    StoreUnavailable,
    errno_of,
)
from n5fs.kvstore import open_store
from n5fs.kvstore.base import ByteRange, KvStore
from n5fs.kvstore.s3 import MiB, S3Store, translate
from n5fs.kvstore.spec import S3Spec, parse_spec, parse_url
from n5fs.testing.kvstore_contract import KvStoreContract

pytestmark = pytest.mark.s3

PREFIX = "root/"


def _put_all(client: Any, bucket: str, items: Iterable[tuple[str, bytes]]) -> None:
    """Seed in parallel: moto answers ~200 PUTs/s one by one, ~300/s with a few threads."""

    def put(item: tuple[str, bytes]) -> None:
        client.put_object(Bucket=bucket, Key=item[0], Body=item[1])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, items))


def _peek(client: Any, bucket: str, name: str) -> bytes | None:
    try:
        data: bytes = client.get_object(Bucket=bucket, Key=name)["Body"].read()
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchKey":
            return None
        raise
    return data


@pytest.fixture(autouse=True)
def _journal_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Multipart uploads are journaled (n5fs.kvstore.s3.uploads): in the test's directory."""
    monkeypatch.setenv("N5FS_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def client(s3_server: Any) -> Any:
    """One seeding client for the module: building a boto3 client costs ~0.1 s."""
    return s3_server.client()


@pytest.fixture
def spec(s3_server: Any, s3_bucket: str) -> S3Spec:
    return S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=s3_server.endpoint)


@pytest.fixture
def s3store(spec: S3Spec) -> Iterator[S3Store]:
    with S3Store.from_spec(spec) as store:
        assert isinstance(store, S3Store)
        yield store


class TestS3Store(KvStoreContract):
    """The shared contract, with the store under a prefix of a fresh bucket."""

    #: past S3's page of 1,000 keys (moto seeds some 250 keys a second)
    many_keys = 1200

    @pytest.fixture
    def store(self, s3store: S3Store, client: Any) -> S3Store:
        self.client = client
        return s3store

    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        assert isinstance(store, S3Store)
        self.client.put_object(Bucket=store.spec.bucket, Key=PREFIX + key, Body=value)

    def seed_many(self, store: KvStore, items: Iterable[tuple[str, bytes]]) -> None:
        assert isinstance(store, S3Store)
        _put_all(self.client, store.spec.bucket, ((PREFIX + k, v) for k, v in items))

    def peek(self, store: KvStore, key: str) -> bytes | None:
        assert isinstance(store, S3Store)
        return _peek(self.client, store.spec.bucket, PREFIX + key)

    @pytest.mark.slow
    def test_list_many_keys(self, store: KvStore) -> None:
        super().test_list_many_keys(store)


# -- large values: multipart ------------------------------------------------------------------

BIG = 64 * MiB + 12345  # 5 parts of 16 MiB


@pytest.fixture(scope="module")
def big_value() -> bytes:
    return os.urandom(BIG)


def _assert_multipart_and_ranges(store: S3Store, client: Any, key: str, value: bytes) -> None:
    head = client.head_object(Bucket=store.spec.bucket, Key=PREFIX + key)
    assert head["ETag"].strip('"').endswith("-5"), head["ETag"]
    assert head["ContentLength"] == len(value)
    boundary = 16 * MiB
    for byte_range in (ByteRange(0, 1000), ByteRange(boundary - 10, 20), ByteRange(-777)):
        start, stop = byte_range.resolve(len(value))
        assert store.get(key, byte_range) == value[start:stop]
    whole = store.get(key)
    assert whole is not None
    assert hashlib.sha256(whole).digest() == hashlib.sha256(value).digest()


@pytest.mark.slow
def test_set_large_value_goes_multipart(s3store: S3Store, client: Any, big_value: bytes) -> None:
    s3store.set("big/set", big_value)
    _assert_multipart_and_ranges(s3store, client, "big/set", big_value)


@pytest.mark.slow
def test_put_file_large_value_goes_multipart(
    s3store: S3Store, client: Any, big_value: bytes, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(big_value)
    s3store.put_file("big/file", src)
    _assert_multipart_and_ranges(s3store, client, "big/file", big_value)


def test_failed_multipart_leaves_old_value_and_no_upload(spec: S3Spec, client: Any) -> None:
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB)
    store.set("k", b"old")
    calls = []

    def fail_third_part(params: dict[str, Any], **_: Any) -> None:
        calls.append(params["PartNumber"])
        if params["PartNumber"] == 3:
            raise EndpointConnectionError(endpoint_url="injected")

    store.client.meta.events.register("provide-client-params.s3.UploadPart", fail_third_part)
    with pytest.raises(StoreUnavailable) as info:
        store.set("k", b"n" * (12 * MiB))
    assert isinstance(info.value.__cause__, EndpointConnectionError)
    assert 3 in calls
    assert _peek(client, spec.bucket, PREFIX + "k") == b"old"
    assert client.list_multipart_uploads(Bucket=spec.bucket).get("Uploads", []) == []
    store.close()


def test_managed_copy_above_single_copy_limit(spec: S3Spec, client: Any) -> None:
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB, single_copy_limit=MiB)
    value = os.urandom(12 * MiB)
    client.put_object(Bucket=spec.bucket, Key=PREFIX + "src", Body=value)
    store.copy("src", "dst")
    head = client.head_object(Bucket=spec.bucket, Key=PREFIX + "dst")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
    assert _peek(client, spec.bucket, PREFIX + "dst") == value
    store.close()


# -- listing ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_listing_pages_past_1000_keys_and_delete_prefix(s3store: S3Store, client: Any) -> None:
    # the contract's test_list_many_keys lists 1,200 keys with a delimiter; this one checks
    # what else crosses a page boundary (moto seeds ~250 keys/s, so it stays just past one)
    names = [f"c/{i}.{j}" for i in range(11) for j in range(100)]
    extra = ["c/sub/x", "c/sub/deeper/y", "c2/not-under-c"]
    _put_all(client, s3store.spec.bucket, [(PREFIX + k, k.encode()) for k in [*names, *extra]])

    folder = s3store.list("c/")
    assert folder.names() == sorted(names)
    assert list(folder.prefixes) == ["c/sub/"]
    assert {k.size for k in folder.keys} == {len(n) for n in names}
    assert all(k.mtime > 0 for k in folder.keys)
    below = s3store.list("c/", delimiter=None)
    assert below.names() == sorted([*names, "c/sub/x", "c/sub/deeper/y"])

    assert s3store.delete_prefix("c/") == len(names) + 2
    assert s3store.list("", delimiter=None).names() == ["c2/not-under-c"]


def test_names_no_key_can_spell_are_invisible(s3store: S3Store, client: Any) -> None:
    bucket = s3store.spec.bucket
    _put_all(client, bucket, [(PREFIX + n, b"") for n in ("d/", "d/real", "a//b", "./x", "ok")])
    assert s3store.list("", delimiter=None).names() == ["d/real", "ok"]
    assert list(s3store.list("").prefixes) == ["a/", "d/"]
    assert s3store.list("a/").prefixes == ()
    assert s3store.list("d/").names() == ["d/real"]
    assert s3store.delete_prefix("") == 5  # the markers go too
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_prefix_isolation(s3_server: Any, s3_bucket: str) -> None:
    def open_at(path: str) -> S3Store:
        return S3Store(S3Spec(bucket=s3_bucket, path=path, endpoint=s3_server.endpoint))

    vol, vol2, nested = open_at("vol"), open_at("vol2/"), open_at("vol/inner")
    vol.set("k", b"one")
    vol2.set("k", b"two")
    nested.set("k", b"three")
    assert (vol.get("k"), vol2.get("k"), nested.get("k")) == (b"one", b"two", b"three")
    assert vol.list("").names() == ["k"]
    assert list(vol.list("").prefixes) == ["inner/"]
    assert vol2.list("", delimiter=None).names() == ["k"]
    assert vol2.delete_prefix("") == 1
    assert vol.list("", delimiter=None).names() == ["inner/k", "k"]


# -- errors -----------------------------------------------------------------------------------


def test_missing_bucket_fails_at_open_naming_bucket_and_endpoint(s3_server: Any) -> None:
    spec = S3Spec(bucket="no-such-bucket-n5fs", path="p/", endpoint=s3_server.endpoint)
    with pytest.raises(KeyNotFound) as info:
        open_store(spec)
    assert errno_of(info.value) == errno.ENOENT
    assert "no-such-bucket-n5fs" in str(info.value)
    assert s3_server.endpoint in str(info.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, _: s.get("k"),
        lambda s, _: s.list(""),
        lambda s, _: s.set("k", b"v"),
        lambda s, tmp: s.put_file("k", tmp),
    ],
    ids=["get", "list", "set", "put_file"],
)
def test_missing_bucket_on_first_use(s3_server: Any, tmp_path: Path, call: Any) -> None:
    store = S3Store(S3Spec(bucket="no-such-bucket-n5fs", endpoint=s3_server.endpoint))
    small = tmp_path / "small"
    small.write_bytes(b"x")
    with pytest.raises(KeyNotFound, match="bucket does not exist: s3://no-such-bucket-n5fs/") as i:
        call(store, small)
    assert isinstance(i.value.__cause__, ClientError)
    assert s3_server.endpoint in str(i.value)


def _client_error(code: str, status: int) -> ClientError:
    error = {"Code": code, "Message": "told by hand"} if code else {}
    response: Any = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("code", "status", "cls", "code_errno"),
    [
        ("AccessDenied", 403, AccessDenied, errno.EACCES),
        ("", 403, AccessDenied, errno.EACCES),  # HEAD answers carry no body, only the status
        ("NoSuchKey", 404, KeyNotFound, errno.ENOENT),
        ("SlowDown", 503, StoreUnavailable, errno.EIO),
        ("InternalError", 500, StoreUnavailable, errno.EIO),
        ("SomethingNew", 503, StoreUnavailable, errno.EIO),  # unknown code: by its status
        ("SomethingNew", 400, N5fsError, errno.EIO),
    ],
)
def test_error_table(code: str, status: int, cls: type[N5fsError], code_errno: int) -> None:
    err = translate(_client_error(code, status), "s3://bkt/p/ at http://x", "a/key")
    assert type(err) is cls
    assert errno_of(err) == code_errno
    assert "'a/key'" in str(err)
    assert "s3://bkt/p/" in str(err)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.slow
def test_unreachable_endpoint_is_store_unavailable() -> None:
    spec = S3Spec(bucket="bkt1", endpoint=f"http://127.0.0.1:{_closed_port()}", max_retries=0)
    store = S3Store(spec)
    with pytest.raises(StoreUnavailable) as info:
        store.get("k")
    assert errno_of(info.value) == errno.EIO
    assert isinstance(info.value.__cause__, EndpointConnectionError)
    assert "'k'" in str(info.value)


# -- specs, URLs, credentials ----------------------------------------------------------------


def _sent_headers(store: S3Store) -> list[dict[str, str]]:
    """Headers of every request the store's client sends from now on (values as text)."""
    sent: list[dict[str, str]] = []

    def record(request: Any, **_: Any) -> None:
        sent.append(
            {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        )

    store.client.meta.events.register("before-send.s3.*", record)
    return sent


def test_anonymous_spec_sends_unsigned_requests(spec: S3Spec, client: Any) -> None:
    client.put_object(Bucket=spec.bucket, Key=PREFIX + "public", Body=b"open", ACL="public-read")
    client.put_object(Bucket=spec.bucket, Key=PREFIX + "private", Body=b"closed")
    anon = S3Store(S3Spec(bucket=spec.bucket, path=PREFIX, endpoint=spec.endpoint, anonymous=True))
    assert anon.client.meta.config.signature_version is UNSIGNED
    sent = _sent_headers(anon)
    assert anon.get("public") == b"open"
    with pytest.raises(AccessDenied) as info:  # the server's answer, not a local refusal
        anon.get("private")
    assert errno_of(info.value) == errno.EACCES
    assert "'private'" in str(info.value)
    assert len(sent) == 2
    assert not any("Authorization" in headers for headers in sent)


def test_signed_and_requester_pays_headers(spec: S3Spec) -> None:
    payer = S3Store.from_spec(
        S3Spec(bucket=spec.bucket, endpoint=spec.endpoint, requester_pays=True)
    )
    sent = _sent_headers(payer)
    payer.set("k", b"v")
    payer.stat("k")
    payer.list("")
    assert len(sent) == 3
    assert all("Authorization" in h for h in sent)
    assert all(h.get("x-amz-request-payer") == "requester" for h in sent)


def test_profile_credentials_are_used(
    spec: S3Spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "aws_config"
    config.write_text("[profile lab]\naws_access_key_id = LABKEY\naws_secret_access_key = x\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    store = S3Store(S3Spec(bucket=spec.bucket, endpoint=spec.endpoint, profile="lab"))
    sent = _sent_headers(store)
    assert store.get("absent") is None
    assert "Credential=LABKEY/" in sent[0]["Authorization"]  # not the env's key

    with pytest.raises(InvalidSource, match="no-such-profile") as info:
        S3Store(S3Spec(bucket=spec.bucket, endpoint=spec.endpoint, profile="no-such-profile"))
    assert errno_of(info.value) == errno.EINVAL


def test_open_store_url_with_endpoint_from_env(
    s3_server: Any, s3_bucket: str, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    client.put_object(Bucket=s3_bucket, Key="pre/fix/k", Body=b"via url")
    with open_store(f"s3://{s3_bucket}/pre/fix/") as store:
        assert isinstance(store, S3Store)
        assert store.get("k") == b"via url"
        assert store.spec == S3Spec(bucket=s3_bucket, path="pre/fix/")


def test_open_store_json_with_endpoint(s3_server: Any, s3_bucket: str, client: Any) -> None:
    client.put_object(Bucket=s3_bucket, Key="data/k", Body=b"via json")
    text = f'{{"driver": "s3", "bucket": "{s3_bucket}", "path": "data",'
    text += f' "endpoint": "{s3_server.endpoint}", "aws_region": "us-east-1"}}'
    with open_store(text) as store:
        assert store.get("k") == b"via json"
        assert store.list("").names() == ["k"]
        assert parse_spec(store.spec.to_json()) == store.spec
        assert parse_url(store.spec.to_url()).location == store.spec.location


def test_zero_length_range_and_get_many(s3store: S3Store, client: Any) -> None:
    client.put_object(Bucket=s3store.spec.bucket, Key=PREFIX + "z", Body=b"abc")
    assert s3store.get("z", ByteRange(1, 0)) == b""
    assert s3store.get("absent", ByteRange(1, 0)) is None
    assert s3store.get_many(["z", "z", "absent"]) == {"z": b"abc", "absent": None}


# -- times: x-amz-meta-mtime ------------------------------------------------------------------

T = 1_700_000_000.25


def _head(client: Any, bucket: str, key: str) -> dict[str, Any]:
    head: dict[str, Any] = client.head_object(Bucket=bucket, Key=PREFIX + key)
    return head


def test_set_mtime_writes_rclone_style_metadata_and_keeps_headers(
    s3store: S3Store, client: Any
) -> None:
    bucket = s3store.spec.bucket
    client.put_object(
        Bucket=bucket,
        Key=PREFIX + "k",
        Body=b"data",
        ContentType="application/json",
        CacheControl="no-cache",
        Metadata={"owner": "lab"},
    )
    listed_before = s3store.list("").keys[0].mtime
    s3store.set_mtime("k", T)
    head = _head(client, bucket, "k")
    assert head["Metadata"] == {"owner": "lab", "mtime": "1700000000.250000000"}
    assert (head["ContentType"], head["CacheControl"]) == ("application/json", "no-cache")
    info = s3store.stat("k")
    assert info is not None
    assert (info.size, info.mtime) == (4, T)
    assert s3store.get("k") == b"data"
    # a LIST carries no user metadata: it reports LastModified
    assert s3store.list("").keys[0].mtime == pytest.approx(listed_before, abs=5)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1700000000", 1_700_000_000.0),  # s3fs-fuse: whole seconds
        ("1700000000.123456789", 1_700_000_000.123456789),  # rclone
        ("not a time", None),  # ignored: LastModified
    ],
)
def test_stat_reads_mtime_metadata_of_other_tools(
    s3store: S3Store, client: Any, text: str, seconds: float | None
) -> None:
    bucket = s3store.spec.bucket
    client.put_object(Bucket=bucket, Key=PREFIX + "k", Body=b"x", Metadata={"mtime": text})
    info = s3store.stat("k")
    assert info is not None
    if seconds is None:
        last = _head(client, bucket, "k")["LastModified"].timestamp()
        assert info.mtime == last
    else:
        assert info.mtime == pytest.approx(seconds, abs=1e-6)


def test_copy_and_rename_keep_time_and_headers(s3store: S3Store, client: Any) -> None:
    bucket = s3store.spec.bucket
    client.put_object(
        Bucket=bucket, Key=PREFIX + "src", Body=b"v", ContentType="text/plain", Metadata={"a": "b"}
    )
    plain = s3store.stat("src")
    assert plain is not None
    s3store.copy("src", "plain-copy")  # no time set: the source's LastModified is kept
    assert _head(client, bucket, "plain-copy")["Metadata"]["a"] == "b"
    copied = s3store.stat("plain-copy")
    assert copied is not None
    assert copied.mtime == plain.mtime

    s3store.set_mtime("src", T)
    s3store.rename("src", "moved/dst")
    head = _head(client, bucket, "moved/dst")
    assert (head["ContentType"], head["Metadata"]) == (
        "text/plain",
        {"a": "b", "mtime": "1700000000.250000000"},
    )
    info = s3store.stat("moved/dst")
    assert info is not None
    assert info.mtime == T
    assert s3store.stat("src") is None


def test_managed_copy_and_set_mtime_keep_metadata(spec: S3Spec, client: Any) -> None:
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB, single_copy_limit=MiB)
    value = os.urandom(11 * MiB)
    client.put_object(
        Bucket=spec.bucket,
        Key=PREFIX + "src",
        Body=value,
        ContentType="application/x-n5",
        Metadata={"mtime": "1600000000", "x": "y"},
    )
    store.copy("src", "dst")
    head = _head(client, spec.bucket, "dst")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # the multipart path
    assert head["ContentType"] == "application/x-n5"
    assert head["Metadata"] == {"mtime": "1600000000.000000000", "x": "y"}
    store.set_mtime("dst", T)  # a copy onto itself, in parts
    head = _head(client, spec.bucket, "dst")
    assert head["Metadata"] == {"mtime": "1700000000.250000000", "x": "y"}
    assert head["ContentType"] == "application/x-n5"
    assert _peek(client, spec.bucket, PREFIX + "dst") == value
    info = store.stat("dst")
    assert info is not None
    assert (info.size, info.mtime) == (len(value), T)
    with pytest.raises(KeyNotFound):
        store.set_mtime("absent", T)
    store.close()


def _operations(store: S3Store) -> list[str]:
    """The names of the requests the store's client makes from now on."""
    made: list[str] = []
    store.client.meta.events.register(
        "before-call.s3.*", lambda model, **_: made.append(model.name)
    )
    return made


@pytest.mark.parametrize("size", [4, 11 * MiB], ids=["one PUT", "multipart"])
def test_set_with_mtime_carries_the_time_in_the_write(
    spec: S3Spec, client: Any, tmp_path: Path, size: int
) -> None:
    """``cp -a`` sets the time before ``close()``: it rides the PUT (or the multipart
    upload's creation), with no HEAD and no copy of the object after it."""
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB)
    value = os.urandom(size)
    made = _operations(store)
    assert store.set_with_mtime("k", value, T)
    assert "HeadObject" not in made
    assert "CopyObject" not in made
    assert ("PutObject" in made) == (size < 5 * MiB)
    local = tmp_path / "staged"
    local.write_bytes(value)
    assert store.put_file_with_mtime("f", local, T + 1)
    for key, when in (("k", T), ("f", T + 1)):
        info = store.stat(key)
        assert info is not None
        assert (info.size, info.mtime) == (size, when)
        assert _peek(client, spec.bucket, PREFIX + key) == value
    assert "CopyObject" not in made
    store.close()
