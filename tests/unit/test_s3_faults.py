"""S3 faults a mount must survive: an endpoint that never answers (EIO within a bounded time,
never a hang), and a writer killed in the middle of a multipart upload (its upload is aborted
by the next sweep, while a live writer's upload stays).

The S3 server is the session's moto server over HTTP; the unresponsive endpoint is a real TCP
listener on 127.0.0.1 that accepts connections and never sends a byte. No test asserts a
duration: a call that has not returned after a generous watchdog fails as a hang.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from n5fs.cli.config import ConfigError, S3Settings, parse_config, take_s3_options, with_s3
from n5fs.cli.main import build_parser
from n5fs.errors import InvalidSource, ReadOnly, StoreUnavailable, errno_of
from n5fs.kvstore import tempnames
from n5fs.kvstore.s3 import MiB, S3Store
from n5fs.kvstore.s3 import uploads as s3_uploads
from n5fs.kvstore.s3.uploads import Upload, UploadJournal
from n5fs.kvstore.spec import S3Spec, parse_spec
from n5fs.kvstore.wrappers import ReadOnlyStore
from tests import REPO_ROOT

pytestmark = pytest.mark.s3

PREFIX = "root/"
#: a call still running after this long hangs (the budget is ~12 s per request)
WATCHDOG = 60.0


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Journals go to a directory of the test, never to the user's."""
    path = tmp_path / "state"
    monkeypatch.setenv("N5FS_STATE_DIR", str(path))
    return path


@pytest.fixture(scope="module")
def client(s3_server: Any) -> Any:
    return s3_server.client()


@pytest.fixture
def spec(s3_server: Any, s3_bucket: str) -> S3Spec:
    return S3Spec(bucket=s3_bucket, path=PREFIX, endpoint=s3_server.endpoint)


@pytest.fixture
def store(spec: S3Spec) -> Iterator[S3Store]:
    with S3Store(spec) as opened:
        yield opened


# == an endpoint that accepts and never answers =================================================


