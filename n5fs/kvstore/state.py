"""Where n5fs keeps what must outlive a process: journals of writes a store has not finished
(multipart uploads to abort, writes accepted and not uploaded yet).

Not the runtime state directory of running mounts (``n5fs status``'s state files, under
``/run``): that one may be a tmpfs and is emptied by a reboot, which is exactly when these
journals matter.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_home"]


def state_home() -> Path:
    """``$N5FS_STATE_DIR``, else ``$XDG_STATE_HOME/n5fs``, else ``/var/lib/n5fs`` for root and
    ``~/.local/state/n5fs`` for others. Not created here: the first writer makes what it
    needs below it."""
    explicit = os.environ.get("N5FS_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "n5fs"
    if os.geteuid() == 0:
        return Path("/var/lib/n5fs")
    return Path.home() / ".local" / "state" / "n5fs"
