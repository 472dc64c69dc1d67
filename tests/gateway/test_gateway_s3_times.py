"""Kept times on a read-write S3 mount without a request per file: the times n5fs keeps are
also written to each folder's hidden times index, which the folder's LIST names, so a
reader of many files sends no HEAD, a time this mount set shows at once, and a time another
mount set shows once that mount wrote its index (``flush``: at most a second later, or its
``fsync``/unmount) and this one lists the folder again (its cache TTL).

Against the moto server through the counting proxy: the counts are the requests that
reached the endpoint."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from n5fs.errors import AccessDenied
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore.s3 import S3Store
from n5fs.kvstore.s3.times import INDEX_NAME
from n5fs.kvstore.spec import S3Spec
from n5fs.testing.s3_proxy import FaultProxy, fault_proxy

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.s3

PREFIX = "times/"
KEPT = 1_000_000_000.0  # 2001-09-09: what `touch -d` or `rsync -a` set
FOLDERS = ("a", "b", "c")
PER_FOLDER = 20


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint) as running:
        yield running


@pytest.fixture
def client(s3_server: Any) -> Any:
    return boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1")


@pytest.fixture
def files(client: Any, s3_bucket: str) -> list[str]:
    """Objects no one set a time on, put straight to the server (not counted)."""
    paths = []
    for folder in FOLDERS:
        for i in range(PER_FOLDER):
            client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}{folder}/f{i}", Body=b"x" * 100)
            paths.append(f"/{folder}/f{i}")
    return paths


def mount(proxy: FaultProxy, bucket: str, **config: Any) -> Gateway:
    store = S3Store(S3Spec(bucket=bucket, path=PREFIX, endpoint=proxy.endpoint))
    return Gateway(store, GatewayConfig(**config))


def index_of(client: Any, bucket: str, folder: str) -> dict[str, Any] | None:
    try:
        body = client.get_object(Bucket=bucket, Key=f"{PREFIX}{folder}{INDEX_NAME}")["Body"]
    except client.exceptions.NoSuchKey:
        return None
    files: dict[str, Any] = json.loads(body.read())["files"]
    return files


def keys_of(client: Any, bucket: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=PREFIX).get("Contents", ())
    return sorted(obj["Key"][len(PREFIX) :] for obj in listed)


@pytest.mark.parametrize("read_only", [True, False])
def test_reading_files_costs_a_get_each_and_no_head(
    proxy: FaultProxy, s3_bucket: str, files: list[str], read_only: bool
) -> None:
    """With the folders listed, N files read are N GETs on either mount: a read-write mount
    asks no HEAD for the kept time of a file no one set a time on."""
    gw = mount(proxy, s3_bucket, read_only=read_only)
    for folder in FOLDERS:
        gw.readdir(f"/{folder}")
    proxy.reset_counts()
    for path in files:
        assert gw.read_file(path) == b"x" * 100
        gw.stat(path)
    assert dict(proxy.counts) == {"GET": len(files)}
    gw.close()


def test_a_read_write_mount_lists_and_reads_as_a_read_only_one(
    proxy: FaultProxy, s3_bucket: str, files: list[str]
) -> None:
    """From cold, the same requests on both mounts (one LIST per folder, detection's probes,
    a GET per file): no HEAD, however many files."""
    counts = []
    for read_only in (True, False):
        gw = mount(proxy, s3_bucket, read_only=read_only)
        proxy.reset_counts()
        for path in files:
            gw.stat(path)
            assert gw.read_file(path) == b"x" * 100
        counts.append(dict(proxy.counts))
        gw.close()
    assert counts[0] == counts[1]
    assert "HEAD" not in counts[1]
    assert counts[1]["LIST"] == len(FOLDERS)


def test_a_time_this_mount_set_shows_without_a_head(
    proxy: FaultProxy, s3_bucket: str, files: list[str], client: Any
) -> None:
    gw = mount(proxy, s3_bucket)
    gw.utimens("/a/f1", KEPT)
    for _ in range(2):  # before its index is written, and after
        gw.view.clear()  # the listing expired: the folder is listed again
        proxy.reset_counts()
        assert gw.stat("/a/f1").mtime == KEPT
        assert gw.stat("/a/f2").mtime != KEPT
        assert dict(proxy.counts) == {"LIST": 1}  # no HEAD; our own index is not read back
        gw.store.flush()
    index = index_of(client, s3_bucket, "a/")
    assert index is not None
    assert list(index) == ["f1"]
    assert (index["f1"][0], index["f1"][2]) == ("1000000000.000000000", 100)
    assert index_of(client, s3_bucket, "b/") is None
    gw.close()


def test_another_mount_sees_the_time_once_written_and_listed_again(
    proxy: FaultProxy, s3_bucket: str, files: list[str]
) -> None:
    """Mount B sees A's time once A wrote its index (A's flush: within a second, or at its
    fsync or unmount) and B lists the folder again (B's cache TTL): one LIST and one GET of
    the folder's index, however many files it names; never a HEAD."""
    a, b = mount(proxy, s3_bucket), mount(proxy, s3_bucket)
    b.stat("/a/f1")
    a.utimens("/a/f1", KEPT)
    a.utimens("/a/f2", KEPT + 2)
    b.view.clear()
    assert b.stat("/a/f1").mtime != KEPT  # A's index not written yet: LastModified
    a.store.flush()
    assert b.stat("/a/f1").mtime != KEPT  # B's listing is still fresh
    b.view.clear()
    proxy.reset_counts()
    assert b.stat("/a/f1").mtime == KEPT
    assert b.stat("/a/f2").mtime == KEPT + 2
    assert b.stat("/a/f3").mtime != KEPT
    assert dict(proxy.counts) == {"LIST": 1, "GET": 1}
    b.view.clear()
    proxy.reset_counts()
    b.stat("/a/f1")
    assert dict(proxy.counts) == {"LIST": 1}  # the index is cached by its ETag
    a.close()
    b.close()


def test_new_bytes_show_their_own_time(
    proxy: FaultProxy, s3_bucket: str, files: list[str], client: Any
) -> None:
    """An entry holds while the object holds the bytes its time was set on: bytes another
    tool writes over it show LastModified."""
    a = mount(proxy, s3_bucket)
    a.utimens("/a/f1", KEPT)
    a.store.flush()
    client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}a/f1", Body=b"other bytes")
    b = mount(proxy, s3_bucket)
    assert b.stat("/a/f1").mtime != KEPT
    assert b.stat("/a/f1").size == len(b"other bytes")
    a.close()
    b.close()