class SilentServer:
    """A TCP listener on 127.0.0.1 that accepts every connection, holds it, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.held: list[socket.socket] = []
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def _run_watched(calls: dict[str, Callable[[], object]]) -> dict[str, BaseException | None]:
    """Run each call in its own thread (all at once); fail if one has not returned after
    :data:`WATCHDOG` seconds; print how long each took. Returns what each raised."""
    raised: dict[str, BaseException | None] = {}
    took: dict[str, float] = {}

    def run(name: str, call: Callable[[], object]) -> None:
        start = time.monotonic()
        try:
            call()
            raised[name] = None
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            raised[name] = exc
        took[name] = time.monotonic() - start

    threads = [
        threading.Thread(target=run, args=item, daemon=True, name=f"watched-{item[0]}")
        for item in calls.items()
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WATCHDOG
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        pytest.fail(f"still waiting on an unresponsive endpoint after {WATCHDOG:g} s: {hung}")
    print("seconds until EIO:", {name: round(t, 2) for name, t in sorted(took.items())})
    return raised


@pytest.mark.slow
def test_unresponsive_endpoint_answers_eio_not_a_hang(silent: SilentServer) -> None:
    """With the default timeouts, opening, reading and listing each fail with EIO."""
    spec = S3Spec(bucket="bkt1", path="p/", endpoint=silent.endpoint)
    stores = [S3Store(spec), S3Store(spec)]
    raised = _run_watched(
        {
            "from_spec": lambda: S3Store.from_spec(spec),
            "get": lambda: stores[0].get("a/0.0"),
            "list": lambda: stores[1].list("a/"),
        }
    )
    for name, exc in raised.items():
        assert isinstance(exc, StoreUnavailable), (name, exc)
        assert errno_of(exc) == errno.EIO
        assert isinstance(exc.__cause__, ReadTimeoutError), (name, exc.__cause__)
        assert silent.endpoint in str(exc)
    assert silent.accepted >= 3 * spec.max_attempts  # each call retried on a new connection
    for opened in stores:
        opened.close()


def test_timeouts_and_retries_come_from_the_spec(silent: SilentServer) -> None:
    spec = S3Spec(
        bucket="bkt1",
        endpoint=silent.endpoint,
        connect_timeout=0.5,
        read_timeout=0.25,
        max_retries=0,
    )
    store = S3Store(spec)
    config = store.client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (0.5, 0.25)
    assert config.retries["total_max_attempts"] == 1
    raised = _run_watched({"get": lambda: store.get("k")})
    assert isinstance(raised["get"], StoreUnavailable)
    assert silent.accepted == 1  # no retry
    store.close()


# == the S3 knobs from the command line, -o options and the config file ===========================


def test_s3_flags_and_options_reach_the_spec() -> None:
    argv = ["mount", "s3://b/p/", "/mnt", "-o", "ro,s3_retries=3,uid=5,fsname=a\\,b"]
    args = build_parser().parse_args(
        [*argv, "-o", "s3_read_timeout=9", "--s3-connect-timeout", "1.5"]
    )
    from n5fs.cli.commands import source_from_args

    spec = parse_spec(source_from_args(args))
    assert isinstance(spec, S3Spec)
    assert (spec.connect_timeout, spec.read_timeout, spec.max_retries) == (1.5, 9.0, 3)
    assert args.options == ["ro,uid=5,fsname=a\\,b"]  # libfuse never sees the s3_ options

    args = build_parser().parse_args(["detect", "s3://b/p/", "--s3-retries", "0"])
    spec = parse_spec(source_from_args(args))
    assert isinstance(spec, S3Spec)
    assert spec.max_retries == 0
    args = build_parser().parse_args([*argv, "--s3-retries", "1"])
    assert parse_spec(source_from_args(args)) == S3Spec(bucket="b", path="p/")  # flag beats -o


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--s3-read-timeout", "0"], "more than 0 seconds"),
        (["--s3-connect-timeout", "soon"], "cannot read 'soon' as seconds"),
        (["--s3-retries", "-1"], "whole number"),
        (["--s3-retries", "99"], "between 0 and 20"),
    ],
)
def test_bad_s3_flags_are_refused(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["detect", "s3://b/", *argv])
    assert words in capsys.readouterr().err


def test_s3_options_need_an_s3_source_and_good_values() -> None:
    with pytest.raises(InvalidSource, match="-o s3_read_timeout: cannot read 'x'"):
        take_s3_options(["s3_read_timeout=x"])
    kept, settings = take_s3_options(["s3_retries=2", "allow_other", "s3_retries=4"])
    assert (kept, settings) == (["allow_other"], S3Settings(retries=4))
    with pytest.raises(ConfigError, match="not on S3"):
        with_s3("/data/vol", settings, "command line")


def test_s3_timeouts_in_the_config_file() -> None:
    doc = {
        "source": "s3://b/vol/",
        "s3": {"connect_timeout": 1, "read_timeout": "2.5", "retries": 0},
    }
    config = parse_config(doc, "x.toml")
    assert config.s3 == S3Settings(connect_timeout=1.0, read_timeout=2.5, retries=0)
    assert config.source is not None
    spec = parse_spec(with_s3(config.source, config.s3, "x.toml"))
    assert isinstance(spec, S3Spec)
    assert (spec.connect_timeout, spec.read_timeout, spec.max_retries) == (1.0, 2.5, 0)
    for key, value, words in (
        ("retries", 1.5, "whole number"),
        ("read_timeout", -1, "more than 0"),
        ("read_timout", 1, "did you mean 'read_timeout'"),
    ):
        with pytest.raises(ConfigError, match=f"s3.{key}: .*{words}"):
            parse_config({"s3": {key: value}}, "x.toml")


# == multipart uploads: the journal and the sweep =================================================


def _dead_writer() -> tempnames.Writer:
    """A writer of this host whose process has ended (spawned and reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    writer = dataclasses.replace(tempnames.current(), pid=proc.pid, start="1")
    assert tempnames.liveness(writer) is tempnames.Liveness.DEAD
    return writer


def _initiated(client: Any, bucket: str) -> float:
    """When the uploads in ``bucket`` began, by the server's clock (all at once, give or take
    a second)."""
    uploads = client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    times = {round(up["Initiated"].timestamp()) for up in uploads}
    assert max(times) - min(times) <= 2, times
    return float(min(times))


def _upload_ids(client: Any, bucket: str) -> dict[str, str]:
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return {up["UploadId"]: up["Key"] for up in uploads}


def test_sweep_aborts_a_dead_writers_upload_and_keeps_a_live_ones(
    store: S3Store, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, journal = store.spec.bucket, UploadJournal()
    dead = _dead_writer()
    dead_id = client.create_multipart_upload(Bucket=bucket, Key=PREFIX + "dead/0.0")["UploadId"]
    journal.record(Upload(bucket, PREFIX + "dead/0.0", dead_id), writer=dead)
    # started through the store's client: its hooks journal it for this (live) process
    live = store.client.create_multipart_upload(Bucket=bucket, Key=PREFIX + "live/0.0")
    # in no journal of this host and fresh: perhaps a live writer elsewhere
    other_id = client.create_multipart_upload(Bucket=bucket, Key=PREFIX + "other")["UploadId"]
    outside_id = client.create_multipart_upload(Bucket=bucket, Key="elsewhere")["UploadId"]
    mine = journal.file_of(tempnames.current())
    assert Upload(bucket, PREFIX + "live/0.0", live["UploadId"]).line() in mine.read_text()
    # the server's clock says when they began (moto's is a constant): age them by it
    began = _initiated(client, bucket)
    monkeypatch.setattr(s3_uploads, "now", lambda: began + 60)

    found = store.leftovers()
    assert [(lo.path, lo.what, lo.dead) for lo in found] == [
        ("dead/0.0", "multipart upload", True),
        ("live/0.0", "multipart upload", False),
        ("other", "multipart upload", False),
    ]
    assert found[0].writer == str(dead)
    assert found[1].writer == str(tempnames.current())
    assert "no journal" in found[2].writer
    assert all(abs(lo.mtime - began) <= 2 for lo in found)
    assert ReadOnlyStore(store).leftovers() == found  # validate opens stores read-only
    with pytest.raises(ReadOnly):
        ReadOnlyStore(store).sweep()

    removed = store.sweep()
    assert [lo.path for lo in removed] == ["dead/0.0"]
    assert set(_upload_ids(client, bucket)) == {live["UploadId"], other_id, outside_id}
    assert not journal.file_of(dead).exists()

    # a day later, the upload in no journal counts as dead too; a live writer's never does
    monkeypatch.setattr(s3_uploads, "now", lambda: began + tempnames.STALE_AFTER + 60)
    assert [lo.path for lo in store.sweep()] == ["other"]
    assert set(_upload_ids(client, bucket)) == {live["UploadId"], outside_id}

    # ending the upload through the store's client takes it out of the journal
    store.client.abort_multipart_upload(
        Bucket=bucket, Key=PREFIX + "live/0.0", UploadId=live["UploadId"]
    )
    assert not mine.exists()


def test_remove_leftover_from_another_store_object(spec: S3Spec, client: Any) -> None:
    journal = UploadJournal()
    upload_id = client.create_multipart_upload(Bucket=spec.bucket, Key=PREFIX + "k")["UploadId"]
    journal.record(Upload(spec.bucket, PREFIX + "k", upload_id), writer=_dead_writer())
    with S3Store(spec) as reporter, S3Store(spec) as remover:
        (leftover,) = reporter.leftovers()
        remover.remove_leftover(leftover)
    assert _upload_ids(client, spec.bucket) == {}
    assert journal.writers() == {}


def test_sweep_forgets_dead_writers_uploads_that_are_gone(store: S3Store, client: Any) -> None:
    """Journal lines of a dead writer whose uploads completed (it died before forgetting
    them) go at the next sweep of their prefix; lines elsewhere wait for their own sweep."""
    bucket, journal, dead = store.spec.bucket, UploadJournal(), _dead_writer()
    journal.record(Upload(bucket, PREFIX + "done", "completed-long-ago"), writer=dead)
    journal.record(Upload(bucket, "other-prefix/x", "not-ours-to-judge"), writer=dead)
    journal.record(Upload("other-bucket", PREFIX + "x", "another-bucket"), writer=dead)
    with journal.file_of(dead).open("a") as f:
        f.write('{"bucket": "torn\n')  # a line a kill cut short
    assert store.sweep() == ()
    assert journal.writers() == {
        dead: {
            Upload(bucket, "other-prefix/x", "not-ours-to-judge"),
            Upload("other-bucket", PREFIX + "x", "another-bucket"),
        }
    }
    assert "torn" not in journal.file_of(dead).read_text()


def test_multipart_set_is_journaled_while_in_flight(spec: S3Spec, client: Any) -> None:
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB)
    mine = UploadJournal().file_of(tempnames.current())
    seen: list[str] = []

    def look(**_: Any) -> None:
        seen.append(mine.read_text())

    store.client.meta.events.register("before-send.s3.UploadPart", look)
    store.set("big", b"v" * (11 * MiB))
    assert len(seen) == 3
    assert all(f'"key": "{PREFIX}big"' in text for text in seen)
    assert not mine.exists()  # completed: forgotten
    store.close()


_CHILD = """
import sys, time
from n5fs.kvstore.s3 import MiB, S3Store
from n5fs.kvstore.spec import S3Spec

bucket, endpoint, path = sys.argv[1:4]
spec = S3Spec(bucket=bucket, path="root/", endpoint=endpoint)
store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB)

def stall(params, **_):
    if params["PartNumber"] > 1:
        time.sleep(300)  # the parent kills us meanwhile

store.client.meta.events.register("provide-client-params.s3.UploadPart", stall)
store.put_file("big/file", path)
print("finished")
"""


def test_kill_9_during_put_file_leaves_an_upload_the_next_sweep_aborts(
    store: S3Store, client: Any, tmp_path: Path, state_dir: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(16 * MiB))
    bucket = store.spec.bucket
    endpoint = store.client.meta.endpoint_url
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, bucket, endpoint, str(big)],
        cwd=REPO_ROOT,
        env={**os.environ, "N5FS_STATE_DIR": str(state_dir)},
    )
    try:
        journaled = _wait_for_journal(state_dir / "uploads", proc)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9
    (upload,) = journaled
    assert _upload_ids(client, bucket) == {upload.upload_id: PREFIX + "big/file"}

    (removed,) = store.sweep()
    assert (removed.path, removed.dead) == ("big/file", True)
    assert f"pid {proc.pid}" in removed.writer
    assert _upload_ids(client, bucket) == {}
    assert UploadJournal().writers() == {}
    assert store.get("big/file") is None  # never completed


def _wait_for_journal(directory: Path, proc: subprocess.Popen[bytes]) -> set[Upload]:
    deadline = time.monotonic() + WATCHDOG
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the writer ended before it was killed"
        for writer, uploads in UploadJournal(directory).writers().items():
            if writer.pid == proc.pid and uploads:
                time.sleep(0.5)  # let the first part go in too
                return uploads
        time.sleep(0.02)
    pytest.fail(f"the writer's journal showed no upload within {WATCHDOG:g} s")


def test_failed_multipart_leaves_nothing_behind(spec: S3Spec, client: Any) -> None:
    store = S3Store(spec, multipart_threshold=5 * MiB, part_size=5 * MiB)

    def fail(params: dict[str, Any], **_: Any) -> None:
        if params["PartNumber"] == 2:
            raise ClientError({"Error": {"Code": "InternalError"}}, "UploadPart")

    store.client.meta.events.register("provide-client-params.s3.UploadPart", fail)
    with pytest.raises(StoreUnavailable):
        store.set("k", b"x" * (11 * MiB))
    assert _upload_ids(client, spec.bucket) == {}
    assert UploadJournal().writers() == {}
    store.close()
