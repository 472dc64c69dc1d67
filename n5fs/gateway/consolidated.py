"""Keep consolidated metadata true: after every metadata commit, every ``.zmetadata`` (v2)
and every inline ``consolidated_metadata`` (v3 group ``zarr.json``) above the key is updated.

Stale consolidated metadata is the most reported zarr complaint: a reader that trusts it never
sees an array written after consolidation. The writes here go straight to the store (they are
derived from metadata that was just validated) and are reported through ``on_write``.

Concurrency: upkeep is a read-modify-write of a shared document; two metadata commits in
different folders of one hierarchy run at the same time (each holds only its own folder
exclusively) and would lose an entry. ``after_change`` therefore runs under the keeper's lock:
one upkeep at a time, each reading the document the previous one wrote. Callers hold the
commit order of the metadata key (so the document is never rewritten by a commit of the
consolidated file itself meanwhile); the lock is taken inside that, and nothing is acquired
under it but cache (leaf) locks.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from n5fs.codecs.jsondoc import load_json
from n5fs.errors import Rejected
from n5fs.formats.zarr3 import consolidated_metadata
from n5fs.kvstore.keys import basename, folders_above, parent

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.kvstore.base import KvStore

log = logging.getLogger(__name__)

_V2_ENTRIES = frozenset({".zarray", ".zgroup", ".zattrs"})


class ConsolidatedKeeper:
    def __init__(
        self, store: KvStore, exists: Callable[[str], bool], on_write: Callable[[str, bytes], None]
    ) -> None:
        self.store = store
        self._exists = exists
        self._on_write = on_write
        self._lock = threading.Lock()

    def after_change(self, key: str, data: bytes | None) -> list[str]:
        """``key`` was set to ``data`` (None: deleted); return the keys rewritten."""
        name = basename(key)
        with self._lock:
            if name in _V2_ENTRIES:
                return self._update_v2(key, data)
            if name == "zarr.json":
                return self._update_v3(key, data)
            return []

    def _load(self, key: str) -> dict[str, Any] | None:
        raw = self.store.get(key)
        try:
            doc = load_json(raw) if raw is not None else None
        except Rejected:
            return None
        return doc if isinstance(doc, dict) else None

    def _write(self, key: str, doc: dict[str, Any], *, indent: int) -> None:
        data = json.dumps(doc, indent=indent, sort_keys=indent == 4).encode()
        self.store.set(key, data)
        self._on_write(key, data)

    def _update_v2(self, key: str, data: bytes | None) -> list[str]:
        try:
            entry = load_json(data) if data is not None else None
        except Rejected:
            return []  # not JSON: validation would have refused it in strict mode
        written = []
        for root in reversed(folders_above(key)):  # nearest first
            zmeta = root + ".zmetadata"
            if not self._exists(zmeta):
                continue
            doc = self._load(zmeta)
            if doc is None or not isinstance(doc.get("metadata"), dict):
                log.warning("not updating %s: it is not consolidated metadata", zmeta)
                continue
            rel = key[len(root) :]
            if entry is None:
                doc["metadata"].pop(rel, None)
            else:
                doc["metadata"][rel] = entry
            self._write(zmeta, doc, indent=4)
            written.append(zmeta)
        return written

    def _update_v3(self, key: str, data: bytes | None) -> list[str]:
        try:
            entry = load_json(data) if data is not None else None
        except Rejected:
            return []
        folder = parent(key)
        written = []
        for root in reversed(folders_above(folder)) if folder else []:
            group_key = root + "zarr.json"
            if not self._exists(group_key):
                continue
            doc = self._load(group_key)
            block = doc.get("consolidated_metadata") if doc else None
            if (
                doc is None
                or not isinstance(block, dict)
                or not isinstance(block.get("metadata"), dict)
            ):
                continue
            children = dict(block["metadata"])
            rel = folder[len(root) :]
            if entry is None:
                children = {
                    k: v for k, v in children.items() if k != rel and not k.startswith(rel + "/")
                }
            else:
                children[rel] = entry
            doc["consolidated_metadata"] = consolidated_metadata(children)
            self._write(group_key, doc, indent=2)
            written.append(group_key)
        return written