def test_two_mounts_setting_times_in_one_folder_lose_none(
    proxy: FaultProxy, s3_bucket: str, files: list[str], client: Any
) -> None:
    """Each mount's index write is a compare-and-swap: B, which never read A's index, is
    refused, reads it and merges."""
    a, b = mount(proxy, s3_bucket), mount(proxy, s3_bucket)
    a.utimens("/a/f1", KEPT)
    b.utimens("/a/f2", KEPT + 2)
    a.store.flush()
    b.store.flush()
    assert set(index_of(client, s3_bucket, "a/") or {}) == {"f1", "f2"}
    c = mount(proxy, s3_bucket)
    assert (c.stat("/a/f1").mtime, c.stat("/a/f2").mtime) == (KEPT, KEPT + 2)
    for gw in (a, b, c):
        gw.close()


def test_rsync_a_through_a_temp_name_keeps_the_time_on_the_final_name(
    proxy: FaultProxy, s3_bucket: str, client: Any
) -> None:
    """rsync writes a temp file, closes it, sets its time, renames it: the index names the
    final file only, and a fresh mount shows its time without a HEAD."""
    gw = mount(proxy, s3_bucket)
    gw.mkdir("/d")
    for i in range(3):
        gw.write_file(f"/d/.f{i}.XYZ", b"copied")
        gw.utimens(f"/d/.f{i}.XYZ", KEPT + i)
        gw.rename(f"/d/.f{i}.XYZ", f"/d/f{i}")
    gw.close()  # unmount writes the index
    assert set(index_of(client, s3_bucket, "d/") or {}) == {"f0", "f1", "f2"}
    fresh = mount(proxy, s3_bucket)
    proxy.reset_counts()
    assert [fresh.stat(f"/d/f{i}").mtime for i in range(3)] == [KEPT, KEPT + 1, KEPT + 2]
    assert "HEAD" not in proxy.counts
    assert [name for name, _ in fresh.readdir("/d")] == ["f0", "f1", "f2"]
    fresh.close()


