"""A store that acknowledges a write once it is journaled on local disk, and uploads it behind.

On S3 a synchronous write costs its caller a round trip or more; ``cp -r`` and the array
libraries write one file at a time per thread, so at 50 ms a round trip they wait on the
network, not on n5fs. This wrapper takes the round trip off the caller's path without taking
a promise back: everything above it (the gateway's validation at ``close()``, its commit
order) runs as before; what changes is when ``set`` returns. It returns once the value is in
the journal (:mod:`~n5fs.kvstore.writeback.journal`), fsync-ed, so a crash loses nothing it
acknowledged; uploads run on :mod:`~n5fs.kvstore.writeback.uploader`'s threads.

What is written behind and what is not:

- values (``set``, ``put_file``, ``move_file`` and their ``_with_mtime`` forms) are journaled;
  a *document* (``write_through(key)``: the gateway passes the format's metadata names) is
  written at once instead, after every pending write in its folder landed (a barrier), and
  so are conditional writes (``set_if``). So metadata always reaches the store before the
  chunks that depend on it and after the chunks written under the old one, a conflict of a
  metadata commit with another mount is answered at its ``close()`` as without write-back,
  and the journal holds only values that no metadata change can make invalid;
- deletes are synchronous, after the pending write of the key is dropped (or its upload in
  flight ended), so an upload never lands after the delete of its key;
- moves and copies (``rename``, ``copy``, prefix moves), ``set_mtime`` and versioned reads
  first wait for the pending writes they touch to land, then run on the store.

Reads see accepted writes at once (read-your-writes): ``get``, ``stat``, ``list`` and
``walk`` answer a pending key from the journal. Other mounts see it once uploaded.

Durability for the caller: :meth:`WriteBackStore.flush_key` (a file's ``fsync``) and
:meth:`flush` (``syncfs``, unmount, SIGTERM) wait for uploads and raise
:class:`~n5fs.errors.UploadsPending` when one could not land; the writes stay journaled and
are retried, and the next mount of the same source replays whatever is left.

Lock discipline: the wrapper's own state is :class:`~n5fs.kvstore.writeback.pending.Pending`'s
(one leaf condition); the journal needs none. No call of the inner store is made under a lock
of the wrapper's. Reads look a key up in the pending table *before* asking the inner store,
and an upload leaves the table only after the store acknowledged it, so a key is always in
one or the other.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import logging
import os
from typing import TYPE_CHECKING, ClassVar

from n5fs.errors import KeyNotFound, NoSpace, StoreUnavailable, UploadsPending
from n5fs.kvstore.abilities import LocalFiles, NameListings, WriteBack
from n5fs.kvstore.base import ByteRange, KeyInfo, Listing
from n5fs.kvstore.keys import folder_of
from n5fs.kvstore.wrappers import ForwardingStore
from n5fs.kvstore.writeback.journal import Journal
from n5fs.kvstore.writeback.pending import UPLOAD_DELAY, Pending, UploadFailed
from n5fs.kvstore.writeback.uploader import UPLOADERS, Uploader

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from n5fs.kvstore.base import KvStore, Versioned
    from n5fs.kvstore.writeback.journal import Entry

log = logging.getLogger(__name__)

__all__ = ["WriteBackStore"]

#: the default room of a journal
DEFAULT_LIMIT = 1 << 30
#: the longest a delete waits for an upload of its key in flight
_DROP_WAIT = 120.0


def _never(key: str) -> bool:
    return False


class WriteBackStore(ForwardingStore):
    """``inner`` with writes acknowledged from ``journal`` (module docstring)."""

    #: never :class:`LocalFiles` or :class:`NameListings`: a reader of the inner store's files
    #: or names would go around the journal (a journaled write unseen, a deleted one seen)
    passes_on: ClassVar[frozenset[type]] = (
        ForwardingStore.passes_on - {LocalFiles, NameListings}
    ) | {WriteBack}

    def __init__(
        self,
        inner: KvStore,
        journal: Journal,
        *,
        write_through: Callable[[str], bool] = _never,
        limit: int = DEFAULT_LIMIT,
        uploaders: int = UPLOADERS,
        room_wait: float = 30.0,
        delay: float = UPLOAD_DELAY,
    ) -> None:
        super().__init__(inner)
        self.journal = journal
        self._write_through = write_through
        self.pending = Pending(limit, room_wait=room_wait, delay=delay)
        replayed = journal.replayed
        for entry in replayed:
            gone = self.pending.add(entry, replayed=True)
            if gone is not None:
                self.journal.remove(gone.entry)
        if replayed:
            log.warning(
                "uploading %d writes (%d bytes) that an earlier mount of %s accepted and had "
                "not uploaded (journal %s)",
                len(replayed),
                sum(e.size for e in replayed),
                journal.source,
                journal.folder,
            )
        self._uploader = Uploader(
            self.pending, self._send, self.journal.remove, threads=uploaders, where=repr(inner)
        )
        self._closed = False

    def has_ability(self, kind: type) -> bool:
        if kind is WriteBack:
            return True
        return super().has_ability(kind)

    # -- writes -------------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        if self._accepts(key, len(value)):
            self._journal(key, value=value)
        else:
            self.inner.set(key, value)

    def set_with_mtime(self, key: str, value: bytes, mtime: float) -> bool:
        if self._accepts(key, len(value)):
            self._journal(key, value=value, mtime=mtime)
            return True
        return self.inner.set_with_mtime(key, value, mtime)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        if self._accepts(key, os.path.getsize(path)):
            self._journal(key, from_file=path)
        else:
            self.inner.put_file(key, path)

    def put_file_with_mtime(self, key: str, path: str | os.PathLike[str], mtime: float) -> bool:
        if self._accepts(key, os.path.getsize(path)):
            self._journal(key, from_file=path, mtime=mtime)
            return True
        return self.inner.put_file_with_mtime(key, path, mtime)

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        if self._accepts(key, os.path.getsize(path)):
            self._journal(key, from_file=path)
            os.unlink(path)
        else:
            self.inner.move_file(key, path)

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        self._barrier(key)
        return super().set_if(key, value, version=version)

    def _accepts(self, key: str, size: int) -> bool:
        """Journal this write (True), or write it at once (False: a document, after the
        barrier of its folder, or no room in the journal, after its key's pending write)."""
        self.inner.check_writable(key)
        if self._write_through(key):
            self._barrier(key)
            return False
        if self.pending.wait_for_room(size):
            return True
        log.warning("the write-back journal is full: /%s is written synchronously", key)
        self._drop(key)
        return False

    def _journal(self, key: str, **source: object) -> None:
        try:
            entry = self.journal.append(key, **source)  # type: ignore[arg-type]
        except FileNotFoundError as exc:
            raise KeyNotFound(f"/{key}: its source left the journal") from exc
        except OSError as exc:
            error = NoSpace if exc.errno == errno.ENOSPC else StoreUnavailable
            raise error(f"cannot journal /{key} in {self.journal.folder}: {exc}") from exc
        gone = self.pending.add(entry)
        if gone is not None:
            self.journal.remove(gone.entry)

    def _send(self, entry: Entry) -> None:
        if entry.deleted:
            with contextlib.suppress(KeyNotFound):
                self.inner.delete(entry.key)
            return
        with Journal.value(entry) as data:
            if entry.mtime is None:
                self.inner.set(entry.key, data)
            else:
                self.inner.set_with_mtime(entry.key, data, entry.mtime)

    # -- deletes ---------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        if self._accepts(key, 0):
            self._journal(key, deleted=True)
            return
        dropped = self._drop(key)
        try:
            self.inner.delete(key)
        except KeyNotFound:
            if not dropped:
                raise

    def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        dropped = sum(self._drop(e.key) for e in self.pending.entries_under(prefix))
        return max(dropped, self.inner.delete_prefix(prefix))

    def _drop(self, key: str) -> bool:
        try:
            job = self.pending.drop(key, _DROP_WAIT)
        except TimeoutError as exc:
            raise StoreUnavailable(f"cannot change /{key}: {exc}") from exc
        if job is None:
            return False
        self.journal.remove(job.entry)
        return True

    # -- calls that wait for what they touch ------------------------------------------------

    def copy(self, src: str, dst: str) -> None:
        self._settle(lambda k: k in (src, dst))
        self.inner.copy(src, dst)

    def rename(self, src: str, dst: str) -> None:
        """A journaled ``src`` moves inside the journal (a copy of its entry under ``dst``,
        then a delete of ``src``): a writer's temp file renamed over its chunk costs no round
        trip. Otherwise ``src`` is in the store and moves there, after ``dst``'s pending
        write is settled."""
        entry = self.pending.newest(src)
        if entry is not None and not entry.deleted and self._accepts(dst, entry.size):
            try:
                self._journal(dst, from_entry=entry, mtime=entry.mtime)
            except KeyNotFound:
                pass  # uploaded meanwhile: it is in the store
            else:
                self.delete(src)
                return
        self._settle(lambda k: k in (src, dst))
        self.inner.rename(src, dst)

    def copy_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        touched = {k for pair in pairs for k in pair}
        self._settle(touched.__contains__)
        self.inner.copy_many(pairs)

    def rename_prefix(self, src: str, dst: str) -> int:
        self._settle(lambda k: k.startswith((src, dst)))
        return self.inner.rename_prefix(src, dst)

    def set_mtime(self, key: str, mtime: float) -> None:
        self._settle(key.__eq__)
        self.inner.set_mtime(key, mtime)

    def get_versioned(self, key: str) -> Versioned | None:
        self._settle(key.__eq__)
        return super().get_versioned(key)

    def _barrier(self, key: str) -> None:
        """Every pending write in ``key``'s folder (and below it) lands first."""
        folder = folder_of(key)
        self._settle(lambda k: k.startswith(folder))

    def _settle(self, select: Callable[[str], bool]) -> None:
        try:
            self.pending.settle(select)
        except UploadFailed as exc:
            raise UploadsPending(self._unuploaded(str(exc))) from exc.error

    # -- reads ---------------------------------------------------------------------------------

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        while True:
            entry = self.pending.newest(key)
            if entry is None:
                return self.inner.get(key, byte_range)
            if entry.deleted:
                return None
            start, stop = (0, entry.size) if byte_range is None else byte_range.resolve(entry.size)
            try:
                return Journal.read(entry, start, stop)
            except FileNotFoundError:
                continue  # uploaded (or replaced) meanwhile: ask again

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return {key: self.get(key) for key in keys}

    def stat(self, key: str) -> KeyInfo | None:
        entry = self.pending.newest(key)
        if entry is None:
            return self.inner.stat(key)
        return None if entry.deleted else _info(entry)

    def nothing_at(self, key: str) -> bool:
        # a pending delete: the store may hold more under the name; let the listing say
        return self.pending.newest(key) is None and self.inner.nothing_at(key)

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        entries = self.pending.entries_under(prefix)  # before the store's: see the docstring
        listing = self.inner.list(prefix, delimiter)
        if not entries:
            return listing
        infos = {info.key: info for info in listing.keys}
        prefixes = set(listing.prefixes)
        deleted_under: set[str] = set()
        for entry in entries:
            rest = entry.key[len(prefix) :]
            cut = rest.find(delimiter) if delimiter else -1
            if cut >= 0:
                sub = prefix + rest[: cut + len(delimiter or "")]
                (deleted_under if entry.deleted else prefixes).add(sub)
            elif entry.deleted:
                infos.pop(entry.key, None)
            else:
                infos[entry.key] = _info(entry)
        for sub in deleted_under & prefixes:
            # a folder whose stored keys are all deleted here is gone already
            if not any(True for _ in self.walk(sub)):
                prefixes.discard(sub)
        keys = tuple(infos[k] for k in sorted(infos))
        return Listing(keys, tuple(sorted(prefixes)))

    def walk(self, prefix: str = "") -> Iterator[KeyInfo]:
        entries = self.pending.entries_under(prefix)
        stored = self.inner.walk(prefix)
        if not entries:
            yield from stored
            return
        mine = {e.key: e for e in entries}
        theirs = (info for info in stored if info.key not in mine)
        puts = sorted((_info(e) for e in mine.values() if not e.deleted), key=_by_key)
        yield from heapq.merge(theirs, puts, key=_by_key)

    # -- durability ------------------------------------------------------------------------------

    def flush_key(self, key: str) -> None:
        """A file's ``fsync``: its pending write lands (or this raises), then the store's own
        flush."""
        self._settle(key.__eq__)
        self.inner.flush()

    def flush(self) -> None:
        """Every pending write lands (or this raises :class:`UploadsPending`), then the
        store's own flush."""
        self._settle(lambda _: True)
        self.inner.flush()

    def writeback_report(self) -> dict[str, int]:
        return self.pending.report()

    def close(self) -> None:
        """Upload what is pending while uploads land; what cannot land now stays journaled
        for the next mount of the source (said in the log). Then close the store."""
        if self._closed:
            return
        self._closed = True
        try:
            self._settle(lambda _: True)
        except UploadsPending as exc:
            log.error("%s", exc)  # noqa: TRY400 (said in words; the journal keeps the writes)
        self._uploader.close()
        left = self.journal.pending_on_disk()
        self.journal.close()
        if left:
            log.warning(
                "%d accepted writes were not uploaded; they stay in %s and the next mount of "
                "%s uploads them",
                left,
                self.journal.folder,
                self.journal.source,
            )
        self.inner.close()

    def _unuploaded(self, first: str) -> str:
        report = self.pending.report()
        return (
            f"{report['writeback_pending_files']} accepted writes are not uploaded yet "
            f"({report['writeback_failing']} failing; first: {first}); they stay journaled in "
            f"{self.journal.folder}, are tried again, and the next mount of "
            f"{self.journal.source} uploads what is left"
        )


def _info(entry: Entry) -> KeyInfo:
    return KeyInfo(entry.key, entry.size, entry.accepted if entry.mtime is None else entry.mtime)


def _by_key(info: KeyInfo) -> str:
    return info.key
