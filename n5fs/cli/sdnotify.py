"""systemd's readiness protocol (sd_notify(3)) with the standard library only.

A ``Type=notify`` unit hands its main process a unix datagram socket in ``NOTIFY_SOCKET``
(a path, or ``@name`` for the abstract namespace); each datagram holds newline-separated
``KEY=value`` assignments. n5fs sends ``READY=1`` once a stat of the mount root has been
answered through FUSE (the unit's dependents may then use the mount), ``STATUS=`` with the
source and the gateway's counters (``systemctl status`` shows the latest one), and
``STOPPING=1`` when libfuse has been told to leave its loop. systemd accepts messages from the
main process only (``NotifyAccess=main``): every thread of it qualifies, children do not, so
the socket's name is taken out of the environment before any child (fusermount3) starts.

Not being under systemd is normal: with no ``NOTIFY_SOCKET`` nothing is sent, and a send that
fails is logged once and never stops the mount.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping

log = logging.getLogger("n5fs.cli.sdnotify")

__all__ = [
    "STATUS_INTERVAL",
    "Notifier",
    "ServiceLink",
    "StatusReporter",
    "status_interval",
    "status_line",
]

ENV_SOCKET = "NOTIFY_SOCKET"
#: seconds between two STATUS= updates; ``N5FS_STATUS_INTERVAL`` overrides it
ENV_INTERVAL = "N5FS_STATUS_INTERVAL"
STATUS_INTERVAL = 30.0


def socket_address(name: str) -> str | None:
    """The ``sendto`` address of a ``NOTIFY_SOCKET`` value; None for kinds n5fs cannot use
    (``vsock:`` of systemd 254+ virtual machines)."""
    if name.startswith("@"):
        return "\0" + name[1:]  # the abstract namespace: a leading NUL byte, no file
    if name.startswith("/"):
        return name
    return None


class Notifier:
    """One datagram socket to systemd; safe to use from any thread of the main process."""

    def __init__(self, name: str) -> None:
        address = socket_address(name)
        if address is None:
            raise ValueError(f"{ENV_SOCKET}={name!r} is neither a path nor an @abstract name")
        self.name = name
        self._address = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._lock = threading.Lock()
        self._failed = False
        self._stopping = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier | None:
        """The notifier systemd asked for, or None; takes ``NOTIFY_SOCKET`` out of the
        environment so that child processes do not talk to systemd in our name."""
        env = os.environ if environ is None else environ
        name = env.pop(ENV_SOCKET, "")
        if not name:
            return None
        try:
            return cls(name)
        except ValueError as exc:
            log.warning("not notifying systemd: %s", exc)
            return None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; False (logged once) if it failed."""
        message = "\n".join(assignments).encode("utf-8", "replace")
        with self._lock:
            try:
                self._sock.sendto(message, self._address)
            except OSError as exc:
                if not self._failed:
                    log.warning("cannot notify systemd at %s: %s", self.name, exc)
                self._failed = True
                return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={_one_line(status)}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={_one_line(status)}")

    def stopping(self, status: str = "unmounting") -> bool:
        """``STOPPING=1``, sent at most once whoever asks first (signal or unmount)."""
        with self._lock:
            if self._stopping:
                return False
            self._stopping = True
        return self.notify("STOPPING=1", f"STATUS={_one_line(status)}")

    def close(self) -> None:
        with self._lock:
            self._sock.close()


def _one_line(text: str) -> str:
    """A newline would start a new assignment: STATUS= is one line."""
    return " ".join(text.split())


def status_interval(environ: Mapping[str, str] | None = None) -> float:
    """``N5FS_STATUS_INTERVAL`` seconds (positive), else 30."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_INTERVAL)
    if not text:
        return STATUS_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    log.warning(
        "%s=%r is not a positive number of seconds; using %g", ENV_INTERVAL, text, STATUS_INTERVAL
    )
    return STATUS_INTERVAL


def status_line(source: str, mountpoint: str, stats: Mapping[str, int]) -> str:
    """What ``systemctl status`` shows: where from, where to, and what has happened."""
    counts = [
        f"{stats.get('commits', 0)} commits",
        f"{stats.get('rejections', 0)} rejected",
        f"{_size(stats.get('bytes_in', 0))} in",
        f"{_size(stats.get('bytes_out', 0))} out",
        f"{stats.get('store_reads', 0)} store reads",
        f"cache {stats.get('cache_hits', 0)} hits/{stats.get('cache_misses', 0)} misses",
        f"{stats.get('open_handles', 0)} open",
    ]
    return f"{source} at {mountpoint}: " + ", ".join(counts)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


class StatusReporter:
    """Sends ``STATUS=describe()`` every ``interval`` seconds until stopped."""

    def __init__(self, notifier: Notifier, describe: Callable[[], str], interval: float) -> None:
        self.notifier = notifier
        self.describe = describe
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="n5fs-sd-status", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                text = self.describe()
            except Exception as exc:  # noqa: BLE001 (a status is never worth a dead mount)
                text = f"status unavailable: {exc}"
            self.notifier.status(text)


class ServiceLink:
    """One mount's life as systemd sees it: ``READY=1`` with a first status, a status every
    ``interval`` seconds, then ``STOPPING=1``."""

    def __init__(
        self, notifier: Notifier, describe: Callable[[], str], interval: float | None = None
    ) -> None:
        self.notifier = notifier
        self.describe = describe
        self._problem: str | None = None  # a refused stop, shown until the next attempt
        self._reporter = StatusReporter(
            notifier, self._status, status_interval() if interval is None else interval
        )
        self._started = False

    def _status(self) -> str:
        problem = self._problem
        return self.describe() if problem is None else f"{problem}; {self.describe()}"

    def ready(self) -> None:
        self.notifier.ready(self.describe())
        if not self._started:
            self._started = True
            self._reporter.start()

    def stopping(self) -> None:
        self._problem = None
        self.notifier.stopping(f"unmounting; {self.describe()}")

    def refused(self, reason: str) -> None:
        """A stop that cannot go on (staged changes the store will not take): STATUS= says
        why, and keeps saying it in every periodic status until the next stop attempt."""
        self._problem = reason
        self.notifier.status(self._status())

    def close(self) -> None:
        """Stop the status updates (the notifier belongs to the caller)."""
        self._reporter.stop()
