"""The FUSE mounts of this machine: which are n5fs's, which are stale, and unmounting them.

No libfuse here (``n5fs status`` and ``n5fs unmount`` work without it): the mount table is
``/proc/self/mountinfo``, where n5fs mounts show as type ``fuse.n5fs`` (they are mounted with
``subtype=n5fs``), and unmounting is ``fusermount3 -u`` (``-z`` for a lazy one).
"""

from __future__ import annotations

import errno
import os
import platform
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import N5fsError

if TYPE_CHECKING:
    from collections.abc import Iterator

SUBTYPE = "n5fs"


class MountFailed(N5fsError, OSError):
    """libfuse could not mount or unmount, or a mount never answered; the message says why."""


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mountpoint: str
    fstype: str
    source: str
    options: str

    @property
    def is_n5fs(self) -> bool:
        return self.fstype == f"fuse.{SUBTYPE}"


def _unescape(field: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as ``\040`` etc."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> Iterator[MountEntry]:
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 3 or sep < 5:
            continue
        yield MountEntry(
            mountpoint=_unescape(fields[4]),
            fstype=fields[sep + 1],
            source=_unescape(fields[sep + 2]),
            options=fields[5],
        )


def mounts(path: str = "/proc/self/mountinfo") -> list[MountEntry]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return list(parse_mountinfo(f.read()))
    except FileNotFoundError:  # not Linux: no mount table to read this way
        return []


def mount_entry(mountpoint: str) -> MountEntry | None:
    """The mount at exactly this path (the last one stacked there wins)."""
    target = os.path.abspath(mountpoint)
    found = [m for m in mounts() if m.mountpoint == target]
    return found[-1] if found else None


def is_stale(mountpoint: str, timeout: float = 5.0) -> bool:
    """A FUSE mount whose daemon is gone answers everything with ENOTCONN. Asked with
    statfs, which the kernel never answers from its caches (a stat of the root would be, for
    the attr timeout); in a helper thread, so that a hung daemon reads as "not stale"."""
    result: list[bool] = []

    def probe() -> None:
        try:
            os.statvfs(mountpoint)
        except OSError as exc:
            result.append(exc.errno == errno.ENOTCONN)
        else:
            result.append(False)

    thread = threading.Thread(target=probe, name="n5fs-stale-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def unmount(mountpoint: str, *, lazy: bool = False) -> None:
    """Unmount a FUSE mount (fusermount3/fusermount on Linux, umount elsewhere); ``lazy``
    detaches it even while busy or stale. Raises MountFailed with the tool's message."""
    command = _unmount_command(os.path.abspath(mountpoint), lazy=lazy)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
        raise MountFailed(f"cannot unmount {mountpoint}: {reason}")


def _unmount_command(mountpoint: str, *, lazy: bool) -> list[str]:
    if platform.system() == "Linux":
        tool = shutil.which("fusermount3") or shutil.which("fusermount")
        if tool is not None:
            return [tool, "-u", *(["-z"] if lazy else []), mountpoint]
        return ["umount", *(["-l"] if lazy else []), mountpoint]
    return ["umount", *(["-f"] if lazy else []), mountpoint]
