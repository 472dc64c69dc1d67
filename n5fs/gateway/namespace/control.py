"""The control entries under ``/.n5fs/`` (what the mount reports about itself), and the
housekeeping they report on.

``rejections`` lists refused (or, in warn mode, flagged) commits as JSON lines;
``stats.json`` holds the counters ``n5fs status`` and systemd's STATUS= show, and the
settings that decide what other mounts' commits this one sees (``consistency``,
``conditional_writes``: "in force" or why not), padded to a fixed size (:func:`padded`).
Both are rendered when opened, from the owners' thread-safe snapshots. The only state here is the
count of leftovers the mount's sweep removed, guarded by ``_lock`` (a leaf lock).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound, N5fsError
from n5fs.gateway.namespace.paths import CONTROL
from n5fs.kvstore.abilities import write_back
from n5fs.locking import LEAF, ranked_lock

if TYPE_CHECKING:
    from n5fs.gateway.commit.committer import Committer
    from n5fs.gateway.namespace.listings import NamespaceView
    from n5fs.gateway.read.reader import ObjectReader
    from n5fs.gateway.write.handles import OpenFiles
    from n5fs.gateway.write.staging import StagingBudget
    from n5fs.kvstore.base import KvStore

log = logging.getLogger(__name__)

#: ``stats.json`` is padded with spaces to a multiple of this many bytes
STATS_BLOCK = 4096


def padded(text: str) -> bytes:
    """``text`` and a newline, padded with spaces (JSON allows them) to a multiple of
    :data:`STATS_BLOCK` bytes: the counters change between a reader's ``stat`` and its
    reads, the size does not. Where the kernel reads the file through its page cache (a
    read-only mount's zero-message opens, :mod:`~n5fs.gateway.read.unopened`) it reads up to the
    size it was told, so a document of another length would come out cut or padded with
    zeros; this way a read is whole, at worst a moment old."""
    raw = text.encode()
    size = -(-(len(raw) + 1) // STATS_BLOCK) * STATS_BLOCK
    return raw + b" " * (size - len(raw) - 1) + b"\n"


class ControlEntries:
    def __init__(
        self,
        committer: Committer,
        view: NamespaceView,
        reader: ObjectReader,
        files: OpenFiles,
        budget: StagingBudget,
        store: KvStore,
        consistency: str = "ttl",
    ) -> None:
        self.committer = committer
        self.store = store
        self.consistency = consistency
        self.view = view
        self.reader = reader
        self.files = files
        self.budget = budget
        #: leftovers of dead writers removed by :meth:`sweep` (under ``_lock``)
        self.leftovers_removed = 0
        self._lock = ranked_lock("control entries", LEAF)

    def sweep(self, store: KvStore) -> int:
        """Remove the leftovers of dead writers (:meth:`KvStore.sweep`), log and count them."""
        try:
            removed = store.sweep()
        except (N5fsError, OSError) as exc:
            log.warning("could not remove leftovers of interrupted writers: %s", exc)
            return 0
        for leftover in removed:
            log.info("removed %s", leftover.describe())
        with self._lock:
            self.leftovers_removed += len(removed)
        return len(removed)

    def content(self, key: str) -> bytes:
        name = key.removeprefix(CONTROL + "/")
        if name == "rejections":
            lines = (r.to_json_line() + "\n" for r in self.committer.rejections())
            return "".join(lines).encode()
        if name == "stats.json":
            doc = {**self.stats(), **self.settings()}
            return padded(json.dumps(doc, indent=2, sort_keys=True))
        raise KeyNotFound(f"/{key}")

    def settings(self) -> dict[str, str]:
        """What this mount promises about other writers of its store (``n5fs status``)."""
        reason = self.committer.conditional.reason
        return {
            "consistency": self.consistency,
            "conditional_writes": "in force" if reason is None else f"off: {reason}",
        }

    def stats(self) -> dict[str, int]:
        listings, cache = self.view.listings, self.reader.cache
        keeper = self.committer.keeper
        return {
            **self.committer.counters.snapshot(),
            **self.committer.conditional.counters.snapshot(),
            "consolidation_retries": keeper.retries,
            "consolidation_given_up": keeper.given_up,
            "listing_hits": listings.hits,
            "listing_misses": listings.misses,
            "listing_loads_discarded": listings.discarded,
            "listing_bytes": listings.nbytes,
            "listings_evicted": listings.evicted,
            "store_reads": self.reader.store_reads,
            "bytes_out": self.reader.bytes_out,
            "cache_hits": cache.hits,
            "cache_misses": cache.misses,
            "cache_bytes": cache.size,
            "staging_bytes": self.budget.used,
            "staging_lent": self.budget.lent,
            "staging_peak_lent": self.budget.peak_lent,
            "staging_overdrawn": self.budget.overdrawn,
            "open_handles": self.files.handle_count(),
            "leftovers_removed": self.leftovers_removed,
            **self.store.fault_counters(),
            **self._uploads(),
        }

    def _uploads(self) -> dict[str, int]:
        """Writes accepted and not uploaded yet, where the store writes behind."""
        uploads = write_back(self.store)
        return {} if uploads is None else uploads.writeback_report()
