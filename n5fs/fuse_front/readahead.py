"""The kernel's read-ahead for a mount: the largest request it sends for a file's bytes.

Why: the kernel reads a FUSE file through its page cache in requests no larger than the
mount's read-ahead (``read_ahead_kb`` of its backing device, 128 KiB by default), although
libfuse 3 takes requests of 1 MiB (256 pages). A reader of 512 KiB chunks (TensorStore's
64^3 blocks of uint16) then costs five requests through the daemon per chunk instead of one;
each is a thread switch into Python and back, and on a mount of S3 that CPU is much of the
speed. gcsfuse documents the same setting for the same reason.

Linux only: the setting lives at ``/sys/class/bdi/<major>:<minor>/read_ahead_kb`` for the
mount's device, which exists once the mount answers a ``stat``, and only root may write it.
Elsewhere, or when it is refused, the kernel's own stays and the log says so. Stateless.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: where Linux keeps a backing device's settings
BDI_ROOT = Path("/sys/class/bdi")


def set_read_ahead(device: int, kib: int, *, root: Path = BDI_ROOT) -> int | None:
    """Set the read-ahead of the mount on ``device`` (``st_dev`` of its root) to ``kib``;
    the value now in force (None: unknown, not Linux). 0 leaves the kernel's."""
    path = root / f"{os.major(device)}:{os.minor(device)}" / "read_ahead_kb"
    try:
        before = int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # not Linux, or no such device: nothing to set
    if kib <= 0 or before == kib:
        return before
    try:
        path.write_text(f"{kib}\n")
    except OSError as exc:
        log.info(
            "kernel read-ahead stays at %d KiB (%s: %s); as root, -o read_ahead_kb=%d asks "
            "for a file's bytes in fewer, larger requests",
            before,
            path,
            exc.strerror or exc,
            kib,
        )
        return before
    log.debug("kernel read-ahead %d KiB -> %d KiB (%s)", before, kib, path)
    return kib
