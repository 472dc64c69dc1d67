"""The committer: classify + validate + store, in commit order, and everything a commit
changes afterwards (listings, cached bytes, detection, consolidated metadata, the kernel's
view through subscribers).

State and locks (the committer owns them):
- the commit order (:class:`~n5fs.gateway.commit.ordering.ArrayOrder`): every store write of a
  commit, a delete or a rename runs inside a ``hold`` of the folders it depends on, so chunk
  commits of one array run in parallel and a metadata commit excludes them;
- consolidated-metadata upkeep (:class:`~n5fs.gateway.commit.consolidated.ConsolidatedKeeper`) runs
  inside that hold and under the keeper's own lock: one read-modify-write at a time;
- rejections (a bounded deque) and subscribers under ``_lock``; counters under their own lock;
- chunk checks that run while a chunk is written (:mod:`~n5fs.gateway.commit.prevalidate`): a
  commit finishes its node's check *before* taking the commit order (the check needs no
  metadata), and uses it inside the order only if it was made for what the key is then.
All of these are leaf locks except the order: nothing waits for a node lock while holding them.
Callers hold the node lock of what they commit (see :mod:`n5fs.gateway.write.handles`).

The order of effects in a commit is the point: store first, then the caches are patched and
invalidated (still inside the hold), so a cache load that began before the store write is
grounded by the invalidation (:mod:`n5fs.singleflight`) and a chunk commit that waits for a
metadata commit sees the new metadata.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

from n5fs.errors import NotSupported, Rejected, StaleVersion
from n5fs.formats.registry import METADATA_NAMES
from n5fs.gateway.commit.consolidated import ConsolidatedKeeper
from n5fs.gateway.commit.ordering import ArrayOrder
from n5fs.gateway.commit.prevalidate import Precheck, Prechecks
from n5fs.gateway.commit.rules import UNREAD, CommitRules, Mode, Rejection, Unread
from n5fs.gateway.read.byte_cache import Counters, version_of
from n5fs.kvstore.abilities import part_writes
from n5fs.kvstore.keys import basename
from n5fs.locking import LEAF, assert_held, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from n5fs.detect import Detector
    from n5fs.gateway.commit.conditional import Conditional
    from n5fs.gateway.namespace.listings import NamespaceView
    from n5fs.gateway.read.reader import ObjectReader
    from n5fs.gateway.write.handles import Node
    from n5fs.gateway.write.staging import StagedFile, StagingBudget
    from n5fs.kvstore.base import KvStore
    from n5fs.workers import Workers

log = logging.getLogger(__name__)

#: content n5fs reads into memory to validate (a chunk or a metadata file) is at most this
MAX_VALIDATED_BYTES = 1 << 30


def is_metadata(key: str) -> bool:
    return basename(key) in METADATA_NAMES


class Committer:
    def __init__(
        self,
        store: KvStore,
        detector: Detector,
        view: NamespaceView,
        reader: ObjectReader,
        *,
        mode: Mode,
        max_rejections: int,
        budget: StagingBudget,
        conditional: Conditional,
        workers: Workers,
    ) -> None:
        self.store = store
        self.detector = detector
        self.view = view
        self.reader = reader
        self.mode = mode
        self.rules = CommitRules(store, detector, workers)
        self.order = ArrayOrder()
        self.conditional = conditional
        self.keeper = ConsolidatedKeeper(
            store, view.exists, self._written_by_keeper, conditional=conditional.writes
        )
        self.budget = budget
        #: the store as one that writes a value from its pieces, None where it joins them
        self.part_writer = part_writes(store)
        self.counters = Counters("commits", "rejections", "bytes_in", "prechecked")
        #: chunk checks while writes arrive; none when nothing is validated
        self.prechecks = (
            None
            if mode is Mode.OFF
            else Prechecks(
                self.rules.classifier, budget, max_bytes=MAX_VALIDATED_BYTES, workers=workers
            )
        )
        self._rejections: deque[Rejection] = deque(maxlen=max_rejections)
        #: (callback, told of its own writes?) - see :meth:`subscribe`
        self._subscribers: list[tuple[Callable[[Sequence[str]], None], bool]] = []
        self._lock = ranked_lock("rejections and subscribers", LEAF)

    def close(self) -> None:
        """Start no more chunk checks (after the last commit); the gateway's workers stop
        the threads."""
        if self.prechecks is not None:
            self.prechecks.close()

    # -- order ---------------------------------------------------------------------------------

    def hold(self, *keys: str) -> contextlib.AbstractContextManager[None]:
        """The commit-order hold for changing ``keys`` (metadata names exclusively)."""
        return self.order.for_keys(
            [k for k in keys if not is_metadata(k)], metadata=[k for k in keys if is_metadata(k)]
        )

    # -- subscribers (the kernel's view) ---------------------------------------------------------

    def subscribe(
        self, callback: Callable[[Sequence[str]], None], *, own_writes: bool = True
    ) -> None:
        """``own_writes=False``: not told of a key whose commit stored exactly the bytes
        written to it through the file calls (``written`` in :meth:`changed`); told of
        everything else the commit changed. That is the kernel's case: it wrote those bytes
        itself, so its pages and name are true already, and FUSE drops a file's cached size
        and times after every write. Telling it cost a thread round trip and a wait per
        committed file, more than the rest of a small file's commit (a ``cp -r`` of many
        small chunk files spent much of its time there)."""
        with self._lock:
            self._subscribers.append((callback, own_writes))

    def changed(self, keys: Iterable[str], *, written: str | None = None) -> None:
        """Tell subscribers which paths' cached entries are stale now (they must not block);
        ``written``: the one of ``keys`` whose new bytes were written through the file calls."""
        paths = ["/" + key for key in keys]
        with self._lock:
            subscribers = list(self._subscribers)
        own = None if written is None else "/" + written
        for callback, own_writes in subscribers:
            told = paths if own_writes or own is None else [p for p in paths if p != own]
            if told:
                _notify(callback, told)

    # -- rejections ------------------------------------------------------------------------------

    def rejections(self) -> list[Rejection]:
        with self._lock:
            return list(self._rejections)

    def refused(self, key: str, exc: Rejected) -> None:
        """Record a refusal decided outside the commit rules (a metadata name as a symlink)."""
        self._reject(key, exc, stored=False)

    def _reject(self, key: str, exc: Rejected, *, stored: bool) -> None:
        self.counters.add("rejections")
        with self._lock:
            self._rejections.append(Rejection.of(key, exc, stored=stored))
        log.warning("%s /%s: %s", "stored despite" if stored else "refused", key, exc)

    # -- validation ------------------------------------------------------------------------------

    def validate(
        self,
        key: str,
        load: Callable[[], bytes],
        size: int | None = None,
        pre: Precheck | None = None,
        stored: bytes | Unread | None = UNREAD,
    ) -> None:
        """Run the commit rules per mode; strict raises Rejected (EINVAL at the caller).
        The caller holds the commit order for ``key``; ``stored`` is its stored value where
        the caller read it already."""
        assert_held(self.order.holding)
        if self.mode is Mode.OFF:
            return
        if size is None or size > MAX_VALIDATED_BYTES:
            pre = None  # refused as too large, exactly as without the check
        try:
            verdict = self.rules.check(
                key, _bounded(key, load, size), pre=pre, size=size, stored=stored
            )
        except Rejected as exc:
            self._reject(key, exc, stored=self.mode is Mode.WARN)
            if self.mode is Mode.STRICT:
                self.changed([key])  # the kernel may hold an entry for the refused name
                raise
            return
        if pre is not None and size is not None and pre.holds_for(verdict, size):
            self.counters.add("prechecked")

    def would_refuse(self, key: str, data: bytes) -> Rejected | None:
        """What strict validation would refuse ``data`` at ``key`` for if it were committed
        now (None: it would be stored; warn and off modes refuse nothing). Records nothing,
        stores nothing, tells nobody: the answer of a ``close()`` whose commit comes later
        (a new file closed before anything was written to it). Inside the hold of ``key``,
        as a commit's check is, so it judges against settled metadata."""
        if self.mode is not Mode.STRICT:
            return None
        with self.hold(key):
            try:
                self.rules.check(key, lambda: data, size=len(data))
            except Rejected as exc:
                return exc
        return None

    # -- commits ---------------------------------------------------------------------------------

    def commit_node(self, node: Node) -> None:
        """Validate and store the node's staged bytes (caller holds ``node.lock``). On refusal
        the store keeps its value and the staged bytes are dropped (the next read sees the
        stored value)."""
        assert_held(node.lock)
        staged = node.staged
        assert staged is not None
        key = node.key
        pre = self.prechecks.finish(staged) if self.prechecks is not None else None
        with contextlib.ExitStack() as memory:
            content = _Content(staged, self.budget, memory)
            if (pre is None or not pre.passed) and self.mode is not Mode.OFF and staged.spilled:
                # a full check reads the spilled content back whole: wait for working memory
                # here, before the commit order, never inside it
                memory.enter_context(self.budget.borrow(staged.size))
                content.borrowed = True
            self._commit_content(node, key, staged, content, pre)

    def _commit_content(
        self, node: Node, key: str, staged: StagedFile, content: _Content, pre: Precheck | None
    ) -> None:
        with self.hold(key):
            try:
                spilled = staged.spill_path()
                version, mtime = self.write(
                    key,
                    content.whole,
                    staged.size,
                    node.base,
                    pre=pre,
                    spilled=spilled,
                    mtime=node.mtime,
                    parts=content.parts if self.part_writer is not None else None,
                )
            except Rejected:
                node.dirty = False
                node.mtime = None  # it belonged to the refused content
                node.base = None
                staged.close()
                node.staged = None
                raise
            node.mtime = None
            node.base = version
            self.after_set(
                key,
                staged.size,
                None if spilled else content.joined,
                mtime,
                version,
                written_through=True,
            )
        node.dirty = False
        node.stored = True

    def versioned(self, key: str) -> bool:
        """Is a commit of ``key`` a compare-and-swap (a metadata name, conditional writes in
        force: :mod:`n5fs.gateway.commit.conditional`)?"""
        return self.conditional.in_force and is_metadata(key)

    def base_of(self, key: str) -> str | None:
        """The version a commit of ``key`` starting now compares with: what the view shows."""
        return self.conditional.base_of(self.view.info(key)) if self.versioned(key) else None

    def write(
        self,
        key: str,
        load: Callable[[], bytes],
        size: int | None,
        base: str | None,
        *,
        pre: Precheck | None = None,
        spilled: str | None = None,
        mtime: float | None = None,
        parts: Callable[[], Sequence[memoryview] | None] | None = None,
    ) -> tuple[str | None, float | None]:
        """Validate and store ``load()`` at ``key`` (caller holds the order for ``key``), with
        the modification time ``mtime`` if one was set while it was staged (``cp -a`` sets it
        before ``close()``: on S3 it then rides the PUT); return the stored version where one
        is kept and the time where one was kept. A metadata commit compares ``base`` with the
        version it validates against and writes only if that is still current
        (:class:`~n5fs.errors.StaleVersion` otherwise: recorded, the key's cached entries
        dropped)."""
        assert_held(self.order.holding)
        if not self.versioned(key):
            self.validate(key, load, size, pre)
            if mtime is None:
                writer = self.part_writer if parts is not None and spilled is None else None
                pieces = parts() if writer is not None and parts is not None else None
                if spilled is not None:
                    self.store.put_file(key, spilled)
                elif writer is not None and pieces is not None:
                    writer.set_parts(key, pieces)
                else:
                    self.store.set(key, load())
                return None, None
            if spilled is not None:
                kept = self.store.put_file_with_mtime(key, spilled, mtime)
            else:
                kept = self.store.set_with_mtime(key, load(), mtime)
            return None, mtime if kept else None
        try:
            current = self.conditional.current(key)
            if self.conditional.unchanged(key, base, current, load()):
                assert current is not None
                return current.version, self.keep_mtime(key, mtime)
            self.validate(key, load, size, pre, None if current is None else current.data)
            version = self.conditional.put(key, load(), current)
            return version, self.keep_mtime(key, mtime)
        except StaleVersion as exc:
            self._reject(key, exc, stored=False)
            self.forget(key)
            raise

    def forget(self, key: str) -> None:
        """Drop what this mount caches of ``key`` (another writer changed it)."""
        self.view.forget(key)
        self.reader.cache.invalidate(key)
        self.detector.invalidate(key)
        self.changed([key])

    def set_mtime(self, key: str, mtime: float, size: int) -> None:
        """Give the stored ``key`` (``size`` bytes) the modification time ``mtime``."""
        with self.hold(key):
            if self.keep_mtime(key, mtime) is None:
                return
            self.view.note_set(key, size, mtime)
            self.reader.cache.invalidate(key)
        self.changed([key])

    def keep_mtime(self, key: str, mtime: float | None) -> float | None:
        """Store ``mtime`` for ``key`` where the store can keep one (``utimens``: what makes
        ``rsync -a`` incremental); None when there is none to keep or the store cannot."""
        if mtime is None:
            return None
        try:
            self.store.set_mtime(key, mtime)
        except NotSupported:
            return None
        return mtime

    def commit_bytes(self, key: str, data: bytes, base: str | None = None) -> None:
        """Validate and store ``data`` at ``key`` (links, symlinks)."""
        with self.hold(key):
            self.store_bytes(key, data, base)

    def store_bytes(self, key: str, data: bytes, base: str | None = None) -> None:
        """``commit_bytes`` for a caller that already holds the order for ``key``."""
        version, _ = self.write(key, lambda: data, len(data), base)
        self.after_set(key, len(data), data, None, version)

    def after_set(
        self,
        key: str,
        size: int,
        data: bytes | None,
        mtime: float | None = None,
        version: str | None = None,
        *,
        written_through: bool = False,
    ) -> None:
        """``key`` was stored (``data`` when in memory; ``mtime`` when one was kept): patch
        what is cached, keep consolidated metadata true, tell subscribers. Inside the hold
        of ``key``. ``written_through``: the stored bytes are the ones written to ``key``
        through the file calls (:meth:`subscribe`)."""
        assert_held(self.order.holding)
        self.counters.add("commits")
        self.counters.add("bytes_in", size)
        self._note_written(key, size, data, mtime, version)
        changed = [key]
        if self.mode is not Mode.OFF and is_metadata(key):
            if data is None:
                data = self.store.get(key)
            changed += self.keeper.after_change(key, data)
        self.changed(changed, written=key if written_through else None)

    def _note_written(
        self,
        key: str,
        size: int,
        data: bytes | None,
        mtime: float | None = None,
        version: str | None = None,
    ) -> None:
        info = self.view.note_set(key, size, mtime, version)
        if data is not None:
            self.reader.cache.put(key, version_of(info), data)
        else:
            self.reader.cache.invalidate(key)
        self.detector.invalidate(key)

    def _written_by_keeper(self, key: str, data: bytes, version: str | None) -> None:
        self._note_written(key, len(data), data, None, version)

    def after_delete(self, key: str) -> None:
        """``key`` was removed from the store (inside the hold of ``key``)."""
        assert_held(self.order.holding)
        self.view.note_delete(key)
        self.reader.cache.invalidate(key)
        self.detector.invalidate(key)
        changed = [key]
        if self.mode is not Mode.OFF and is_metadata(key):
            changed += self.keeper.after_change(key, None)
        self.changed(changed)


