"""Faults through real mounts: long names, a daemon killed mid-commit, too-deep JSON, and
``rsync -a`` that becomes incremental once modification times are kept."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from n5fs.kvstore.tempnames import PARTIAL_SUFFIX
from n5fs.testing.s3_proxy import fault_proxy
from tests.mounting import wait_until

pytestmark = pytest.mark.fuse


def partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


def test_names_up_to_name_max_are_stored(mounter, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    mp = mounter.daemon(str(src))
    for length in (209, 230, 250, 255):
        name = "n" * length
        with open(mp / name, "wb") as f:
            f.write(b"x" * length)  # the commit happens at close(): it must not fail
        assert (src / name).read_bytes() == b"x" * length
    assert partials(src) == []


def test_killed_daemon_leaves_nothing_that_blocks_or_survives(mounter, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "big").mkdir(parents=True)
    mp = mounter.daemon(str(src))
    pid = mounter.pid(mp)
    # a writer process: 384 MiB of data without holes, then close(), which commits (the
    # daemon copies the staged file into a temp file beside the key); the daemon is killed
    # while that temp file exists
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys\n"
                "with open(sys.argv[1], 'wb') as f:\n"
                "    for _ in range(384): f.write(bytes(range(256)) * 4096)"
            ),
            str(mp / "big" / "file"),
        ],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not partials(src) and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    writer.wait(timeout=60)
    assert partials(src), "the commit finished before the kill; make the file larger"
    subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=False)
    mp2 = mounter.daemon(str(src), name="mnt2")
    assert os.listdir(mp2 / "big") in ([], ["file"])  # the temp file never shows
    wait_until(lambda: not partials(src), "the new mount removes the dead writer's temp file")
    shutil.rmtree(mp2 / "big")  # rm -r works
    assert not (src / "big").exists()
    stats = json.loads((mp2 / ".n5fs" / "stats.json").read_text())
    assert stats["leftovers_removed"] >= 1


def test_too_deep_attributes_are_einval_and_listed(mounter, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "g").mkdir(parents=True)
    (src / "g" / ".zgroup").write_text('{"zarr_format": 2}')
    mp = mounter.daemon(str(src))
    depth = 5000
    with pytest.raises(OSError) as info, open(mp / "g" / ".zattrs", "w") as f:
        f.write('{"a": ' + "[" * depth + "]" * depth + "}")
    assert info.value.errno == errno.EINVAL
    lines = (mp / ".n5fs" / "rejections").read_text().splitlines()
    assert [json.loads(line)["rule"] for line in lines] == ["json-depth"]
    assert not (src / "g" / ".zattrs").exists()


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_a_twice_copies_nothing_the_second_time(mounter, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "arr").mkdir(parents=True)
    for i in range(20):
        (data / "arr" / str(i)).write_bytes(os.urandom(1000 + i))
    (data / "README").write_text("hello\n")
    old = time.time() - 86400
    for path in data.rglob("*"):
        os.utime(path, (old, old))
    src = tmp_path / "src"
    src.mkdir()
    mp = mounter.daemon(str(src))

    def rsync() -> str:
        out = subprocess.run(
            ["rsync", "-a", "--stats", f"{data}/", f"{mp}/"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

    first = rsync()
    assert "Number of regular files transferred: 21" in first
    assert os.stat(mp / "arr" / "3").st_mtime == pytest.approx(old, abs=1e-3)
    assert os.stat(src / "arr" / "3").st_mtime == pytest.approx(old, abs=1e-3)
    second = rsync()
    assert "Number of regular files transferred: 0" in second, second
    subprocess.run(["touch", "-d", "2001-02-03 04:05:06", str(mp / "README")], check=True)
    assert time.gmtime(os.stat(src / "README").st_mtime)[:3] == (2001, 2, 3)


# -- S3 ----------------------------------------------------------------------------------------


def s3_source(server, bucket: str) -> str:
    spec = {"driver": "s3", "bucket": bucket, "path": "data/", "endpoint": server.endpoint}
    return json.dumps(spec)


@pytest.mark.s3
@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_a_into_s3_keeps_times(mounter, tmp_path: Path, s3_server, s3_bucket) -> None:
    data = tmp_path / "data"
    data.mkdir()
    old = time.time() - 86400 * 3
    for i in range(5):
        (data / f"f{i}").write_bytes(os.urandom(500))
        os.utime(data / f"f{i}", (old, old))
    mp = mounter.daemon(s3_source(s3_server, s3_bucket), "--cache-ttl", "0.5")
    args = ["rsync", "-a", "--stats", f"{data}/", f"{mp}/"]
    first = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "Number of regular files transferred: 5" in first
    head = s3_server.client().head_object(Bucket=s3_bucket, Key="data/f3")
    assert float(head["Metadata"]["mtime"]) == pytest.approx(old, abs=1e-3)
    time.sleep(1.5)  # every cached listing and kernel attribute has expired
    second = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "Number of regular files transferred: 0" in second, second


@pytest.mark.s3
@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_a_again_through_a_fresh_s3_mount_copies_nothing_and_sends_no_head(
    mounter, tmp_path: Path, s3_server, s3_bucket
) -> None:
    """The times the first ``rsync -a`` kept reach a fresh mount (its folders' times
    indexes, written by the first mount at unmount): the second run transfers nothing, and
    its quick check (a stat of every file) asks the endpoint no HEAD."""
    data = tmp_path / "data"
    old = time.time() - 86400 * 3
    for folder in ("a", "b", "b/c"):
        (data / folder).mkdir(parents=True)
        for i in range(4):
            (data / folder / f"f{i}").write_bytes(os.urandom(300))
            os.utime(data / folder / f"f{i}", (old + i, old + i))
    with fault_proxy(s3_server.endpoint) as proxy:
        spec = {"driver": "s3", "bucket": s3_bucket, "path": "data/", "endpoint": proxy.endpoint}
        source = json.dumps(spec)

        def rsync(mp: Path) -> str:
            args = ["rsync", "-a", "--itemize-changes", "--stats", f"{data}/", f"{mp}/"]
            return subprocess.run(args, capture_output=True, text=True, check=True).stdout

        first_mp = mounter.daemon(source, name="first")
        assert "Number of regular files transferred: 12" in rsync(first_mp)
        assert mounter.cli("unmount", str(first_mp)).returncode == 0
        second_mp = mounter.daemon(source, name="second")
        proxy.reset_counts()
        second = rsync(second_mp)
        assert "Number of regular files transferred: 0" in second, second
        assert not [line for line in second.splitlines() if line.startswith(">f")], second
        assert proxy.counts["HEAD"] == 0, dict(proxy.counts)


@pytest.mark.s3
@pytest.mark.parametrize("writeback", ["off", "on"])
def test_killed_daemon_leaves_no_multipart_upload(
    mounter, tmp_path: Path, s3_server, s3_bucket, writeback: str
) -> None:
    """A daemon killed mid multipart upload: the next mount aborts the upload. Without
    write-back the file was never acknowledged (its close() was the upload) and is absent;
    with it, close() had returned, so the next mount uploads it from the journal."""
    source = s3_source(s3_server, s3_bucket)
    mp = mounter.daemon(source, "-o", f"writeback={writeback}")
    pid = mounter.pid(mp)
    journal = tmp_path / "state" / "uploads"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys\n"
                "with open(sys.argv[1], 'wb') as f:\n"
                "    for _ in range(256): f.write(bytes(range(256)) * 4096)"
            ),
            str(mp / "big"),
        ],
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: any(journal.glob("*.uploads")), "the daemon starts a multipart upload")
    os.kill(pid, signal.SIGKILL)
    writer.wait(timeout=60)
    subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=False)
    client = s3_server.client()
    uploads = client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["data/big"], "the kill left no upload behind"
    dead = {u["UploadId"] for u in uploads}
    mp2 = mounter.daemon(source, "-o", f"writeback={writeback}", name="mnt2")
    wait_until(
        lambda: all(
            u["Key"] != "data/big" or u["UploadId"] not in dead
            for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
        ),
        "the new mount aborts the dead daemon's upload",
    )
    if writeback == "off":
        assert "big" not in os.listdir(mp2)
        return
    assert writer.returncode == 0  # its close() was accepted
    synced = mounter.cli("sync", str(mp2))
    assert synced.returncode == 0, synced.stderr
    body = client.get_object(Bucket=s3_bucket, Key="data/big")["Body"].read()
    assert body == bytes(range(256)) * 4096 * 256
    assert not any((tmp_path / "state" / "writeback").glob("*/*.put"))


class SilencingProxy:
    """A TCP proxy to the S3 server that can go silent: it then keeps every connection open
    and never answers (what a hung endpoint or a black-holed network looks like)."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.silent = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.silent.is_set():
                continue  # held open, never answered
            upstream = socket.create_connection(self.target)
            self.sockets.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.silent.is_set():
                    return  # swallow: the request is never answered
                dst.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.server.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.mark.s3
