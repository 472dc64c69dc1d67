"""Links as symlinks: a format that has same-store links (hdmf-zarr's ``zarr_link`` entries)
shows each as a symlink in its group's folder, pointing (relatively) at the linked object;
``ln -s`` there adds one and ``rm`` removes it, through the format's own
:meth:`~n5fs.formats.base.Format.link_update`. Nothing else in a store is a symlink.

This module only does path arithmetic (symlink text <-> store path, and that a target stays
inside the store); which metadata file holds a link, and how, is the format's knowledge.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from n5fs.errors import InvalidKey, NotSupported, Rejected
from n5fs.formats.registry import METADATA_NAMES

if TYPE_CHECKING:
    from n5fs.detect import Folder


def links_of(folder: Folder) -> dict[str, str]:
    """name -> symlink text for the links of a group (empty for anything else)."""
    fmt = folder.format
    if fmt is None:
        return {}
    here = folder.prefix.rstrip("/")
    return {
        name: posixpath.relpath("/" + target, "/" + here)
        for name, target in fmt.links(folder.node).items()
    }


def add_link(folder: Folder, name: str, target: str) -> tuple[str, bytes]:
    """The metadata key and new content that add link ``name`` -> ``target`` (symlink text,
    relative to the folder). The target must stay inside the store, and a link may not take
    a metadata name (a ``.zattrs`` symlink would hide the file that holds the links)."""
    if name in METADATA_NAMES:
        raise Rejected(
            f"{name!r} is a metadata name; it cannot be a symlink",
            path=folder.prefix + name,
            fmt=folder.fmt or "",
            rule="metadata-symlink",
        )
    here = folder.prefix.rstrip("/")
    resolved = posixpath.normpath(posixpath.join(here, target))
    if target.startswith("/") or resolved in (".", "..") or resolved.startswith("../"):
        raise InvalidKey(target, "a link must name an object inside the store, by a relative path")
    return _update(folder, name, resolved)


def remove_link(folder: Folder, name: str) -> tuple[str, bytes]:
    """The metadata key and new content without link ``name``."""
    return _update(folder, name, None)


def _update(folder: Folder, name: str, target: str | None) -> tuple[str, bytes]:
    fmt = folder.format
    if fmt is None:
        where = folder.prefix or "the root"
        raise NotSupported(f"symlinks exist only as hdmf-zarr links; {where} is no such group")
    rel, data = fmt.link_update(folder.node, name, target)
    return folder.prefix + rel, data