def test_removed_files_take_their_index_along(
    proxy: FaultProxy, s3_bucket: str, client: Any
) -> None:
    """The index keeps no folder alive: removing every file and the folder leaves no key."""
    gw = mount(proxy, s3_bucket)
    gw.mkdir("/d")
    gw.mkdir("/e")
    for folder in ("d", "e"):
        for i in range(2):
            gw.write_file(f"/{folder}/f{i}", b"data")
            gw.utimens(f"/{folder}/f{i}", KEPT)
    gw.store.flush()
    assert INDEX_NAME in {k.rpartition("/")[2] for k in keys_of(client, s3_bucket)}
    for i in range(2):
        gw.unlink(f"/d/f{i}")
        gw.unlink(f"/e/f{i}")
    gw.rmdir("/d")  # at once, with the folder
    assert keys_of(client, s3_bucket) == [f"e/{INDEX_NAME}"]
    gw.store.flush()  # "e" emptied without rmdir: at the index's next write
    assert keys_of(client, s3_bucket) == []
    gw.close()


def test_a_renamed_folder_keeps_its_times(proxy: FaultProxy, s3_bucket: str, client: Any) -> None:
    gw = mount(proxy, s3_bucket)
    gw.mkdir("/d")
    gw.write_file("/d/f", b"data")
    gw.utimens("/d/f", KEPT)
    gw.rename("/d", "/moved")
    gw.close()
    assert keys_of(client, s3_bucket) == ["moved/.n5fs-mtimes", "moved/f"]
    fresh = mount(proxy, s3_bucket)
    assert fresh.stat("/moved/f").mtime == KEPT
    assert fresh.lookup("/d") is None
    fresh.close()


def test_no_file_may_take_the_index_name(proxy: FaultProxy, s3_bucket: str) -> None:
    gw = mount(proxy, s3_bucket)
    with pytest.raises(AccessDenied):
        gw.write_file(f"/{INDEX_NAME}", b"{}")
    assert gw.lookup(f"/{INDEX_NAME}") is None
    gw.close()


def test_a_chunk_walk_shows_the_kept_times(proxy: FaultProxy, s3_bucket: str, client: Any) -> None:
    """An array's chunk folders are answered from one flat listing: the indexes it names
    apply to the chunks after them."""
    zarray = {
        "zarr_format": 2,
        "shape": [4, 4],
        "chunks": [1, 4],
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
        "dimension_separator": "/",
    }
    client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}arr/.zarray", Body=json.dumps(zarray))
    for i in range(4):
        client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}arr/{i}/0", Body=b"\x01" * 4)
    a = mount(proxy, s3_bucket)
    for i in range(4):
        a.utimens(f"/arr/{i}/0", KEPT + i)
    a.close()
    b = mount(proxy, s3_bucket)
    proxy.reset_counts()
    assert [b.stat(f"/arr/{i}/0").mtime for i in range(4)] == [KEPT + i for i in range(4)]
    assert "HEAD" not in proxy.counts
    assert proxy.counts["GET"] >= 4  # an index per chunk folder
    b.close()


def test_mtime_head_still_asks_every_file(
    proxy: FaultProxy, s3_bucket: str, files: list[str], client: Any
) -> None:
    """``-o mtime=head`` reads each object's metadata: times another tool (rclone) set."""
    head = client.head_object(Bucket=s3_bucket, Key=f"{PREFIX}a/f1")
    client.copy_object(
        Bucket=s3_bucket,
        Key=f"{PREFIX}a/f1",
        CopySource={"Bucket": s3_bucket, "Key": f"{PREFIX}a/f1"},
        Metadata={**head.get("Metadata", {}), "mtime": "1000000000.5"},
        MetadataDirective="REPLACE",
    )
    kept = mount(proxy, s3_bucket)
    asks = mount(proxy, s3_bucket, mtime="head")
    assert kept.stat("/a/f1").mtime != KEPT + 0.5  # not an n5fs mount's: not in an index
    proxy.reset_counts()
    assert asks.stat("/a/f1").mtime == KEPT + 0.5
    assert proxy.counts["HEAD"] == 1
    kept.close()
    asks.close()


def test_fsync_writes_the_index(proxy: FaultProxy, s3_bucket: str, client: Any) -> None:
    gw = mount(proxy, s3_bucket)
    fh = gw.create("/g")
    gw.write(fh, b"data", 0)
    gw.utimens("/g", KEPT)
    gw.fsync(fh)
    assert set(index_of(client, s3_bucket, "") or {}) == {"g"}
    gw.release(fh)
    gw.close()
