"""S3 conditional writes (what keeps many mounts of one bucket consistent) against the moto server: large
values through multipart, the probe against an endpoint that honours the conditions and one
that drops them (n5fs.testing.s3_proxy), and the probe's scratch object after a killed probe.

Seeds and peeks go through a separate boto3 client, never through the store under test.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from n5fs.errors import VersionConflict, errno_of
from n5fs.gateway.commit.conditional import Conditional
from n5fs.kvstore.s3 import MiB, S3Store, translate
from n5fs.kvstore.s3 import conditional as s3_conditional
from n5fs.kvstore.spec import S3Spec
from n5fs.kvstore.wrappers import ReadOnlyStore
from n5fs.testing.s3_proxy import dropping_conditions

pytestmark = pytest.mark.s3

PREFIX = "root/"


@pytest.fixture(autouse=True)
def _journal_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Multipart uploads are journaled (n5fs.kvstore.s3.uploads): in the test's directory."""
    monkeypatch.setenv("N5FS_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def client(s3_server: Any) -> Any:
    return s3_server.client()


@pytest.fixture
def spec(s3_server: Any, s3_bucket: str) -> S3Spec:
    return S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=s3_server.endpoint)


@pytest.fixture
def store(spec: S3Spec) -> Iterator[S3Store]:
    with S3Store.from_spec(spec) as opened:
        yield opened


def _objects(client: Any, bucket: str) -> list[str]:
    return [obj["Key"] for obj in client.list_objects_v2(Bucket=bucket).get("Contents", ())]


def _uploads(client: Any, bucket: str) -> list[Any]:
    return list(client.list_multipart_uploads(Bucket=bucket).get("Uploads", ()))


def _requests(store: S3Store) -> list[tuple[str, dict[str, str]]]:
    """Every request ``store`` sends from now on: operation name and headers."""
    sent: list[tuple[str, dict[str, str]]] = []

    def record(request: Any, event_name: str, **_: Any) -> None:
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        sent.append((event_name.rsplit(".", 1)[-1], headers))

    store.client.meta.events.register("before-send.s3", record)
    return sent


# -- multipart ------------------------------------------------------------------------------


def test_multipart_set_if_with_both_conditions(spec: S3Spec, client: Any) -> None:
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB)
    sent = _requests(store)
    one, two = os.urandom(5 * MiB + 10), os.urandom(5 * MiB + 20)
    try:
        first = store.set_if("big", one, version=None)
        assert first is not None
        assert first.strip('"').endswith("-2")  # two parts, completed
        with pytest.raises(VersionConflict) as info:
            store.set_if("big", two, version=None)
        assert errno_of(info.value) == errno.EAGAIN
        assert _uploads(client, spec.bucket) == []  # the refused upload was aborted
        assert store.get("big") == one

        second = store.set_if("big", two, version=first)
        assert second not in (None, first)
        read = store.get_versioned("big")
        assert read is not None
        assert (read.data, read.version) == (two, second)
    finally:
        store.close()
    completes = [headers for op, headers in sent if op == "CompleteMultipartUpload"]
    puts = [op for op, _ in sent if op == "PutObject"]
    assert puts == []  # every write above went multipart
    assert [h.get("If-None-Match") for h in completes] == ["*", "*", None]
    # moto does not check If-Match on CompleteMultipartUpload (AWS does): check what we sent
    assert completes[2].get("If-Match") == first
    assert _uploads(client, spec.bucket) == []


# -- refusals are conflicts, not faults --------------------------------------------------------


def test_a_refusal_is_asked_once_and_is_no_fault(spec: S3Spec) -> None:
    retrying = S3Spec(bucket=spec.bucket, path=PREFIX, endpoint=spec.endpoint, max_retries=3)
    with S3Store(retrying) as store:
        version = store.set_if("k", b"v", version=None)
        sent = _requests(store)
        with pytest.raises(VersionConflict) as info:
            store.set_if("k", b"w", version='"0123456789abcdef0123456789abcdef"')
        assert [op for op, _ in sent] == ["PutObject"]  # botocore did not retry it
        assert "'k'" in str(info.value)
        assert "0123456789abcdef0123456789abcdef" in str(info.value)
        assert store.get_versioned("k") is not None
        assert store.stat("k").etag == version  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("code", "status"),
    [("PreconditionFailed", 412), ("ConditionalRequestConflict", 409), ("", 412)],
)
def test_error_table_maps_conditional_refusals_to_version_conflict(code: str, status: int) -> None:
    error = {"Error": {"Code": code}} if code else {}
    exc = ClientError({**error, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    translated = translate(exc, "s3://b/ at http://x", "k")
    assert isinstance(translated, VersionConflict)
    assert errno_of(translated) == errno.EAGAIN


# -- the probe ---------------------------------------------------------------------------------


def test_probe_against_moto_is_none_and_leaves_nothing(
    store: S3Store, client: Any, spec: S3Spec
) -> None:
    sent = _requests(store)
    assert store.probe_conditional_writes() is None
    assert [op for op, _ in sent] == ["PutObject"] * 3 + ["DeleteObject"]
    scratch = {headers.get("If-None-Match") for op, headers in sent if op == "PutObject"}
    assert scratch == {"*", None}
    assert _objects(client, spec.bucket) == []


def test_probe_through_a_proxy_dropping_conditions_says_why(
    s3_server: Any, s3_bucket: str, client: Any
) -> None:
    with dropping_conditions(s3_server.endpoint) as endpoint:
        spec = S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=endpoint)
        with S3Store.from_spec(spec) as store:
            reason = store.probe_conditional_writes()
            assert reason == (
                "the endpoint ignored If-None-Match: a second create-only PUT succeeded"
            )
            # and a conditional write through it indeed overwrites
            store.set_if("k", b"one", version=None)
            store.set_if("k", b"two", version=None)
            assert store.get("k") == b"two"
            store.delete("k")
    assert _objects(client, s3_bucket) == []


def test_proxy_forwards_large_values_heads_and_errors(
    s3_server: Any, s3_bucket: str, client: Any
) -> None:
    value = os.urandom(5 * MiB + 123)
    with dropping_conditions(s3_server.endpoint) as endpoint:
        spec = S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=endpoint)
        with S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB) as store:
            store.set("big", value)
            store.set("small", b"s")
            assert store.get("big") == value
            assert store.stat("big").size == len(value)  # type: ignore[union-attr]
            assert store.stat("absent") is None
            assert store.get("absent") is None
            assert store.list("").names() == ["big", "small"]
    assert client.get_object(Bucket=s3_bucket, Key=PREFIX + "big")["Body"].read() == value