def test_silent_s3_endpoint_answers_eio_in_bounded_time(
    mounter, tmp_path: Path, s3_server, s3_bucket
) -> None:
    client = s3_server.client()
    for i in range(3):
        client.put_object(Bucket=s3_bucket, Key=f"data/d{i}/k", Body=b"x")
    proxy = SilencingProxy(s3_server.endpoint)
    try:
        spec = {"driver": "s3", "bucket": s3_bucket, "path": "data/", "endpoint": proxy.endpoint}
        # a read timeout of 1 s, not the default 4 s: the same attempts and breaker, the
        # same EIO, in a quarter of the wait (the defaults cost each call ~8 s a probe)
        spec["read_timeout"] = 1.0
        mp = mounter.daemon(json.dumps(spec), "--cache-ttl", "0")
        assert {"d0", "d1", "d2"} <= set(os.listdir(mp))
        proxy.silent.set()
        outcome: dict[str, object] = {}

        def call(name: str, action: Callable[[], object]) -> None:
            start = time.monotonic()
            try:
                action()
                outcome[name] = "answered"
            except OSError as exc:
                outcome[name] = exc.errno
            print(f"{name} on a silent endpoint: {time.monotonic() - start:.1f} s")

        workers = [
            threading.Thread(target=call, args=args, daemon=True)
            for args in (
                ("listdir", lambda: os.listdir(mp / "d1")),
                ("stat", lambda: os.stat(mp / "d2" / "absent")),
                ("read", lambda: (mp / "d0" / "k").read_bytes()),
            )
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)  # a hang check, not a speed assertion
        assert outcome == {"listdir": errno.EIO, "stat": errno.EIO, "read": errno.EIO}
    finally:
        proxy.silent.clear()
        proxy.close()


def test_the_control_folder_does_not_travel(mounter, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "g").mkdir(parents=True)
    (src / "g" / ".zgroup").write_text('{"zarr_format": 2}')
    mp = mounter.daemon(str(src))
    assert ".n5fs" not in os.listdir(mp)
    assert (mp / ".n5fs" / "stats.json").is_file()  # reachable by its path
    shutil.copytree(mp, tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["g"]
    listing = subprocess.run(
        ["tar", "-C", str(mp), "-cf", "-", "."], capture_output=True, check=True
    ).stdout
    assert b".n5fs" not in listing
