"""The kernel's view stays true: the invalidator on its own (a fake libfuse), then real mounts
with hour-long kernel timeouts where a refused close, a commit that rewrites ``.zmetadata`` and
a rename leave no stale entry behind.

The mount tests hold only if the gateway announces its changes (``Gateway.subscribe``); the
controls mount with invalidation switched off and show the stale view those tests rule out (so
they would fail without it).
"""

from __future__ import annotations

import ctypes.util
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from n5fs.errors import Rejected
from n5fs.fuse_front.invalidate import Invalidator
from tests.mounting import real_mount, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.mounting import Mounter

needs_mount = [
    *real_mount(120),
    pytest.mark.skipif(not ctypes.util.find_library("fuse3"), reason="needs libfuse 3"),
]

HOUR = "3600"  # kernel attr/entry/negative timeouts: nothing expires during a test

ZARRAY = {
    "zarr_format": 2,
    "shape": [8],
    "chunks": [4],
    "dtype": "<u1",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}
CONSOLIDATED = {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}

#: a mount whose invalidation can be switched off (``off``), as on libfuse 2
SERVE = """
import logging
import sys
from n5fs.fuse_front import _lib
from n5fs.fuse_front.mount import serve
from n5fs.fuse_front.options import MountOptions, fuse_options
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore.file import FileStore

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
logging.getLogger("n5fs").setLevel(logging.DEBUG)
if sys.argv[2] == "off":
    _lib.CAN_INVALIDATE = False
options = fuse_options(MountOptions(), read_only=False, ttl=3600.0, fsname="inval",
                       libfuse_major=_lib.LIBFUSE_VERSION[0])
serve(Gateway(FileStore(sys.argv[1]), GatewayConfig(ttl=3600.0)), sys.argv[3], options)
"""


# == the invalidator, with a fake libfuse ==========================================================


class FakeKernel:
    """Records what it is told and by which thread; can be held inside a call."""

    def __init__(self, answers: dict[str, int] | None = None) -> None:
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.answers = answers or {}
        self.inside = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def hold(self) -> None:
        self.inside.clear()
        self.gate.clear()

    def __call__(self, path: str) -> int:
        self.calls.append(path)
        self.threads.add(threading.current_thread().name)
        self.inside.set()
        assert self.gate.wait(30)
        answer = self.answers.get(path, 0)
        if answer > 0:
            raise RuntimeError(f"libfuse blew up on {path}")
        return answer


@pytest.fixture
def kernel() -> FakeKernel:
    return FakeKernel()


@pytest.fixture
def invalidator(kernel: FakeKernel):
    inv = Invalidator(kernel, name="test-invalidate")
    inv.start()
    try:
        yield inv
    finally:
        kernel.gate.set()
        inv.stop()


def test_paths_reach_the_kernel_in_order_once_per_burst(invalidator, kernel):
    kernel.hold()
    invalidator.enqueue(["/a/0"])
    assert kernel.inside.wait(10)  # the worker is inside the call for /a/0
    invalidator.enqueue(["/a/1", "/.zmetadata"])
    invalidator.enqueue(["/a/1"])
    invalidator.enqueue(["/a/0", "/.zmetadata"])  # /a/0 again: it may have changed after the call
    kernel.gate.set()
    assert invalidator.settle(10)
    assert kernel.calls == ["/a/0", "/a/1", "/.zmetadata", "/a/0"]
    assert kernel.threads == {"test-invalidate"}  # never the caller's thread
    assert invalidator.invalidations == 4


def test_enqueue_never_waits_for_the_kernel(invalidator, kernel):
    kernel.hold()
    invalidator.enqueue(["/x"])
    assert kernel.inside.wait(10)
    done = threading.Event()
    threading.Thread(target=lambda: (invalidator.enqueue(["/y"]), done.set())).start()
    assert done.wait(5), "enqueue blocked while the worker sat in the kernel"
    kernel.gate.set()


def test_settle_waits_for_what_was_queued_before_it(invalidator, kernel):
    assert invalidator.settle(0)  # nothing queued: settled at once
    kernel.hold()
    invalidator.enqueue(["/x"])
    assert kernel.inside.wait(10)
    assert not invalidator.settle(0.05)  # bounded: gives up while the kernel holds the worker
    kernel.gate.set()
    assert invalidator.settle(10)
    assert kernel.calls == ["/x"]