def test_probe_answers_an_access_error_without_raising(spec: S3Spec, client: Any) -> None:
    missing = S3Spec(bucket="no-such-bucket-here", path=PREFIX, endpoint=spec.endpoint)
    with S3Store(missing) as store:
        reason = store.probe_conditional_writes()
    assert reason is not None
    assert reason.startswith("conditional writes could not be probed:")
    assert "NoSuchBucket" in reason


def test_read_only_store_answers_without_a_request(store: S3Store) -> None:
    sent = _requests(store)
    assert ReadOnlyStore(store).probe_conditional_writes() == (
        "read-only store: no conditional writes"
    )
    assert sent == []


def test_a_read_only_mount_of_a_shared_store_does_not_warn(
    s3_server: Any, s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Last-writer-wins is a warning for a mount that writes; a read-only one commits nothing."""
    with (
        dropping_conditions(s3_server.endpoint) as endpoint,
        S3Store(S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=endpoint)) as store,
        caplog.at_level("INFO", logger="n5fs.gateway.commit.conditional"),
    ):
        assert not Conditional.probe(ReadOnlyStore(store), wanted=True).in_force
        assert not Conditional.probe(store, wanted=True).in_force
    levels = [r.levelname for r in caplog.records if "no conditional writes" in r.getMessage()]
    assert levels == ["INFO", "WARNING"]


# -- the scratch object: hidden, and swept after a killed probe -------------------------------

_KILLED_PROBE = """
import os, sys
from n5fs.kvstore.s3 import S3Store
from n5fs.kvstore.spec import S3Spec

store = S3Store(S3Spec(bucket=sys.argv[1], path=sys.argv[2], endpoint=sys.argv[3]))
real = S3Store.set_if

def set_if_then_die(self, key, value, *, version):
    real(self, key, value, version=version)
    os._exit(9)  # killed mid-probe: the scratch object stays

S3Store.set_if = set_if_then_die
store.probe_conditional_writes()
"""


def test_a_killed_probe_leaves_a_hidden_object_that_sweep_removes(
    store: S3Store, client: Any, spec: S3Spec
) -> None:
    store.set("kept", b"k")
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_PROBE, spec.bucket, PREFIX, str(spec.endpoint)],
        capture_output=True,
        check=False,
    )
    assert child.returncode == 9, child.stderr.decode()
    left = [name for name in _objects(client, spec.bucket) if name != PREFIX + "kept"]
    assert len(left) == 1
    scratch = left[0][len(PREFIX) :]
    assert scratch.startswith(s3_conditional.SCRATCH_START)

    assert store.list("").names() == ["kept"]
    assert [info.key for info in store.walk("")] == ["kept"]
    (leftover,) = store.leftovers()
    assert (leftover.path, leftover.what, leftover.dead) == (scratch, "probe object", True)
    assert leftover.writer.startswith("pid ")
    assert store.leftovers("sub/") == ()

    assert store.sweep() == (leftover,)
    assert _objects(client, spec.bucket) == [PREFIX + "kept"]
    assert store.leftovers() == ()


def test_a_live_probers_scratch_object_is_not_swept(
    store: S3Store, client: Any, spec: S3Spec
) -> None:
    scratch = s3_conditional.scratch_key()  # this process: alive
    client.put_object(Bucket=spec.bucket, Key=PREFIX + scratch, Body=b"")
    assert store.list("").keys == ()
    (leftover,) = store.leftovers()
    assert (leftover.path, leftover.dead) == (scratch, False)
    assert store.sweep() == ()
    assert _objects(client, spec.bucket) == [PREFIX + scratch]
    store.remove_leftover(leftover)  # what `n5fs validate --clean` may still do
    assert _objects(client, spec.bucket) == []
