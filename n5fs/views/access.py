"""How a view reads the store: through the gateway's listings, detector and byte cache.

A view never talks to the store behind the gateway's back for names: a file's existence,
size and mtime come from the gateway's cached listings (one LIST per folder answers every
lookup in it), a folder's format from its detector. Object bytes come through
:meth:`ObjectReader.whole <n5fs.gateway.read.reader.ObjectReader.whole>` (one GET, kept in the
gateway's byte LRU) or, for pieces of a shard, one ranged GET.

What a view computes from stored bytes (a transcoded chunk, a padded end block, decoded
values for ``.npy`` reads, a shard's index) is kept in the same byte LRU, under keys no store
key can equal (they start with a NUL byte, which :func:`~n5fs.kvstore.keys.check_key`
refuses), tagged with the source object's version (size, mtime): a source that changed is
read afresh, and the mount's memory stays within one ``cache_size`` budget. What a view makes
from metadata alone (an N5 block holding a fill value) is kept there too, under a key that
names every input (:meth:`StoreAccess.from_metadata`): it never goes stale.

Counters (``source_reads``, ``translated``, ``decoded``...) say what the view did; they are
what ``/.n5fs/view.json`` shows and what tests count. Thread-safe: the gateway's caches are,
:class:`~n5fs.gateway.read.byte_cache.Counters` locks, and a computation runs single-flight (the
kernel reads a file in parallel 128 KiB pieces: threads asking for one chunk's decoded values
wait for one decode). A follower whose leader's result was not cached (too large for the LRU,
or overtaken) computes its own.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

from n5fs.detect import Folder, FolderKind
from n5fs.errors import DetectionFailed, Rejected
from n5fs.gateway.namespace.paths import Attr, EntryKind
from n5fs.gateway.read.byte_cache import Counters
from n5fs.kvstore.base import ByteRange

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from n5fs.gateway import Gateway
    from n5fs.gateway.read.byte_cache import Version

_TAG = "\x00view\x00"
COUNTERS = (
    "source_reads",
    "source_bytes",
    "translated",
    "decoded",
    "shard_indexes",
    "fill_blocks",
)


#: the version of what no stored object goes into (:meth:`StoreAccess.from_metadata`)
_NO_OBJECT = Attr(EntryKind.FILE)


def version_of(attr: Attr) -> Version:
    return (attr.size, attr.mtime)


class StoreAccess:
    """The gateway's store, read as a view reads it (see the module docs)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.detector = gateway.detector
        self.cache = gateway.reader.cache
        self.counters = Counters(*COUNTERS)
        #: computations under way, by cache tag (``_lock``: a leaf lock, dictionary work only)
        self._flights: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    # -- names ---------------------------------------------------------------------------------

    def folder(self, prefix: str) -> Folder:
        """What the folder at ``prefix`` is; a folder whose metadata is broken or ambiguous
        is a plain folder to a view (shown as it is stored; ``detect`` says why)."""
        try:
            return self.detector.folder(prefix)
        except (DetectionFailed, Rejected):
            return Folder(prefix, FolderKind.PLAIN)

    def lookup(self, key: str) -> Attr | None:
        return self.gateway.lookup("/" + key)

    def file(self, key: str) -> Attr | None:
        """The stored object ``key`` (None: absent, or a folder)."""
        attr = self.lookup(key)
        return attr if attr is not None and attr.kind is EntryKind.FILE else None

    def listing(self, key: str) -> Sequence[tuple[str, Attr]]:
        return self.gateway.readdir("/" + key)

    # -- bytes ---------------------------------------------------------------------------------

    def whole(self, key: str, attr: Attr) -> bytes | None:
        """The whole object (None: it vanished)."""
        version = version_of(attr)
        data = self.cache.get(key, version)
        if data is not None:
            return data
        data = self.gateway.reader.whole(key, version)
        if data is not None:
            self._fetched(len(data))
        return data

    def ranged(self, key: str, attr: Attr, start: int, length: int) -> bytes | None:
        """``length`` bytes at ``start`` of the object (a shard's inner chunk), cached."""
        return self.computed(
            f"range\x00{start}\x00{length}", key, attr, lambda: self.fetch(key, start, length)
        )

    def fetch(self, key: str, start: int, length: int) -> bytes | None:
        """One ranged GET, not cached (the caller caches what it makes of it)."""
        data = self.gateway.store.get(key, ByteRange(start, length))
        if data is not None:
            self._fetched(len(data))
        return data

    def computed(
        self, kind: str, key: str, attr: Attr, make: Callable[[], bytes | None]
    ) -> bytes | None:
        """What ``make`` computes from the object ``key`` (of version ``attr``), cached."""
        tag = f"{_TAG}{kind}\x00{key}"
        version = version_of(attr)
        data = self.cache.get(tag, version)
        if data is not None:
            return data
        with self._lock:
            flight = self._flights.get(tag)
            leader = flight is None
            if flight is None:
                flight = self._flights[tag] = threading.Event()
        if not leader:  # the kernel's parallel reads of one chunk: one decode for all
            flight.wait()
            data = self.cache.get(tag, version)
            if data is not None:
                return data
        try:
            ticket = self.cache.ticket(tag)
            data = make()
            if data is not None:
                self.cache.fill(ticket, version, data)
            return data
        finally:
            if leader:
                with self._lock:
                    del self._flights[tag]
                flight.set()

    def from_metadata(self, kind: str, key: str, make: Callable[[], bytes]) -> bytes:
        """What ``make`` computes from metadata alone, no stored object read; ``key`` names
        every input, so one version fits all, cached like the rest."""
        data = self.computed(kind, key, _NO_OBJECT, make)
        assert data is not None
        return data

    def _fetched(self, nbytes: int) -> None:
        self.counters.add("source_reads")
        self.counters.add("source_bytes", nbytes)

    def count(self, name: str) -> None:
        self.counters.add(name)

    def stats(self) -> dict[str, int]:
        return self.counters.snapshot()


def with_size(attr: Attr, size: int) -> Attr:
    return dataclasses.replace(attr, size=size, writable=False)
