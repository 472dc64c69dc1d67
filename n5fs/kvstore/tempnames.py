"""Names of n5fs's own temp files and uploads: who made them, and whether that writer lives.

A daemon killed mid-write leaves what it had in flight: a hidden ``.<name>.<tag>.n5fs-partial``
file beside the key (file store), a temp archive beside a zip, an incomplete S3 multipart
upload. Each carries a *writer tag* (host, boot, pid and the process's start time), so a later
mount can tell a dead writer's leftovers, safe to remove, from a live writer's work in flight,
which it must not touch. Tags are ASCII and short; a temp name never exceeds ``NAME_MAX``
(255 bytes) whatever the length of the name it stands for: the name part is cut, the random
part keeps temp names unique.

Liveness on the same host is exact on Linux (``/proc/<pid>/stat`` start time; a reboot
changes the boot id); elsewhere a pid that exists counts as alive. A writer on another host
cannot be asked: its leftovers count as dead only once older than ``STALE_AFTER`` seconds.

Stdlib only, no state but the cached identity of this process (computed once, immutable).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass

#: our own temp files end so; listings never show them
PARTIAL_SUFFIX = ".n5fs-partial"
NAME_MAX = 255
#: leftovers of a writer we cannot ask (another host, an older n5fs) are dead after this long
STALE_AFTER = 24 * 3600.0
_LEGACY_STALE_AFTER = 3600.0

_TAG = re.compile(r"n5fs~([0-9a-f]{6})([0-9a-f]{4})~(\d+)~([0-9a-z]+)~")
_LEGACY = re.compile(r"\.[0-9a-f]{32}" + re.escape(PARTIAL_SUFFIX) + "$")


def _short_hash(text: str, chars: int) -> str:
    return hashlib.blake2b(text.encode(errors="surrogateescape"), digest_size=8).hexdigest()[:chars]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), ``"0"`` where unknown,
    ``None`` when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return "0" if _pid_exists(pid) else None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields and fields[0] in (b"Z", b"X"):
        return None  # killed, not reaped yet (a container's init may never reap it)
    return _base36(int(fields[19])) if len(fields) > 19 else "0"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed and not reaped, does not)."""
    return _start_time(pid) is not None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


@dataclass(frozen=True, slots=True)
class Writer:
    """One process that may leave temp files: host and boot (hashed), pid, start time."""

    host: str
    boot: str
    pid: int
    start: str

    @property
    def tag(self) -> str:
        return f"n5fs~{self.host}{self.boot}~{self.pid}~{self.start}~"

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}"


@functools.cache
def _host() -> str:
    return _short_hash(socket.gethostname(), 6)


@functools.cache
def _boot() -> str:
    return _short_hash(_boot_id(), 4)


@functools.cache
def _writer_for(pid: int) -> Writer:
    return Writer(_host(), _boot(), pid, _start_time(pid) or "0")


def current() -> Writer:
    """The writer tag of the calling process, correct after ``fork`` (daemonizing)."""
    return _writer_for(os.getpid())


class Liveness(enum.Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # another host: cannot be asked


def liveness(writer: Writer) -> Liveness:
    if writer.host != _host():
        return Liveness.UNKNOWN
    if writer.boot != _boot():
        return Liveness.DEAD  # this host rebooted since
    start = _start_time(writer.pid)
    if start is None:
        return Liveness.DEAD
    if start != writer.start and "0" not in (start, writer.start):
        return Liveness.DEAD  # the pid was reused by a younger process
    return Liveness.ALIVE


def is_alive(writer: Writer) -> bool:
    """Known to be running (on this host): its temp files must stay."""
    return liveness(writer) is Liveness.ALIVE


def writer_of(name: str) -> Writer | None:
    """The writer a temp name (or upload marker) carries, ``None`` if it carries none."""
    found = _TAG.search(name)
    if found is None:
        return None
    host, boot, pid, start = found.groups()
    return Writer(host, boot, int(pid), start)


def is_partial(name: str) -> bool:
    return name.endswith(PARTIAL_SUFFIX)


def temp_name(name: str, suffix: str = PARTIAL_SUFFIX) -> str:
    """``.<name>.<tag><random><suffix>``, at most ``NAME_MAX`` bytes however long ``name`` is."""
    tail = f".{current().tag}{uuid.uuid4().hex[:12]}{suffix}"
    room = NAME_MAX - 1 - len(tail.encode())
    encoded = name.encode(errors="surrogateescape")
    if len(encoded) > room:
        cut = encoded[:room].decode(errors="ignore")  # never split a UTF-8 sequence
        while len(cut.encode(errors="surrogateescape")) > room:
            cut = cut[:-1]
        name = cut
    return f".{name}{tail}"


def is_dead(name: str, mtime: float, now: float | None = None) -> bool:
    """Whether the temp file ``name`` (modified at ``mtime``) belongs to no live writer."""
    writer = writer_of(name)
    if writer is not None and (state := liveness(writer)) is not Liveness.UNKNOWN:
        return state is Liveness.DEAD
    age = (time.time() if now is None else now) - mtime
    if writer is None and _LEGACY.search(name) is not None:
        return age > _LEGACY_STALE_AFTER  # an older n5fs: uuid names, no writer tag
    return age > STALE_AFTER


@dataclass(frozen=True, slots=True)
class Leftover:
    """Something a writer left half-done: a temp file, a temp archive, an upload."""

    path: str  # store-relative (a key or a hidden file's relative path)
    what: str  # "temp file", "multipart upload", "temp archive"
    size: int
    mtime: float
    writer: str  # who, as far as we know
    dead: bool  # safe to remove

    def describe(self) -> str:
        state = "its writer is gone" if self.dead else "its writer may still be running"
        return f"{self.what} {self.path} ({self.size} bytes, {self.writer}; {state})"
