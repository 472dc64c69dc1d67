"""Many mounts, one bucket: three real n5fs daemons over one prefix of one bucket on the moto
server (which honours ``If-Match``/``If-None-Match`` on PutObject), each a node of a cluster.
Writers are zarr-python and plain file writes through the mounts; what landed is checked in
the bucket with boto3 and ``n5fs validate``. The gateway-level twins of these tests (exact
interleavings) are in ``test_gateway_many_mounts.py``.
"""

from __future__ import annotations

import errno
import json
import subprocess
import threading
from pathlib import Path

import pytest

from n5fs.testing.s3_proxy import dropping_conditions
from tests.bucket import held, source, validate_clean
from tests.mounting import real_mount

pytestmark = [pytest.mark.s3, pytest.mark.slow, *real_mount(600)]

#: zarr-python creations per node in the three-node test: each rewrites the consolidated root,
#: so 30 in all race for it (60 took 32 s of the suite's time)
ARRAYS_PER_NODE = 10

ZARRAY = {
    "zarr_format": 2,
    "shape": [16],
    "chunks": [4],
    "dtype": "|u1",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}


def nodes(mounter, endpoint: str, bucket: str, count: int = 3) -> list[Path]:
    return [mounter.daemon(source(endpoint, bucket), name=f"node{i}") for i in range(count)]


def stored(client, bucket: str, key: str) -> bytes:
    body = held(client, bucket, key)
    assert body is not None, key
    return body


def test_arrays_created_on_three_nodes_all_reach_the_consolidated_root(
    mounter, s3_server, s3_bucket
) -> None:
    zarr = pytest.importorskip("zarr")
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="data/.zgroup", Body=b'{"zarr_format": 2}')
    client.put_object(
        Bucket=s3_bucket,
        Key="data/.zmetadata",
        Body=json.dumps(
            {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}
        ).encode(),
    )
    mps = nodes(mounter, s3_server.endpoint, s3_bucket)
    failures: list[BaseException] = []

    def create(i: int) -> None:
        try:
            for j in range(ARRAYS_PER_NODE):
                zarr.create_array(
                    store=str(mps[i]),
                    name=f"n{i}_{j}",
                    shape=(8,),
                    chunks=(4,),
                    dtype="u1",
                    zarr_format=2,
                    compressors=None,
                )
        except Exception as exc:  # noqa: BLE001 (reported below: any failure fails the test)
            failures.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert failures == []
    entries = json.loads(stored(client, s3_bucket, ".zmetadata"))["metadata"]
    arrays = {key for key in entries if key.endswith("/.zarray")}
    assert arrays == {f"n{i}_{j}/.zarray" for i in range(3) for j in range(ARRAYS_PER_NODE)}
    validate_clean(s3_server.endpoint, s3_bucket)