def test_settle_waits_only_for_what_this_thread_queued(invalidator, kernel):
    """A commit that announced nothing (a file the kernel wrote itself) answers at once, even
    while another thread's paths wait for the kernel; a path another call queued first is
    waited for by every call that announced it."""
    kernel.hold()
    invalidator.enqueue(["/busy"])
    assert kernel.inside.wait(10)  # the worker sits in the kernel
    settled: dict[str, bool] = {}

    def quiet() -> None:
        settled["quiet"] = invalidator.settle(0.05)

    def second_to_queue() -> None:
        invalidator.enqueue(["/x"])  # already queued by the main thread below: not sent twice
        settled["second"] = invalidator.settle(0.05)

    invalidator.enqueue(["/x"])
    for target in (quiet, second_to_queue):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join(10)
    assert settled == {"quiet": True, "second": False}
    assert not invalidator.settle(0.05)  # this thread queued /busy and /x: not served yet
    kernel.gate.set()
    assert invalidator.settle(10)
    assert kernel.calls == ["/busy", "/x"]


def test_stop_drains_and_nothing_is_sent_after(kernel):
    inv = Invalidator(kernel)
    inv.start()
    kernel.hold()
    inv.enqueue(["/first"])
    assert kernel.inside.wait(10)
    inv.enqueue(["/second", "/third"])
    stopper = threading.Thread(target=inv.stop)
    stopper.start()
    wait_until(lambda: inv._state.value == "stopping", "stop() began")
    inv.enqueue(["/too-late"])  # the mount is ending: dropped
    kernel.gate.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert kernel.calls == ["/first", "/second", "/third"]
    inv.enqueue(["/after"])
    assert inv.settle(0)  # dropped, not queued: nothing to wait for
    inv.stop()  # twice is fine
    assert kernel.calls == ["/first", "/second", "/third"]


def test_stop_before_start_sends_nothing(kernel):
    inv = Invalidator(kernel)
    inv.enqueue(["/queued-before-init"])
    inv.stop()
    inv.start()  # too late: a stopped invalidator stays stopped
    inv.enqueue(["/x"])
    assert kernel.calls == []


def test_paths_queued_before_init_are_sent_once_started(kernel):
    inv = Invalidator(kernel)
    inv.enqueue(["/early"])
    inv.start()
    try:
        assert inv.settle(10)
        assert kernel.calls == ["/early"]
    finally:
        inv.stop()


def test_answers_are_counted_and_a_failure_never_stops_the_worker(caplog):
    kernel = FakeKernel({"/gone": -errno.ENOENT, "/bad": -errno.EBADF, "/boom": 1})
    inv = Invalidator(kernel)
    inv.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="n5fs.fuse_front.invalidate"):
            inv.enqueue(["/gone", "/bad", "/boom", "/fine"])
            assert inv.settle(10)
    finally:
        inv.stop()
    assert kernel.calls == ["/gone", "/bad", "/boom", "/fine"]
    assert (inv.invalidations, inv.not_cached, inv.invalidation_errors) == (1, 1, 2)
    assert "libfuse blew up on /boom" in caplog.text
    assert "EBADF" in caplog.text


def test_a_full_queue_drops_new_paths_and_says_so_once(kernel, caplog):
    inv = Invalidator(kernel, limit=2)
    inv.start()
    try:
        kernel.hold()
        inv.enqueue(["/held"])
        assert kernel.inside.wait(10)
        with caplog.at_level(logging.WARNING, logger="n5fs.fuse_front.invalidate"):
            inv.enqueue([f"/p{i}" for i in range(5)])
            inv.enqueue(["/p0", "/p9"])  # /p0 is already waiting: not a drop
        assert inv.dropped == 4
        assert caplog.text.count("cannot keep up") == 1
        kernel.gate.set()
        assert inv.settle(10)
        assert kernel.calls == ["/held", "/p0", "/p1"]
    finally:
        kernel.gate.set()
        inv.stop()


# == the front: operations that commit settle before they answer ===================================


class _RefusingGateway:
    read_only = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    def flush(self, fh: int) -> None:
        self.calls.append("flush")
        raise Rejected("chunk 0 decodes to 3 bytes, 4 required")

    def read(self, fh: int, size: int, offset: int) -> bytes:
        self.calls.append("read")
        return b"data"

    def unlink(self, path: str) -> None:
        self.calls.append("unlink")


