"""Kept modification times that a LIST shows: one hidden index object per folder.

Why: ``set_mtime`` keeps a time in the object's ``x-amz-meta-mtime`` metadata (rclone's and
s3fs-fuse's place for it), and ListObjectsV2 answers Key, LastModified, ETag and Size, never
user metadata: only a HEAD of each object shows the kept time. A read-write mount that asked
one HEAD per file it stats or opens paid a round trip per file for every reader of many small
files (chunks), so the time is also written where a LIST shows it, in bulk:

- a folder in which an n5fs mount kept a time holds the hidden object ``.n5fs-mtimes``
  (:data:`INDEX_NAME`), a JSON document ``{"files": {name: [time, ETag, size]}}``;
- the folder's own LIST names it (with its ETag), so a folder without one costs no request
  more, and a folder with one costs one GET, cached by its ETag, however many files it holds;
- an entry applies to the listed object while that holds the bytes its time was set on (the
  listing shows the same ETag and size). Bytes written since, by anyone, show LastModified
  again; identical bytes written again keep the time, as they keep everything else.

The object's metadata stays the truth (a HEAD, ``-o mtime=head``, rclone and s3fs-fuse read
it); the index is a copy of it for listings. Only times set through n5fs are in it: a time
another tool set shows here as LastModified.

Writes are behind: ``kept``/``removed`` note an entry in memory, and this store's listings
show it at once. A flusher thread writes each folder's edits :data:`FLUSH_DELAY` seconds after
the first (edits meanwhile ride along), as a compare-and-swap: ``If-Match`` the index's ETag
(``If-None-Match: *`` to create it), re-read and merged on a conflict, so mounts that set
times in one folder at once lose none (where the endpoint honours conditional writes;
otherwise the last writer's index wins, and a lost entry shows LastModified). ``flush``
(a mount's ``fsync``) and ``close`` (unmount) write everything at once. An index whose entries
are all gone (files removed through n5fs) is deleted, so it keeps no folder alive.

What another mount sees: a time set on mount A shows on mount B after at most
:data:`FLUSH_DELAY` plus B's cache TTL (the listing B holds is read again), plus the time the
requests take. A daemon killed before its flush leaves the times in the objects' metadata but
not in the index: those files show LastModified (``rsync -a`` copies them once more, and sets
the time again).

Limits: a flat walk (one LIST of many folders) applies a folder's index to the keys listed
after it; a name that sorts before ``.n5fs-mtimes`` (the characters ``!`` to ``-`` first) in a
folder whose index falls on the next page of 1,000 keys shows LastModified in that walk.

State and locks: ``_lock`` guards the folders' index ETags seen in listings (``_found``), the
parsed indexes (``_loaded``), the edits not yet written (``_pending``, with ``_due``) and those
being written (``_writing``); a leaf lock, no request is made under it. ``_flush_lock``
serializes the writes of indexes (the flusher thread, ``flush``, ``drop_under``); it is taken
before ``_lock``, never after, and requests are made under it (nothing else waits on it but
those three).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from n5fs.errors import N5fsError, VersionConflict
from n5fs.kvstore.keys import basename, folder_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from n5fs.kvstore.base import KeyInfo

log = logging.getLogger(__name__)

#: the hidden object, in each folder where a time was kept, that lists the folder's kept times
INDEX_NAME = ".n5fs-mtimes"
#: seconds from a folder's first unwritten edit to the write of its index
FLUSH_DELAY = 1.0
#: a folder's index written at most this many times in a row against other writers
CAS_ATTEMPTS = 8
#: folders whose index ETag (seen in a listing) is remembered; parsed indexes kept
FOUND_FOLDERS = 1 << 16
LOADED_FOLDERS = 1 << 10


def is_index(key: str) -> bool:
    """Whether ``key`` is a folder's index (listings never show it; no file may be one)."""
    return basename(key) == INDEX_NAME


def index_key(folder: str) -> str:
    return folder + INDEX_NAME


def _etag(text: str | None) -> str:
    """ETags compared without their quotes (S3 quotes them; some servers do not)."""
    return (text or "").strip('"')


@dataclass(frozen=True, slots=True)
class Kept:
    """A time kept for the object that holds ``size`` bytes at ``etag``."""

    mtime: float
    etag: str
    size: int

    def fits(self, info: KeyInfo) -> bool:
        return self.size == info.size and self.etag == _etag(info.etag)


#: one folder's edits: name -> the entry to keep, or None to remove it
Edits = dict[str, Kept | None]


def parse(data: bytes) -> dict[str, Kept]:
    """An index document's entries; a document that is not one is empty (and logged)."""
    try:
        files = json.loads(data)["files"]
        return {
            str(name): Kept(float(mtime), _etag(str(etag)), int(size))
            for name, (mtime, etag, size) in files.items()
        }
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("s3: an n5fs times index that is not one is ignored (%s)", exc)
        return {}