def test_workers_write_chunks_the_moment_the_controller_creates_the_array(
    mounter, s3_server, s3_bucket
) -> None:
    s3_server.client().put_object(Bucket=s3_bucket, Key="data/arr/README", Body=b"soon an array")
    controller, worker1, worker2 = nodes(mounter, s3_server.endpoint, s3_bucket)
    for worker in (worker1, worker2):  # both cache the folder as plain (TTL 5 s)
        assert sorted(p.name for p in (worker / "arr").iterdir()) == ["README"]
        assert not (worker / "arr" / ".zarray").exists()
    (controller / "arr" / ".zarray").write_bytes(json.dumps(ZARRAY).encode())
    (worker1 / "arr" / "0").write_bytes(b"abcd")
    with pytest.raises(OSError) as refused:
        (worker2 / "arr" / "1").write_bytes(b"not a 4-byte chunk")
    assert refused.value.errno == errno.EINVAL
    (worker2 / "arr" / "2").write_bytes(b"efgh")
    rejections = (worker2 / ".n5fs" / "rejections").read_text()
    assert "/arr/1" in rejections
    for worker in (worker1, worker2):  # write-back: the accepted chunks are uploaded behind
        synced = mounter.cli("sync", str(worker))
        assert synced.returncode == 0, synced.stderr
    keys = {obj["Key"] for obj in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert "data/arr/1" not in keys
    assert {"data/arr/0", "data/arr/2"} <= keys
    validate_clean(s3_server.endpoint, s3_bucket)


def test_concurrent_metadata_updates_from_two_nodes_lose_nothing(
    mounter, s3_server, s3_bucket
) -> None:
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="data/arr/.zarray", Body=json.dumps(ZARRAY).encode())
    client.put_object(Bucket=s3_bucket, Key="data/arr/.zattrs", Body=b"{}")
    a, b = nodes(mounter, s3_server.endpoint, s3_bucket, count=2)
    with open(a / "arr" / ".zattrs", "r+b") as fa, open(b / "arr" / ".zattrs", "r+b") as fb:
        base_a, base_b = json.loads(fa.read()), json.loads(fb.read())  # both read version 1
        fa.seek(0)
        fa.write(json.dumps({**base_a, "from_a": 1}).encode())
        fa.flush()
        fb.seek(0)
        fb.write(json.dumps({**base_b, "from_b_longer": 2}).encode())
        fa.close()  # a commits first
        with pytest.raises(OSError) as lost:
            fb.close()  # b's base is stale: refused, nothing stored
    assert lost.value.errno == errno.EAGAIN
    assert json.loads(stored(client, s3_bucket, "arr/.zattrs")) == {"from_a": 1}
    # the retry: read again, change, write: both updates are there
    current = json.loads((b / "arr" / ".zattrs").read_bytes())
    (b / "arr" / ".zattrs").write_bytes(json.dumps({**current, "from_b_longer": 2}).encode())
    assert json.loads(stored(client, s3_bucket, "arr/.zattrs")) == {
        "from_a": 1,
        "from_b_longer": 2,
    }
    # a resize from a node that has not seen the other's resize is refused the same way
    assert json.loads((a / "arr" / ".zarray").read_bytes())["shape"] == [16]
    assert json.loads((b / "arr" / ".zarray").read_bytes())["shape"] == [16]
    (a / "arr" / ".zarray").write_bytes(json.dumps({**ZARRAY, "shape": [32]}).encode())
    with pytest.raises(OSError) as lost:
        (b / "arr" / ".zarray").write_bytes(json.dumps({**ZARRAY, "shape": [8]}).encode())
    assert lost.value.errno == errno.EAGAIN
    assert json.loads(stored(client, s3_bucket, "arr/.zarray"))["shape"] == [32]
    assert "stale-version" in (b / ".n5fs" / "rejections").read_text()
    validate_clean(s3_server.endpoint, s3_bucket)


def test_an_endpoint_that_ignores_conditions_is_announced(mounter, s3_server, s3_bucket) -> None:
    with dropping_conditions(s3_server.endpoint) as endpoint:
        mp = mounter.mountpoint("ignoring")
        mounted = mounter.cli("mount", source(endpoint, s3_bucket), str(mp))
        assert mounted.returncode == 0, mounted.stderr
        assert "no conditional writes" in mounted.stderr  # said at the terminal
        stats = json.loads((mp / ".n5fs" / "stats.json").read_text())
        assert stats["conditional_writes"].startswith("off: ")
        assert "If-None-Match" in stats["conditional_writes"]
        status = mounter.cli("status")
        assert "conditional writes off" in status.stdout, status.stdout
        log = next(mounter.tmp.glob("state/*.log")).read_text()
        assert "no conditional writes" in log
        # the mount still works as a single writer
        (mp / "arr").mkdir()
        (mp / "arr" / ".zarray").write_bytes(json.dumps(ZARRAY).encode())
        (mp / "arr" / "0").write_bytes(b"abcd")
        subprocess.run(["fusermount3", "-u", str(mp)], check=False, capture_output=True)
    good = mounter.daemon(source(s3_server.endpoint, s3_bucket), name="honouring")
    stats = json.loads((good / ".n5fs" / "stats.json").read_text())
    assert stats["conditional_writes"] == "in force"
    assert stats["consistency"] == "ttl"