def test_committing_operations_settle_before_they_answer_even_when_refused():
    from n5fs.fuse_front._lib import FuseOSError
    from n5fs.fuse_front.operations import N5fsOperations

    gateway = _RefusingGateway()
    settles: list[list[str]] = []
    ops = N5fsOperations(gateway, settle=lambda: settles.append(list(gateway.calls)))
    with pytest.raises(FuseOSError) as info:
        ops.flush("/a/0", 1)
    assert info.value.errno == errno.EINVAL
    assert ops.unlink("/a/1") == 0
    assert ops.read("/a/2", 4, 0, 1) == b"data"  # reads never wait: their pages are locked
    assert settles == [["flush"], ["flush", "unlink"]]


# == the binding ====================================================================================


@pytest.mark.skipif(not ctypes.util.find_library("fuse3"), reason="needs libfuse 3")
def test_libfuse3_can_invalidate():
    from n5fs.fuse_front import _lib

    assert _lib.CAN_INVALIDATE


@pytest.mark.skipif(not ctypes.util.find_library("fuse"), reason="needs libfuse 2")
def test_libfuse2_imports_and_cannot_invalidate():
    code = (
        "import errno; from n5fs.fuse_front import _lib, mount; "
        "assert _lib.LIBFUSE_VERSION[0] == 2, _lib.describe(); "
        "assert not _lib.CAN_INVALIDATE; "
        "assert _lib.invalidate_path(0, '/x') == -errno.ENOSYS"
    )
    env = {**os.environ, "FUSE_LIBRARY_NAME": "fuse"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)


# == real mounts ===================================================================================


def _expect_errno(code: int, call: Callable[[], object]) -> None:
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == code, info.value


def _array(mp: Path, name: str = "arr") -> Path:
    """A Zarr v2 array made through the mount: shape [8], chunks [4], one byte per item."""
    (mp / name).mkdir()
    (mp / name / ".zarray").write_text(json.dumps(ZARRAY))
    return mp / name


