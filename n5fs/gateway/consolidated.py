"""Keep consolidated metadata true: after every metadata commit, every consolidated document
above the key (v2 ``.zmetadata``, v3 inline ``consolidated_metadata``: whatever the formats
declare as their :class:`~n5fs.formats.base.Consolidation`) gets the new entry.

Stale consolidated metadata is the most reported zarr complaint: a reader that trusts it never
sees an array written after consolidation. The writes here go straight to the store (they are
derived from metadata that was just validated) and are reported through ``on_write``. A
document is rewritten only when its content changes: after ``cp -r`` of a consolidated
hierarchy every entry is already true and the copied bytes stay as they are.

Concurrency: upkeep is a read-modify-write of a shared document; two metadata commits in
different folders of one hierarchy run at the same time (each holds only its own folder
exclusively) and would lose an entry. ``after_change`` therefore runs under the keeper's lock:
one upkeep at a time, each reading the document the previous one wrote. Callers hold the
commit order of the metadata key (so the document is never rewritten by a commit of the
consolidated file itself meanwhile); the lock is taken inside that, and nothing is acquired
under it but cache (leaf) locks.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from n5fs.codecs.jsondoc import load_json
from n5fs.errors import Rejected
from n5fs.formats.registry import CONSOLIDATIONS

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.formats.base import Consolidation
    from n5fs.kvstore.base import KvStore

log = logging.getLogger(__name__)


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
        try:
            entry = load_json(data) if data is not None else None
        except Rejected:
            return []  # not JSON: validation would have refused it in strict mode
        written: list[str] = []
        with self._lock:
            for consolidation in CONSOLIDATIONS:
                written += [
                    doc_key
                    for doc_key in consolidation.documents(key)
                    if self._update(consolidation, doc_key, key, entry)
                ]
        return written

    def _update(self, consolidation: Consolidation, doc_key: str, key: str, entry: Any) -> bool:
        if doc_key == key or not self._exists(doc_key):
            return False
        doc = self._load(doc_key)
        new = consolidation.updated(doc_key, doc, key, entry) if doc is not None else None
        if new is None:
            if doc is None:
                log.warning("not updating %s: it is not a JSON object", doc_key)
            return False
        if new == doc:
            return False  # already true: leave the bytes alone
        data = consolidation.serialize(new)
        self.store.set(doc_key, data)
        self._on_write(doc_key, data)
        return True

    def _load(self, key: str) -> dict[str, Any] | None:
        raw = self.store.get(key)
        try:
            doc = load_json(raw) if raw is not None else None
        except Rejected:
            return None
        return doc if isinstance(doc, dict) else None