def render(entries: Mapping[str, Kept], format_mtime: Callable[[float], str]) -> bytes:
    files = {name: [format_mtime(e.mtime), e.etag, e.size] for name, e in sorted(entries.items())}
    return json.dumps({"files": files}, separators=(",", ":")).encode()


def merged(entries: Mapping[str, Kept], edits: Edits) -> dict[str, Kept]:
    out = dict(entries)
    for name, edit in edits.items():
        if edit is None:
            out.pop(name, None)
        else:
            out[name] = edit
    return out


class IndexIO(Protocol):
    """What the times need of the store: the index objects, past every check for files."""

    def read_index(self, key: str) -> tuple[bytes, str] | None:
        """The index's bytes and ETag; None when there is none."""
        ...

    def write_index(self, key: str, data: bytes, version: str | None) -> str:
        """Store ``data`` if the index is at ``version`` (None: absent); the new ETag.
        VersionConflict when another writer got there first."""
        ...

    def delete_index(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Loaded:
    etag: str
    entries: dict[str, Kept]


class KeptTimes:
    """The kept times of one store (module docstring). ``shown``: listings show them (a
    mount that wants kept times turns it on; entries are written either way)."""

    def __init__(
        self,
        io: IndexIO,
        format_mtime: Callable[[float], str],
        *,
        delay: float = FLUSH_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._io = io
        self._format = format_mtime
        self._delay = delay
        self._clock = clock
        self.shown = False
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._flush_lock = threading.Lock()
        self._found: OrderedDict[str, str] = OrderedDict()
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()
        self._pending: dict[str, Edits] = {}
        self._due: dict[str, float] = {}
        self._writing: dict[str, Edits] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- what listings show ---------------------------------------------------------------------

    def listed(
        self,
        infos: list[KeyInfo],
        indexes: Mapping[str, str],
        *,
        whole: str | None = None,
        shown: Iterable[str] = (),
    ) -> list[KeyInfo]:
        """``infos`` (one listing, or one page of a walk) with the kept times where this
        store shows them. ``indexes``: folder -> ETag of the indexes the listing named;
        ``whole``: the folder the listing holds all of (an index it does not name is gone);
        ``shown``: folders whose index an earlier page of the same walk named."""
        with self._lock:
            for folder, etag in indexes.items():
                self._found[folder] = _etag(etag)
                self._found.move_to_end(folder)
            while len(self._found) > FOUND_FOLDERS:
                self._found.popitem(last=False)
            if whole is not None and whole not in indexes:
                self._found.pop(whole, None)
                self._loaded.pop(whole, None)
            if not self.shown or not (indexes or shown or self._pending or self._writing):
                return infos
            stale = {f: e for f, e in indexes.items() if self._loaded_etag(f) != _etag(e)}
        for folder, etag in stale.items():
            self._load(folder, etag)
        folders = set(indexes).union(shown)
        with self._lock:
            out: list[KeyInfo] = []
            for info in infos:
                kept = self._entry(info.key, folders)
                out.append(
                    info if kept is None or not kept.fits(info) else replace_mtime(info, kept)
                )
            return out

    def _loaded_etag(self, folder: str) -> str | None:
        loaded = self._loaded.get(folder)
        return None if loaded is None else loaded.etag

    def _entry(self, key: str, folders: set[str]) -> Kept | None:
        """The entry for ``key``: this store's unwritten edit, else its folder's index
        (only where the listing named one). Caller holds ``_lock``."""
        folder, name = folder_of(key), basename(key)
        for edits in (self._pending.get(folder), self._writing.get(folder)):
            if edits is not None and name in edits:
                return edits[name]
        if folder not in folders:
            return None
        loaded = self._loaded.get(folder)
        return None if loaded is None else loaded.entries.get(name)

    def _load(self, folder: str, etag: str) -> None:
        """Read the folder's index (one GET); a failure shows LastModified, never fails the
        listing."""
        try:
            read = self._io.read_index(index_key(folder))
        except N5fsError as exc:
            log.warning("s3: the times index of %r could not be read: %s", folder, exc)
            return
        if read is None:
            return  # removed since the listing
        data, version = read
        self._remember(folder, _Loaded(_etag(version or etag), parse(data)))

    def _remember(self, folder: str, loaded: _Loaded | None) -> None:
        with self._lock:
            if loaded is None:
                self._loaded.pop(folder, None)
                self._found.pop(folder, None)
                return
            self._loaded[folder] = loaded
            self._loaded.move_to_end(folder)
            self._found[folder] = loaded.etag
            while len(self._loaded) > LOADED_FOLDERS:
                self._loaded.popitem(last=False)

    # -- edits ------------------------------------------------------------------------------------

    def kept(self, key: str, mtime: float, etag: str | None, size: int) -> None:
        """``key`` (``size`` bytes at ``etag``) was given ``mtime``."""
        if not etag:
            return  # no version to tie the time to: the object's metadata has it
        self._edit(key, Kept(mtime, _etag(etag), size))

    def removed(self, key: str) -> None:
        """``key`` was deleted or rewritten without a time: its entry goes, where its
        folder's index may hold one (it exists and was not read, or names ``key``) or an edit
        of this store may have made one. Chunks rewritten in a folder whose index names other
        files cost nothing."""
        folder, name = folder_of(key), basename(key)
        with self._lock:
            loaded = self._loaded.get(folder)
            known = (
                (folder in self._found and (loaded is None or name in loaded.entries))
                or name in self._pending.get(folder, {})
                or name in self._writing.get(folder, {})
            )
        if known:
            self._edit(key, None)

    def _edit(self, key: str, edit: Kept | None) -> None:
        folder, name = folder_of(key), basename(key)
        with self._lock:
            edits = self._pending.setdefault(folder, {})
            edits[name] = edit
            self._due.setdefault(folder, self._clock() + self._delay)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="n5fs-s3-times", daemon=True)
                self._thread.start()
            self._wake.notify()

    def drop_under(self, prefix: str) -> None:
        """Every key under ``prefix`` is being removed (its indexes with them): forget the
        edits there, after any write of them in flight (so none lands after the removal)."""
        with self._flush_lock, self._lock:
            for table in (self._pending, self._due, self._loaded, self._found):
                for folder in [f for f in table if f.startswith(prefix)]:
                    del table[folder]

    def index_known(self, folder: str) -> bool:
        with self._lock:
            return folder in self._found

    # -- writing the indexes ------------------------------------------------------------------------

    def _run(self) -> None:
        """The flusher: writes each folder's edits once they are due."""
        while True:
            with self._lock:
                while not self._closed:
                    now = self._clock()
                    due = [f for f, at in self._due.items() if at <= now]
                    if due:
                        break
                    wait = min(self._due.values(), default=now + 3600) - now
                    self._wake.wait(timeout=max(wait, 0.01))
                if self._closed:
                    return
            self.flush(due)

    def flush(self, folders: Iterable[str] | None = None) -> None:
        """Write the edits of ``folders`` (None: all) now. A folder whose write failed keeps
        its edits for the flusher's next round (logged); nothing is raised."""
        with self._flush_lock:
            with self._lock:
                chosen = list(self._pending) if folders is None else list(folders)
                work = {f: self._pending.pop(f) for f in chosen if f in self._pending}
                for folder in work:
                    self._due.pop(folder, None)
                self._writing.update(work)
            for folder, edits in work.items():
                self._write_or_keep(folder, edits)

    def _write_or_keep(self, folder: str, edits: Edits) -> None:
        """Write one folder's edits; on failure they wait for the flusher's next round."""
        try:
            self._write(folder, edits)
        except N5fsError as exc:
            log.warning("s3: the times index of %r was not written: %s", folder, exc)
            with self._lock:
                later = self._pending.get(folder, {})
                self._pending[folder] = {**edits, **later}
                self._due[folder] = self._clock() + 5 * self._delay
                self._wake.notify()
        finally:
            with self._lock:
                self._writing.pop(folder, None)

    def _write(self, folder: str, edits: Edits) -> None:
        """One folder's index with ``edits`` applied, compare-and-swap (caller holds
        ``_flush_lock``)."""
        key = index_key(folder)
        with self._lock:
            loaded = self._loaded.get(folder)
            found = folder in self._found
        if loaded is None and found:
            loaded = self._read(folder)
        elif loaded is None and all(edit is None for edit in edits.values()):
            return  # removals from an index no listing named: nothing to remove from
        for attempt in range(CAS_ATTEMPTS):
            entries = merged(loaded.entries if loaded is not None else {}, edits)
            if loaded is not None and entries == loaded.entries:
                self._remember(folder, loaded)
                return  # nothing changes
            version = None if loaded is None else f'"{loaded.etag}"'
            try:
                if not entries:
                    if loaded is not None:
                        self._io.delete_index(key)
                    self._remember(folder, None)
                    return
                etag = self._io.write_index(key, render(entries, self._format), version)
            except VersionConflict:
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
                loaded = self._read(folder)
                continue
            self._remember(folder, _Loaded(_etag(etag), entries))
            return
        log.warning("s3: the times index of %r stayed contended; its edits are dropped", folder)

    def _read(self, folder: str) -> _Loaded | None:
        read = self._io.read_index(index_key(folder))
        if read is None:
            return None
        return _Loaded(_etag(read[1]), parse(read[0]))

    def close(self) -> None:
        """Stop the flusher and write what is left."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._wake.notify_all()
        if thread is not None:
            thread.join()
        with contextlib.suppress(N5fsError):
            self.flush()


def replace_mtime(info: KeyInfo, kept: Kept) -> KeyInfo:
    return replace(info, mtime=kept.mtime)
