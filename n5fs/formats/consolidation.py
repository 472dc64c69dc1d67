"""Consolidated metadata of Zarr v2 (``.zmetadata``) and Zarr v3 (inline
``consolidated_metadata`` in a group's ``zarr.json``): which documents consolidate a metadata
key, how one entry changes, and which entries of a stored document are stale.

Stale consolidated metadata is the most reported zarr complaint: a reader that trusts it never
sees an array written after consolidation. The gateway keeps every document true on each
metadata commit (:meth:`Consolidation.updated`); ``n5fs validate`` reports the documents that
are not (:meth:`Consolidation.stale_entries`). :func:`consolidated_metadata` builds a whole v3
block from scratch, as zarr-python 3 writes it, from the same two helpers the updates use.

Entries are compared as JSON values, never as bytes, and a document is only rewritten when an
entry really changes: ``cp -r`` of a consolidated hierarchy leaves its bytes untouched (so
``rsync -c``, checksums and content-addressed backups see no change). Two writer quirks are
not differences: zarr-python 3 adds a ``consolidated_metadata`` member to sub-group entries of
a v2 ``.zmetadata`` and writes sub-groups' own (possibly empty) inline blocks into v3 entries.
"""

from __future__ import annotations

import json
import unicodedata
from typing import TYPE_CHECKING, Any

from n5fs.formats.base import Consolidation
from n5fs.kvstore.keys import basename, folders_above, parent

if TYPE_CHECKING:
    from collections.abc import Mapping

#: entry members that are not part of a node's own metadata (see the module docstring)
_NOT_OWN = "consolidated_metadata"
_EMPTY_V3_BLOCK: dict[str, Any] = {"kind": "inline", "must_understand": False, "metadata": {}}


def _canonical(value: Any) -> str:
    """JSON text that is equal for equal documents (NaN included, member order ignored)."""
    return json.dumps(value, sort_keys=True, allow_nan=True)


def _own(entry: Any) -> Any:
    """An entry without the members that are not the node's own metadata."""
    if isinstance(entry, dict) and _NOT_OWN in entry:
        return {k: v for k, v in entry.items() if k != _NOT_OWN}
    return entry


def same_entry(a: Any, b: Any) -> bool:
    return _canonical(_own(a)) == _canonical(_own(b))


