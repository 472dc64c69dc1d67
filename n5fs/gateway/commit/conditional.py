"""Conditional metadata commits: what lets many mounts of one bucket (one per node of a
cluster) write one hierarchy without losing each other's metadata updates.

A metadata document is shared by every node: ``.zarray``, ``zarr.json``, ``attributes.json``
and the consolidated documents n5fs keeps. Writing one blindly is last-writer-wins: a node
that resizes an array while another edits its attributes silently undoes one of them, and
two nodes creating one array both believe they created it. Where the store honours
conditional writes (S3 ``If-Match``/``If-None-Match``, probed once at mount), every metadata
commit is a compare-and-swap against the version this mount *read*:

- the **base** of a commit is the version the mount's view showed when the file was opened
  for writing or the rename began (an S3 ETag; :data:`ABSENT` when the mount saw no such key:
  the write is then create-only). ``None`` means unknown (the mount wrote the key with a plain
  write): the commit then compares against the version it validates against;
- the commit reads the current version uncached (:meth:`Conditional.current`), validates
  against it, and writes with ``If-Match`` (``If-None-Match: *`` when absent). A base that is
  no longer current, or a write that loses the race between that read and the PUT, is
  refused with :class:`~n5fs.errors.StaleVersion` (EAGAIN): nothing stored, the mount's cached
  entry dropped, so reading the file again and retrying succeeds. The one exception: new
  bytes equal to the current ones are no conflict (two nodes creating the same array with the
  same metadata both succeed; only one write happens), also when the other's write lands
  between this commit's read and its write;
- consolidated documents are merged, not refused (:mod:`n5fs.gateway.commit.consolidated`): a lost
  race re-reads the latest document and merges again, with bounded jittered retries.

Where conditional writes are not in force (a file or zip store, an endpoint that ignores the
headers, ``-o conditional=off``) every method here degrades to today's single-writer
behaviour: plain writes, no version kept. ``reason`` says why (``n5fs status`` shows it).

State: ``reason`` is decided once, before the gateway serves a call, and never changes; the
conflict counter has its own leaf lock (:class:`~n5fs.gateway.read.byte_cache.Counters`). Callers hold
the commit order of the key (:mod:`n5fs.gateway.commit.ordering`), so one mount never races itself
between :meth:`current` and :meth:`put`; the race left is with other mounts, and that is
what the version answers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from n5fs.errors import StaleVersion, VersionConflict
from n5fs.gateway.read.byte_cache import Counters
from n5fs.kvstore.abilities import conditional_writes
from n5fs.kvstore.base import Versioned

if TYPE_CHECKING:
    from n5fs.kvstore.abilities import ConditionalWrites
    from n5fs.kvstore.base import KeyInfo, KvStore

log = logging.getLogger(__name__)

#: the base of a commit whose key the mount saw absent: the write is create-only
ABSENT = ""

#: the rule name of a refused stale commit (logs, ``/.n5fs/rejections``, tests)
STALE_RULE = "stale-version"


class Conditional:
    """Compare-and-swap of metadata commits against the version the mount read."""

    def __init__(self, store: KvStore, *, reason: str | None) -> None:
        self.store = store
        #: the store's conditional writes while they are in force, else None
        self.writes: ConditionalWrites | None = (
            conditional_writes(store) if reason is None else None
        )
        if reason is None and self.writes is None:
            reason = _lacking(store)
        #: None when conditional writes are in force, else why not
        self.reason = reason
        self.counters = Counters("conflicts", "conditional_commits")

    @classmethod
    def probe(cls, store: KvStore, *, wanted: bool) -> Conditional:
        """Ask the store once (S3: two create-only PUTs of a scratch key) and log the answer:
        a warning where other mounts may share the store and it said no."""
        if not wanted:
            return cls(store, reason="turned off (-o conditional=off)")
        writes = conditional_writes(store)
        reason = _lacking(store) if writes is None else writes.probe_conditional_writes()
        where = store.spec.to_url()
        traits = store.traits
        if reason is None:
            log.info("conditional writes in force on %s: metadata commits compare-and-swap", where)
        elif traits.shared_versions and traits.writable:  # a read-only mount commits nothing
            log.warning("%s", cls(store, reason=reason).announcement())
        else:
            log.info("no conditional writes on %s (%s): single writer", where, reason)
        return cls(store, reason=reason)

    def announcement(self) -> str:
        """What a mount whose shared store refused conditional writes says (log, terminal)."""
        return (
            f"no conditional writes on {self.store.spec.to_url()} ({self.reason}): metadata "
            "commits are last-writer-wins; run one writing mount per hierarchy"
        )

    @property
    def in_force(self) -> bool:
        return self.reason is None

    def base_of(self, info: KeyInfo | None) -> str | None:
        """The base a commit of a key the view shows as ``info`` compares with."""
        if not self.in_force:
            return None
        return ABSENT if info is None else info.etag

    def current(self, key: str) -> Versioned | None:
        """The stored value and version now, read past every cache (no version where
        conditional writes are not in force)."""
        if self.writes is None:
            data = self.store.get(key)
            return None if data is None else Versioned(data, None)
        return self.writes.get_versioned(key)

    def unchanged(self, key: str, base: str | None, current: Versioned | None, data: bytes) -> bool:
        """Check the commit's base against ``current``: True when ``data`` is what the store
        holds already (nothing to write), False when the commit goes ahead; StaleVersion when
        another writer changed the key since this mount read it."""
        if current is not None and current.data == data:
            return True
        if base is None:
            return False
        now = ABSENT if current is None else current.version
        if now == base:
            return False
        raise self._stale(key, base, now)

    def put(self, key: str, data: bytes, current: Versioned | None) -> str | None:
        """Write ``data`` if the key is still at ``current``; return the new version."""
        writes = self.writes
        if writes is None:
            self.store.set(key, data)
            return None
        version = None if current is None else current.version
        try:
            new = writes.set_if(key, data, version=version)
        except VersionConflict:
            # Lost the race between the read and the write. Another writer storing these
            # very bytes is no conflict, as in :meth:`unchanged` (every node's zarr-python
            # writes the root's ``{}`` attributes where it saw none)
            now = writes.get_versioned(key)
            if now is not None and now.data == data:
                return now.version
            raise self._stale(key, ABSENT if version is None else version, None) from None
        self.counters.add("conditional_commits")
        return new

    def _stale(self, key: str, base: str, now: str | None) -> StaleVersion:
        self.counters.add("conflicts")
        seen = "absent" if base == ABSENT else f"version {base}"
        found = "absent" if now == ABSENT else f"version {now}" if now else "written again"
        return StaleVersion(
            f"another writer changed this metadata since this mount read it ({seen}, now "
            f"{found}); nothing was stored: read it again and retry",
            path=key,
            fmt="",
            rule=STALE_RULE,
        )


def _lacking(store: KvStore) -> str:
    """Why a store without :class:`~n5fs.kvstore.abilities.ConditionalWrites` has none."""
    return f"{type(store).__name__} has no conditional writes"