def _write(path: Path, data: bytes) -> None:
    """open(O_CREAT|O_WRONLY) + write + close, as a writer that checks its file (``stat``
    while it is open) does: the kernel then caches the staged file's attributes."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        assert os.stat(path).st_size == len(data)
    finally:
        os.close(fd)


def _consolidated_root(store: Path) -> None:
    (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (store / ".zmetadata").write_text(json.dumps(CONSOLIDATED))


def _read_trusted(path: Path) -> bytes:
    """Read, then stat again: the read marks atime stale and the stat refreshes everything,
    so afterwards the kernel trusts its cached size for the whole attr timeout."""
    data = path.read_bytes()
    assert os.stat(path).st_size == len(data)
    return data


def _mount(mounter: Mounter, store: Path, *, invalidate: bool = True) -> Path:
    if invalidate:
        return mounter.foreground(str(store), "--cache-ttl", HOUR)
    mp, _ = mounter.script(SERVE, str(store), "off")
    return mp


@pytest.fixture
def store(tmp_path) -> Path:
    path = tmp_path / "store"
    path.mkdir()
    return path


class TestMounted:
    pytestmark = needs_mount

    def test_a_refused_new_chunk_leaves_no_entry_and_a_retry_works(self, mounter, store):
        mp = _mount(mounter, store)
        chunk = _array(mp) / "0"
        _expect_errno(errno.EINVAL, lambda: _write(chunk, b"xyz"))  # 3 bytes, 4 required
        _expect_errno(errno.ENOENT, lambda: os.stat(chunk))  # no stale positive entry
        assert "0" not in os.listdir(chunk.parent)
        assert not (store / "arr" / "0").exists()
        _write(chunk, b"abcd")  # the retry works at once
        assert chunk.read_bytes() == b"abcd"
        assert os.stat(chunk).st_size == 4
        assert (store / "arr" / "0").read_bytes() == b"abcd"

    def test_consolidated_metadata_is_read_whole_after_another_commit(self, mounter, store):
        _consolidated_root(store)
        mp = _mount(mounter, store)
        doc = mp / ".zmetadata"
        assert json.loads(_read_trusted(doc)) == CONSOLIDATED
        _array(mp, "a")  # the gateway rewrites the root's .zmetadata: it grows
        data = doc.read_bytes()
        assert data == (store / ".zmetadata").read_bytes()
        assert "a/.zarray" in json.loads(data)["metadata"]
        assert os.stat(doc).st_size == len(data)

    def test_consolidated_metadata_is_true_after_a_rename_and_an_unlink(self, mounter, store):
        _consolidated_root(store)
        mp = _mount(mounter, store)
        doc = mp / ".zmetadata"
        (mp / "b").mkdir()
        _read_trusted(doc)
        temp = mp / "b" / ".zarray.__lock"  # TensorStore's way: a temp name, then a rename
        temp.write_text(json.dumps(ZARRAY))
        os.rename(temp, mp / "b" / ".zarray")
        assert "b/.zarray" in json.loads(_read_trusted(doc))["metadata"]
        os.unlink(mp / "b" / ".zarray")  # the document shrinks
        assert os.stat(doc).st_size == (store / ".zmetadata").stat().st_size
        assert "b/.zarray" not in json.loads(doc.read_bytes())["metadata"]

    def test_files_the_kernel_wrote_are_not_invalidated_and_read_true(self, mounter, store):
        """Own writes are not announced to the kernel (it wrote them; FUSE drops a file's
        cached size and times after a write): the stat and the bytes are still the stored
        ones after an overwrite that shrinks the file, with hour-long attr timeouts."""
        mp = mounter.foreground(str(store), "--cache-ttl", HOUR, "--log-level", "debug")
        path = mp / "plain.bin"
        _write(path, b"0123456789")
        _read_trusted(path)
        with open(path, "wb") as f:  # O_TRUNC, then 4 bytes: the kernel knew 10
            f.write(b"abcd")
        assert os.stat(path).st_size == 4
        assert path.read_bytes() == b"abcd" == (store / "plain.bin").read_bytes()
        chunk = _array(mp) / "0"
        _expect_errno(errno.EINVAL, lambda: _write(chunk, b"xyz"))  # a refusal is announced
        subprocess.run(["fusermount3", "-u", str(mp)], check=True, timeout=60)
        deadline = time.monotonic() + 60
        said = ""
        while "kernel invalidations:" not in said and time.monotonic() < deadline:
            time.sleep(0.05)
            said = (mounter.tmp / "mnt.stderr").read_text()
        sent = re.search(r"kernel invalidations: (\d+) sent, (\d+) not cached", said)
        assert sent is not None, said[-2000:]
        assert int(sent[1]) + int(sent[2]) == 1  # the refused chunk alone

    # -- controls: without invalidation the same steps show the stale view -------------------

    def test_control_without_invalidation_a_refused_name_stays(self, mounter, store):
        mp = _mount(mounter, store, invalidate=False)
        chunk = _array(mp) / "0"
        _expect_errno(errno.EINVAL, lambda: _write(chunk, b"xyz"))
        assert os.stat(chunk).st_size == 3  # the kernel's cached entry of the refused file
        assert not (store / "arr" / "0").exists()

    def test_control_without_invalidation_zmetadata_is_cut(self, mounter, store):
        _consolidated_root(store)
        mp = _mount(mounter, store, invalidate=False)
        doc = mp / ".zmetadata"
        old = _read_trusted(doc)
        _array(mp, "a")
        assert doc.read_bytes() == (store / ".zmetadata").read_bytes()[: len(old)]
        said = (mounter.tmp / "mnt.stderr").read_text()
        assert said.count("cannot invalidate the kernel's cached entries") == 1

    @pytest.mark.skipif(
        not ctypes.util.find_library("fuse") or shutil.which("fusermount") is None,
        reason="needs libfuse 2 and fusermount",
    )
    def test_a_libfuse2_mount_serves_without_invalidation(self, mounter, store):
        mounter.env["FUSE_LIBRARY_NAME"] = "fuse"
        mp, _ = mounter.script(SERVE, str(store), "on")
        chunk = _array(mp) / "0"
        _write(chunk, b"abcd")
        assert chunk.read_bytes() == b"abcd"
        said = (mounter.tmp / "mnt.stderr").read_text()
        assert "libfuse 2." in said
        assert said.count("cannot invalidate the kernel's cached entries") == 1