def _differences(held: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    out = [f"{rel!r} is missing" for rel in sorted(expected.keys() - held.keys())]
    out += [f"{rel!r} names nothing stored" for rel in sorted(held.keys() - expected.keys())]
    out += [
        f"{rel!r} differs from the stored document"
        for rel in sorted(held.keys() & expected.keys())
        if not same_entry(held[rel], expected[rel])
    ]
    return out


class ZarrV2Consolidation(Consolidation):
    """``.zmetadata`` at a group folder maps every ``.zarray``/``.zgroup``/``.zattrs`` key at
    or below that folder (relative to it) to the document; ``zarr_consolidated_format`` 1."""

    DOCUMENT = ".zmetadata"
    ENTRIES = frozenset({".zarray", ".zgroup", ".zattrs"})

    def documents(self, key: str) -> list[str]:
        if basename(key) not in self.ENTRIES:
            return []
        return [root + self.DOCUMENT for root in reversed(folders_above(key))]

    def _entries(self, doc: Mapping[str, Any]) -> dict[str, Any] | None:
        entries = doc.get("metadata")
        return entries if isinstance(entries, dict) else None

    def updated(
        self, doc_key: str, doc: Mapping[str, Any], key: str, entry: Any | None
    ) -> dict[str, Any] | None:
        entries = self._entries(doc)
        if entries is None:
            return None
        rel = key[len(doc_key) - len(self.DOCUMENT) :]
        new = dict(entries)
        if entry is None:
            new.pop(rel, None)
        elif rel in new and same_entry(new[rel], entry):
            return dict(doc)
        else:
            new[rel] = entry
        return {**doc, "metadata": new}

    def stale_entries(
        self, doc_key: str, doc: Mapping[str, Any], stored: Mapping[str, Any]
    ) -> list[str]:
        entries = self._entries(doc) if basename(doc_key) == self.DOCUMENT else None
        if entries is None:
            return []
        expected = {rel: v for rel, v in stored.items() if basename(rel) in self.ENTRIES}
        return _differences(entries, expected)

    def serialize(self, doc: Mapping[str, Any]) -> bytes:
        return json.dumps(doc, indent=4, sort_keys=True).encode()


class ZarrV3Consolidation(Consolidation):
    """A group's ``zarr.json`` may hold ``consolidated_metadata`` (``kind`` ``inline``): every
    descendant node's path relative to the group -> that node's ``zarr.json`` document."""

    DOCUMENT = "zarr.json"

    def documents(self, key: str) -> list[str]:
        folder = parent(key)
        if basename(key) != self.DOCUMENT or not folder:
            return []
        return [root + self.DOCUMENT for root in reversed(folders_above(folder))]

    def _entries(self, doc: Mapping[str, Any]) -> dict[str, Any] | None:
        block = doc.get("consolidated_metadata")
        if not isinstance(block, dict) or not isinstance(block.get("metadata"), dict):
            return None
        entries: dict[str, Any] = block["metadata"]
        return entries

    def updated(
        self, doc_key: str, doc: Mapping[str, Any], key: str, entry: Any | None
    ) -> dict[str, Any] | None:
        entries = self._entries(doc)
        if entries is None:
            return None
        rel = parent(key)[len(doc_key) - len(self.DOCUMENT) :]
        if entry is None:
            new = {k: v for k, v in entries.items() if k != rel and not k.startswith(rel + "/")}
        elif rel in entries and same_entry(entries[rel], entry):
            return dict(doc)
        else:
            new = {**entries, rel: _as_child(entry)}
        block = {**doc["consolidated_metadata"], "metadata": _ordered(new)}
        return {**doc, "consolidated_metadata": block}

    def stale_entries(
        self, doc_key: str, doc: Mapping[str, Any], stored: Mapping[str, Any]
    ) -> list[str]:
        entries = self._entries(doc) if basename(doc_key) == self.DOCUMENT else None
        if entries is None:
            return []
        expected = {
            parent(rel): v
            for rel, v in stored.items()
            if basename(rel) == self.DOCUMENT and rel != self.DOCUMENT
        }
        return _differences(entries, expected)

    def serialize(self, doc: Mapping[str, Any]) -> bytes:
        return json.dumps(doc, indent=2).encode()


def _as_child(entry: Any) -> Any:
    """A node document as zarr-python 3 consolidates it: a sub-group carries an empty block."""
    if isinstance(entry, dict) and entry.get("node_type") == "group":
        return {**entry, _NOT_OWN: json.loads(json.dumps(_EMPTY_V3_BLOCK))}
    return entry


def _ordered(entries: Mapping[str, Any]) -> dict[str, Any]:
    """Entries by depth, then case-folded name: the order zarr-python 3 writes."""
    return {
        k: entries[k]
        for k in sorted(
            entries, key=lambda k: (k.count("/"), unicodedata.normalize("NFKC", k).casefold())
        )
    }


def consolidated_metadata(children: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The inline ``consolidated_metadata`` zarr-python 3 writes for a group.

    ``children`` maps every descendant's path relative to the group (``"a"``, ``"a/b"``)
    to that node's own ``zarr.json`` document. As zarr-python does, child groups carry an
    empty consolidated block and entries are ordered by depth, then case-folded name.
    """
    entries = {path: _as_child(dict(doc)) for path, doc in children.items()}
    return {**_EMPTY_V3_BLOCK, "metadata": _ordered(entries)}


def consolidate(
    group_doc: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """``group_doc`` with its consolidated_metadata rebuilt from ``children``."""
    return {**group_doc, "consolidated_metadata": consolidated_metadata(children)}


def consolidated_is_current(
    group_doc: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Does the stored block equal what ``children`` would produce (order ignored)?"""
    return group_doc.get("consolidated_metadata") == consolidated_metadata(children)