class _Content:
    """A staged file's bytes for one commit: joined into one value only when something needs
    them whole (a full check, a conditional or timed write, a store that cannot take parts),
    and then once, shared by validation, the store and the byte cache. Otherwise a store that
    writes parts gets the pieces the file was written in, and the join - a copy of every byte
    - never happens."""

    def __init__(
        self, staged: StagedFile, budget: StagingBudget, memory: contextlib.ExitStack
    ) -> None:
        self._staged = staged
        self._budget = budget
        self._memory = memory
        #: working memory for the joined bytes is held (until the commit ends)
        self.borrowed = False
        self.joined: bytes | None = None

    def whole(self) -> bytes:
        if self.joined is None:
            if self._staged.spilled and not self.borrowed:
                # inside the commit order: counted, never waited for
                self._memory.enter_context(self._budget.borrow(self._staged.size, wait=0))
                self.borrowed = True
            self.joined = self._staged.getvalue()
        return self.joined

    def parts(self) -> Sequence[memoryview] | None:
        """The pieces, unjoined (None: not held that way, or joined already: write that)."""
        return None if self.joined is not None else self._staged.parts()


def _bounded(key: str, load: Callable[[], bytes], size: int | None) -> Callable[[], bytes]:
    """``load``, refusing content too large to validate in memory (before reading it)."""
    if size is None or size <= MAX_VALIDATED_BYTES:
        return load

    def refuse() -> bytes:
        raise Rejected(
            f"{size} bytes is more than the {MAX_VALIDATED_BYTES} bytes n5fs validates in "
            "memory for a chunk or metadata file",
            path=key,
            fmt="",
            rule="too-large-to-validate",
        )

    return refuse


def _notify(callback: Callable[[Sequence[str]], None], paths: Sequence[str]) -> None:
    try:
        callback(paths)
    except Exception:
        log.exception("a change subscriber failed")
