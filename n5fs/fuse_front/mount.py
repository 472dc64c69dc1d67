"""Run a mount: serve a gateway at a mountpoint until it is unmounted or signalled.

Signals: SIGTERM unmounts cleanly, but only once what the store holds staged is written
(a zip archive's rewrite, see :meth:`_Session.flush_store`): if that fails, the mount stays,
an ERROR says why (and ``on_stop_refused`` tells systemd's STATUS=), and another SIGTERM
tries again, so accepted data is never dropped silently. SIGINT unmounts at once; SIGHUP drops
the gateway's caches (someone else changed the store). Once the loop ends, what was staged is
committed and the store closed; libfuse unmounts lazily so a shell sitting in the mount does
not keep it alive. If the store cannot write what was staged then (an unmount from outside,
``fusermount3 -u``), the ERROR is logged and :func:`serve` raises: the daemon exits non-zero.

A process-wide signal lands in any thread that does not block it; when that is not a libfuse
thread (numpy's OpenBLAS starts one at import), libfuse's handler flags the session but
nothing wakes its loop until the next request. So a watcher thread polls the flag and sends
one lookup to wake the loop. SIGHUP and SIGTERM get Python handlers (libfuse then leaves them
alone) whose wakeup fd the watcher reads, whichever thread took the signal; after a SIGTERM's
flush the watcher raises SIGINT in itself, so libfuse's own handler ends the loop.
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

from n5fs.errors import UploadsPending
from n5fs.fuse_front import _lib
from n5fs.fuse_front.attrs import StatMaker
from n5fs.fuse_front.invalidate import Invalidator
from n5fs.fuse_front.mounts import MountFailed
from n5fs.fuse_front.operations import GatewayLike, N5fsOperations
from n5fs.fuse_front.options import render
from n5fs.fuse_front.readahead import set_read_ahead
from n5fs.gateway.namespace.paths import CONTROL

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from n5fs.fuse_front.options import FuseValue

log = logging.getLogger(__name__)

__all__ = ["MountFailed", "serve"]

#: how often the watcher looks at libfuse's exit flag (an unmount waits at most this long)
POLL_SECONDS = 0.2
#: an fsync of this control file makes the store write what it holds staged
FLUSH_PATH = f"/{CONTROL}/stats.json"
#: signals the watcher handles, through Python handlers and their wakeup fd
_ROUTED = (signal.SIGHUP, signal.SIGTERM)


class _Session:
    """The running mount: its libfuse handle, readiness, the watcher that wakes the loop once
    libfuse has been told to exit, and the kernel invalidator's access to libfuse.

    ``_lock`` guards ``fuse_ptr`` against use after libfuse frees it: every call into libfuse
    with it (the watcher's exit check, :meth:`invalidate`) runs under the lock and only while
    ``_finished`` is false; :meth:`finish` (libfuse's destroy) sets it under the lock.
    ``unsaved`` is written once, by :meth:`finish`, and read by :func:`serve` after the loop."""

    def __init__(
        self,
        mountpoint: str,
        gateway: GatewayLike,
        on_ready: Callable[[], None] | None,
        on_stopping: Callable[[], None] | None = None,
        on_stop_refused: Callable[[str], None] | None = None,
        read_ahead_kb: int = 0,
    ) -> None:
        self.mountpoint = mountpoint
        self.gateway = gateway
        self.on_ready = on_ready
        self.read_ahead_kb = read_ahead_kb  # the kernel's, set once the mount answers
        self.on_stopping = on_stopping
        self.on_stop_refused = on_stop_refused
        self.unsaved: Exception | None = None  # what the final flush could not write
        self._stop_announced = False
        self.fuse_ptr = 0
        self.signal_fd: int | None = None
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
            root = os.stat(self.mountpoint)  # served by the loop: the mount answers
        except OSError as exc:
            log.error("the new mount at %s does not answer: %s", self.mountpoint, exc)  # noqa: TRY400
            return
        set_read_ahead(root.st_dev, self.read_ahead_kb)  # before anyone is told to read
        self.answered = True
        log.info("mounted at %s (%s)", self.mountpoint, _lib.describe())
        if self.on_ready is not None:
            self.on_ready()

    def finish(self) -> None:
        """libfuse's destroy (or serve's end): the loop is over. The first call writes what
        the store holds staged; a failure is logged and kept in ``unsaved``."""
        if self.answered:  # an unmount from outside (fusermount3 -u) skips the watcher
            self._announce_stop()
        if self.invalidator is not None:
            self.invalidator.stop()  # before the struct fuse is freed
        with self._lock:
            first = not self._finished
            self._finished = True
        if first and self.answered:
            self.unsaved = self.flush_store()
            if isinstance(self.unsaved, UploadsPending):
                log.error(
                    "%s is unmounted with writes not uploaded: %s", self.mountpoint, self.unsaved
                )
            elif self.unsaved is not None:
                log.error(
                    "%s is unmounted, but what was staged could not be written and is lost: %s",
                    self.mountpoint,
                    self.unsaved,
                )

    def flush_store(self) -> Exception | None:
        """Have the store write what it holds staged (a zip archive's rewrite) through the
        gateway's fsync of a control file, the call an ``fsync`` on the mount makes. Returns
        the failure, None when it worked or there is no control file to ask (a stand-in
        gateway): then there is nothing to write first."""
        try:
            fh = self.gateway.open(FLUSH_PATH, os.O_RDONLY)
        except Exception as exc:  # noqa: BLE001 (any gateway that cannot say has nothing staged)
            log.debug("no %s to flush the store through: %s", FLUSH_PATH, exc)
            return None
        try:
            self.gateway.fsync(fh)
        except Exception as exc:  # noqa: BLE001 (returned: the caller decides what it means)
            return exc
        finally:
            with contextlib.suppress(Exception):
                self.gateway.release(fh)
        return None

    def stop_requested(self) -> None:
        """SIGTERM: write what is staged while still mounted; only then leave the loop."""
        log.info("SIGTERM: writing what is staged before unmounting %s", self.mountpoint)
        failure = self.flush_store()
        if failure is None:
            self._exit_loop()
            return
        if isinstance(failure, UploadsPending):
            log.error(
                "SIGTERM: %s stays mounted: %s; fix the cause and send SIGTERM again, or run "
                "'n5fs unmount --discard %s' to stop now (they stay journaled for the next mount)",
                self.mountpoint,
                failure,
                self.mountpoint,
            )
        else:
            log.error(
                "SIGTERM: %s stays mounted: what is staged could not be written: %s; make room "
                "(or fix the cause) and send SIGTERM again, or run 'n5fs unmount --discard %s' "
                "to drop it",
                self.mountpoint,
                failure,
                self.mountpoint,
            )
        if self.on_stop_refused is not None:
            try:
                self.on_stop_refused(f"still mounted, not stopping: {failure}")
            except Exception:
                log.exception("the stop-refused hook failed")

    def _exit_loop(self) -> None:
        """Have libfuse leave its loop as its own SIGINT handler does (the watcher then sees
        the flag and wakes the loop). Never once the loop is over: libfuse has put SIGINT's
        default action back by then, which would kill the process mid-commit."""
        with self._lock:
            over = self._finished or (bool(self.fuse_ptr) and _lib.loop_exited(self.fuse_ptr))
        if not over:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

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
            for signum in self._signals():
                if signum == signal.SIGTERM:
                    self.stop_requested()
                elif signum == signal.SIGHUP:
                    self._drop_caches()
            with self._lock:
                if self._finished:
                    return
                exiting = bool(self.fuse_ptr) and _lib.loop_exited(self.fuse_ptr)
            if exiting and not woken:
                woken = True
                self._announce_stop()
                self._wake()

    def _drop_caches(self) -> None:
        log.info("SIGHUP: dropping cached listings, objects and detection results")
        drop = getattr(self.gateway, "drop_caches", None)
        if drop is not None:
            drop()

    def _signals(self) -> list[int]:
        """Signals the Python handlers caught (their numbers arrive on the wakeup fd)."""
        if self.signal_fd is None:
            threading.Event().wait(POLL_SECONDS)
            return []
        readable, _, _ = select.select([self.signal_fd], [], [], POLL_SECONDS)
        if not readable:
            return []
        with contextlib.suppress(BlockingIOError):
            return list(os.read(self.signal_fd, 512))
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
    # a file's own committed writes are not news to the kernel that wrote them (a round trip
    # to the invalidation thread and a settle per file, for nothing): see Gateway.subscribe
    subscribe(invalidator.enqueue, own_writes=False)
    return invalidator


@contextlib.contextmanager
def _signals_to(session: _Session) -> Iterator[None]:
    """Route SIGHUP and SIGTERM to the watcher through a wakeup fd (main thread only:
    Python's rule; elsewhere libfuse's own SIGTERM handler ends the loop at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_handlers = {signum: signal.signal(signum, lambda n, frame: None) for signum in _ROUTED}
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    session.signal_fd = read_fd
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        os.close(write_fd)


def serve(
    gateway: GatewayLike,
    mountpoint: str,
    options: dict[str, FuseValue],
    *,
    on_ready: Callable[[], None] | None = None,
    on_stopping: Callable[[], None] | None = None,
    on_stop_refused: Callable[[str], None] | None = None,
    read_ahead_kb: int = 0,
) -> None:
    """Mount ``gateway`` at ``mountpoint`` and answer calls (multithreaded) until unmounted
    (``n5fs unmount``, ``fusermount3 -u``, SIGTERM, SIGINT); then close the gateway.

    ``read_ahead_kb``: the kernel's read-ahead for the mount, set once it answers and before
    ``on_ready`` (:mod:`~n5fs.fuse_front.readahead`; 0 leaves the kernel's).

    ``on_ready`` runs once a stat of the mount root has been answered (daemon readiness,
    systemd ``READY=1``); ``on_stopping`` once the mount is told to end (a signal, or an
    unmount from outside), before the last commits (``STOPPING=1``); ``on_stop_refused``
    with the reason when a SIGTERM leaves the mount up because the store could not write what
    is staged (systemd ``STATUS=``). Blocks. SIGHUP and SIGTERM are handled so when called in
    the main thread. Raises MountFailed when libfuse refuses (its own message went to stderr),
    or when the store could not write what was staged once the loop was over.
    """
    session = _Session(
        os.path.abspath(mountpoint),
        gateway,
        on_ready,
        on_stopping,
        on_stop_refused,
        read_ahead_kb=read_ahead_kb,
    )
    session.invalidator = _kernel_invalidator(gateway, session)
    ops = N5fsOperations(
        gateway,
        stat=StatMaker(read_only=gateway.read_only),
        on_init=session.started,
        on_destroy=session.finish,
        settle=session.settle,
        # zero-message opens keep every file's pages, as kernel_cache does: only with it
        zero_opens=bool(options.get("kernel_cache")) and not options.get("direct_io"),
    )
    log.debug("libfuse options: %s", render(options))
    with _signals_to(session):
        watcher = threading.Thread(target=session.watch, name="n5fs-watch", daemon=True)
        watcher.start()
        try:
            _loop(ops, session, options)
        finally:
            log.debug("libfuse loop ended; %s is unmounted", session.mountpoint)
            session.finish()
            ops.close()  # destroy() already did, unless the mount never came up
            watcher.join(timeout=5)
            if session.signal_fd is not None:
                os.close(session.signal_fd)
    if session.unsaved is not None:
        raise MountFailed(
            f"{session.mountpoint} is unmounted, but what was staged could not be written and "
            f"is lost: {session.unsaved}"
        ) from session.unsaved


def _loop(ops: N5fsOperations, session: _Session, options: dict[str, FuseValue]) -> None:
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
