"""hdmf-zarr links as symlinks: each ``zarr_link`` entry of a group's ``.zattrs`` is a symlink
in that group's folder, pointing (relatively) at the linked object in the same store;
``ln -s`` there adds an entry, ``rm`` removes it. Nothing else in a store is a symlink."""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING

from n5fs.errors import InvalidKey, NotSupported
from n5fs.formats.hdmf import link_targets, symlink_target, with_link

if TYPE_CHECKING:
    from n5fs.detect import Folder


def links_of(folder: Folder) -> dict[str, str]:
    """name -> symlink text for the links of an hdmf-zarr group (empty for anything else)."""
    if folder.fmt != "hdmf-zarr" or folder.node is None:
        return {}
    here = folder.prefix.rstrip("/")
    targets = link_targets(folder.node.attributes)
    return {name: symlink_target(here, target) for name, target in targets.items()}


def _attrs_key(folder: Folder) -> str:
    return folder.prefix + ".zattrs"


def _group_attrs(folder: Folder) -> dict[str, object]:
    if folder.fmt != "hdmf-zarr" or folder.node is None:
        where = folder.prefix or "the root"
        raise NotSupported(
            f"symlinks exist only as hdmf-zarr links; {where} is not an hdmf-zarr group"
        )
    return dict(folder.node.attributes)


def add_link(folder: Folder, name: str, target: str) -> tuple[str, bytes]:
    """The ``.zattrs`` key and new content that add link ``name`` -> ``target`` (symlink text,
    relative to the folder). The target must stay inside the store."""
    attrs = _group_attrs(folder)
    here = folder.prefix.rstrip("/")
    resolved = (
        posixpath.normpath(posixpath.join(here, target)) if here else posixpath.normpath(target)
    )
    if target.startswith("/") or resolved in (".", "..") or resolved.startswith("../"):
        raise InvalidKey(target, "a link must name an object inside the store, by a relative path")
    doc = with_link(attrs, name, resolved)
    return _attrs_key(folder), json.dumps(doc, indent=2).encode()


def remove_link(folder: Folder, name: str) -> tuple[str, bytes]:
    """The ``.zattrs`` key and new content without link ``name``."""
    attrs = _group_attrs(folder)
    entries = attrs.get("zarr_link", [])
    assert isinstance(entries, list)
    attrs["zarr_link"] = [e for e in entries if not (isinstance(e, dict) and e.get("name") == name)]
    return _attrs_key(folder), json.dumps(attrs, indent=2).encode()
