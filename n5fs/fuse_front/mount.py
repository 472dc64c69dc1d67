"""Run a mount: serve a gateway at a mountpoint until it is unmounted or signalled.

Signals: SIGTERM and SIGINT unmount cleanly (what was staged is committed, the store is
closed; libfuse's own handlers flag the session, and libfuse unmounts lazily so a shell
sitting in the mount does not keep it alive), SIGHUP drops the gateway's caches (someone else
changed the store). A process-wide signal lands in any thread that does not block it; when
that is not a libfuse thread (numpy's OpenBLAS starts one at import), libfuse's handler flags
the session but nothing wakes its loop until the next request. So a watcher thread polls the
flag and sends one lookup to wake the loop; and SIGHUP gets a Python handler (libfuse then
leaves it alone) whose wakeup fd the watcher reads, whichever thread took the signal.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import threading
import uuid
from typing import TYPE_CHECKING

from n5fs.fuse_front import _lib
from n5fs.fuse_front.attrs import StatMaker
from n5fs.fuse_front.invalidate import Invalidator
from n5fs.fuse_front.mounts import MountFailed
from n5fs.fuse_front.operations import GatewayLike, N5fsOperations
from n5fs.fuse_front.options import render

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from n5fs.fuse_front.options import FuseValue

log = logging.getLogger(__name__)

__all__ = ["MountFailed", "serve"]

#: how often the watcher looks at libfuse's exit flag (an unmount waits at most this long)
POLL_SECONDS = 0.2


class _Session:
    """The running mount: its libfuse handle, readiness, the watcher that wakes the loop once
    libfuse has been told to exit, and the kernel invalidator's access to libfuse.

    ``_lock`` guards ``fuse_ptr`` against use after libfuse frees it: every call into libfuse
    with it (the watcher's exit check, :meth:`invalidate`) runs under the lock and only while
    ``_finished`` is false; :meth:`finish` (libfuse's destroy) sets it under the lock."""

    def __init__(
        self,
        mountpoint: str,
        gateway: GatewayLike,
        on_ready: Callable[[], None] | None,
        on_stopping: Callable[[], None] | None = None,
    ) -> None:
        self.mountpoint = mountpoint
        self.gateway = gateway
        self.on_ready = on_ready
        self.on_stopping = on_stopping
        self._stop_announced = False
        self.fuse_ptr = 0
        self.hup_fd: int | None = None
        self.answered = False
        self._finished = False
        self._lock = threading.Lock()  # fuse_ptr is freed after finish(): never read it then
        self.invalidator: Invalidator | None = None

    def started(self, fuse_ptr: int) -> None:
        """libfuse's init (a FUSE thread; no request is served until it returns)."""
        with self._lock:
            self.fuse_ptr = fuse_ptr
        if self.invalidator is not None:
            self.invalidator.start()
        threading.Thread(target=self._announce, name="n5fs-ready", daemon=True).start()

    def _announce(self) -> None:
        try:
            os.stat(self.mountpoint)  # served by the loop: the mount answers
        except OSError as exc:
            log.error("the new mount at %s does not answer: %s", self.mountpoint, exc)  # noqa: TRY400
            return
        self.answered = True
        log.info("mounted at %s (%s)", self.mountpoint, _lib.describe())
        if self.on_ready is not None:
            self.on_ready()

    def finish(self) -> None:
        """libfuse's destroy (or serve's end): the loop is over."""
        if self.answered:  # an unmount from outside (fusermount3 -u) skips the watcher
            self._announce_stop()
        if self.invalidator is not None:
            self.invalidator.stop()  # before the struct fuse is freed
        with self._lock:
            self._finished = True

    def invalidate(self, path: str) -> int:
        """The invalidator's one way into libfuse. Refused (-ESHUTDOWN) once the loop is told
        to end: libfuse then unmounts and closes the device, and a notification racing that
        close could land in a reused descriptor."""
        with self._lock:
            if self._finished or not self.fuse_ptr or _lib.loop_exited(self.fuse_ptr):
                return -errno.ESHUTDOWN
            return _lib.invalidate_path(self.fuse_ptr, path)

    def settle(self) -> None:
        """Let an operation that committed wait until the kernel has heard of the change."""
        if self.invalidator is not None:
            self.invalidator.settle()

    def _announce_stop(self) -> None:
        """Tell ``on_stopping`` once, before the last commits run (systemd's STOPPING=1)."""
        with self._lock:
            if self._stop_announced or self.on_stopping is None:
                return
            self._stop_announced = True
        try:
            self.on_stopping()
        except Exception:
            log.exception("the stopping hook failed")

    def watch(self) -> None:
        woken = False
        while True:
            for signum in self._hups():
                if signum != signal.SIGHUP:
                    continue
                log.info(
                    "%s: dropping cached listings, objects and detection results",
                    signal.Signals(signum).name,
                )
                drop = getattr(self.gateway, "drop_caches", None)
                if drop is not None:
                    drop()
            with self._lock:
                if self._finished:
                    return
                exiting = bool(self.fuse_ptr) and _lib.loop_exited(self.fuse_ptr)
            if exiting and not woken:
                woken = True
                self._announce_stop()
                self._wake()

    def _hups(self) -> list[int]:
        """Signals the Python handler caught (their numbers arrive on the wakeup fd)."""
        if self.hup_fd is None:
            threading.Event().wait(POLL_SECONDS)
            return []
        readable, _, _ = select.select([self.hup_fd], [], [], POLL_SECONDS)
        if not readable:
            return []
        with contextlib.suppress(BlockingIOError):
            return list(os.read(self.hup_fd, 512))
        return []

    def _wake(self) -> None:
        """One uncached lookup gets a worker to read a request and notice the exit flag."""
        log.info("unmounting %s", self.mountpoint)
        with contextlib.suppress(OSError):  # ENOENT, or the connection already gone
            os.stat(os.path.join(self.mountpoint, f".n5fs-wake-{uuid.uuid4().hex}"))


def _kernel_invalidator(gateway: GatewayLike, session: _Session) -> Invalidator | None:
    """An invalidator fed by the gateway's change announcements; None where libfuse cannot
    invalidate (libfuse 2, fusepy) or the gateway announces nothing: cached entries then last
    their timeouts (``cache_ttl``)."""
    if not _lib.CAN_INVALIDATE:
        log.debug(
            "%s cannot invalidate the kernel's cached entries; they last their timeouts",
            _lib.describe(),
        )
        return None
    subscribe = getattr(gateway, "subscribe", None)  # optional: fakes may lack it
    if subscribe is None:
        log.debug("the gateway announces no changes; cached entries last their timeouts")
        return None
    invalidator = Invalidator(session.invalidate)
    subscribe(invalidator.enqueue)
    return invalidator


@contextlib.contextmanager
def _hup_to(session: _Session) -> Iterator[None]:
    """Route SIGHUP to the watcher through a wakeup fd (main thread only: Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_handler = signal.signal(signal.SIGHUP, lambda signum, frame: None)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    session.hup_fd = read_fd
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGHUP, old_handler)
        os.close(write_fd)


def serve(
    gateway: GatewayLike,
    mountpoint: str,
    options: dict[str, FuseValue],
    *,
    on_ready: Callable[[], None] | None = None,
    on_stopping: Callable[[], None] | None = None,
) -> None:
    """Mount ``gateway`` at ``mountpoint`` and answer calls (multithreaded) until unmounted
    (``n5fs unmount``, ``fusermount3 -u``, SIGTERM, SIGINT); then close the gateway.

    ``on_ready`` runs once a stat of the mount root has been answered (daemon readiness,
    systemd ``READY=1``); ``on_stopping`` once the mount is told to end (a signal, or an
    unmount from outside), before the last commits (``STOPPING=1``). Blocks. SIGHUP drops
    caches when called in the main thread. Raises MountFailed when libfuse refuses (its own message went to stderr).
    """
    session = _Session(os.path.abspath(mountpoint), gateway, on_ready, on_stopping)
    session.invalidator = _kernel_invalidator(gateway, session)
    ops = N5fsOperations(
        gateway,
        stat=StatMaker(read_only=gateway.read_only),
        on_init=session.started,
        on_destroy=session.finish,
        settle=session.settle,
    )
    log.debug("libfuse options: %s", render(options))
    with _hup_to(session):
        watcher = threading.Thread(target=session.watch, name="n5fs-watch", daemon=True)
        watcher.start()
        try:
            _lib.N5fsFUSE(ops, session.mountpoint, foreground=True, **options)
        except RuntimeError as exc:
            if session.answered:  # libfuse reports a loop ended by SIGTERM/SIGINT as code 8
                log.info("stopped by a signal (libfuse code %s)", exc)
                return
            raise MountFailed(
                f"cannot mount {session.mountpoint}: libfuse gave up (code {exc}); its reason "
                "is printed above"
            ) from exc
        finally:
            log.debug("libfuse loop ended; %s is unmounted", session.mountpoint)
            session.finish()
            ops.close()  # destroy() already did, unless the mount never came up
            watcher.join(timeout=5)
            if session.hup_fd is not None:
                os.close(session.hup_fd)
