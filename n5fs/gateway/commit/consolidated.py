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

Other mounts of the same bucket keep the same documents, and no lock reaches them. Where
conditional writes are in force (:mod:`n5fs.gateway.commit.conditional`) each rewrite is a
compare-and-swap: read the document with its version, merge, write ``If-Match`` that version
(``If-None-Match`` never: a document is only kept, never created here). A lost race re-reads
the key's current value and the latest document and merges again, after a jittered pause,
up to :data:`ATTEMPTS` times (about 4 s in all), so no node's entry is lost. A document still contended after
that is logged as an error and left for the next upkeep (or ``n5fs validate``) to repair.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

from n5fs.codecs.jsondoc import load_json
from n5fs.errors import Rejected, VersionConflict
from n5fs.formats.registry import CONSOLIDATIONS
from n5fs.locking import CONSOLIDATED, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.formats.base import Consolidation
    from n5fs.kvstore.abilities import ConditionalWrites
    from n5fs.kvstore.base import KvStore

log = logging.getLogger(__name__)

#: compare-and-swap attempts of one document rewrite before giving up (logged)
ATTEMPTS = 12
#: the first pause after a lost race, doubled each time up to MAX_PAUSE (with jitter), in
#: seconds: a document contended all the way holds its commit about 4 s at most
BACKOFF = 0.01
MAX_PAUSE = 0.5


class ConsolidatedKeeper:
    def __init__(
        self,
        store: KvStore,
        exists: Callable[[str], bool],
        on_write: Callable[[str, bytes, str | None], None],
        *,
        conditional: ConditionalWrites | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self._exists = exists
        self._on_write = on_write
        #: the store's conditional writes while in force (each rewrite a compare-and-swap)
        self._conditional = conditional
        self._sleep = sleep
        self._lock = ranked_lock("consolidated metadata", CONSOLIDATED)
        #: lost compare-and-swap races, documents given up on (read by the control entries)
        self.retries = 0
        self.given_up = 0

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
                    if self._keep(consolidation, doc_key, key, entry)
                ]
        return written

    def _keep(self, consolidation: Consolidation, doc_key: str, key: str, entry: Any) -> bool:
        if doc_key == key or not self._exists(doc_key):
            return False
        if self._conditional is None:
            return self._update(consolidation, doc_key, key, entry)
        pause = BACKOFF
        for attempt in range(ATTEMPTS):
            if attempt:
                self.retries += 1
                self._sleep(pause * (0.5 + random.random()))
                pause = min(pause * 2, MAX_PAUSE)
                entry = _parsed(self.store.get(key))  # another node may have changed it too
            try:
                return self._update(consolidation, doc_key, key, entry)
            except VersionConflict:
                continue
        self.given_up += 1
        log.error(
            "%s: gave up keeping the entry of /%s after %d lost races with other writers; "
            "`n5fs validate` reports the document stale",
            doc_key,
            key,
            ATTEMPTS,
        )
        return False

    def _update(self, consolidation: Consolidation, doc_key: str, key: str, entry: Any) -> bool:
        """One read-merge-write; VersionConflict when another writer rewrote the document
        between the read and the write (conditional writes only)."""
        writes = self._conditional
        if writes is not None:
            got = writes.get_versioned(doc_key)
            raw = got.data if got is not None else None
        else:
            got, raw = None, self.store.get(doc_key)
        doc = _document(raw)
        new = consolidation.updated(doc_key, doc, key, entry) if doc is not None else None
        if new is None:
            if raw is not None and doc is None:
                log.warning("not updating %s: it is not a JSON object", doc_key)
            return False
        if new == doc:
            return False  # already true: leave the bytes alone
        data = consolidation.serialize(new)
        version = None
        if writes is not None and got is not None:
            version = writes.set_if(doc_key, data, version=got.version)
        else:
            self.store.set(doc_key, data)
        self._on_write(doc_key, data, version)
        return True


def _parsed(raw: bytes | None) -> Any:
    """The JSON value of ``raw``; None when absent or not JSON."""
    try:
        return load_json(raw) if raw is not None else None
    except Rejected:
        return None


def _document(raw: bytes | None) -> dict[str, Any] | None:
    doc = _parsed(raw)
    return doc if isinstance(doc, dict) else None
