"""The FUSE front: POSIX calls -> gateway calls, errno mapping, mount options, serving.

Only ``_lib`` imports the FUSE binding, and it loads libfuse when imported: this package
exports lazily so that ``options`` and ``attrs`` (and ``n5fs --help``) work without libfuse.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "N5fsOperations": "n5fs.fuse_front.operations",
    "serve": "n5fs.fuse_front.mount",
    "MountFailed": "n5fs.fuse_front.mounts",
    "unmount": "n5fs.fuse_front.mounts",
    "MountOptions": "n5fs.fuse_front.options",
    "parse_options": "n5fs.fuse_front.options",
    "fuse_options": "n5fs.fuse_front.options",
    "StatMaker": "n5fs.fuse_front.attrs",
}

__all__ = [
    "MountFailed",
    "MountOptions",
    "N5fsOperations",
    "StatMaker",
    "fuse_options",
    "parse_options",
    "serve",
    "unmount",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
