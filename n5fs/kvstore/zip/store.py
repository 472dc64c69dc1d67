"""A zip archive as a store, read by range through any base store (file, S3, memory).

Reading fetches the archive's tail (one ranged GET; a ``stat`` too when the archive is larger
than the tail), then the central directory; a member costs one ranged GET after that. Stored
members serve byte ranges straight from the base; deflate, bzip2 and lzma members are
decoded with their output bounded by the size the directory declares (CRC checked on full
reads). Member names that could escape (``..``, absolute, ``\\``, drive letters) are never
exposed; directory entries make prefixes. The index and member reads are
:mod:`~n5fs.kvstore.zip.index`; this module owns the overlay, the locks and the rewrite.

Writes collect in an overlay (values past ``spill_threshold``, or past ``memory_budget`` in
total, go to anonymous temp files) that reads see first. :meth:`ZipStore.flush` (and
``close``) writes a whole new archive to a local temp file (unchanged members copied raw, new
ones deflated or stored, see :class:`~n5fs.kvstore.zip.writer.ArchiveWriter`; ZIP64 where a
field needs it) and puts it in place atomically: beside the archive and renamed over it on a
file base, else in ``tmp_dir`` and uploaded with ``base.put_file``
(:mod:`~n5fs.kvstore.zip.rewrite` owns placement, the space check and failure messages). A
failed flush raises (:class:`~n5fs.errors.NoSpace` when room runs out) and leaves the old
archive whole and the overlay pending, so a retry can succeed; :meth:`ZipStore.sweep` removes
the temp archives of a daemon that was killed mid-rewrite. An absent (or empty) archive reads
as an empty store and is created by the first flush with changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING, ClassVar

from n5fs.errors import InvalidKey, KeyNotFound, ReadOnly, StoreCorrupt
from n5fs.kvstore.abilities import StoreTraits
from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, group_listing
from n5fs.kvstore.keys import check_key, check_prefix, dir_prefix, split_path
from n5fs.kvstore.registry import open_spec
from n5fs.kvstore.spec import ZipSpec
from n5fs.kvstore.zip import rewrite as zr
from n5fs.kvstore.zip import writer as zw
from n5fs.kvstore.zip.index import ArchiveIndex, MemberReads, build_index, live_infos, load_index

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from n5fs.kvstore.tempnames import Leftover

log = logging.getLogger(__name__)

MiB = 1 << 20
_MISSING = object()


class ZipStore(KvStore):
    """Keys are the members under ``path`` inside the archive ``archive_key`` of ``base``.

    Thread-safe: one condition guards the index and the overlay; a flush swaps the archive
    only while no read of the old one is in flight. The store owns ``base`` (``close``
    closes it).

    It has none of the abilities of :mod:`n5fs.kvstore.abilities`, whatever ``base`` has: a
    member is no file of the base (no :class:`LocalFiles`), and a flush replaces the whole
    archive (no per-key conditional writes, durability or part writes).
    """

    spec_type: ClassVar[type[ZipSpec]] = ZipSpec
    #: the index is in memory: one walk of an array answers all its folders at once
    traits = StoreTraits(flat_listing_preferred=True)

    def __init__(
        self,
        base: KvStore,
        archive_key: str,
        path: str = "",
        *,
        spill_threshold: int = 4 * MiB,
        memory_budget: int = 64 * MiB,
        tmp_dir: str | None = None,
    ) -> None:
        self.base = base
        self.archive_key = check_key(archive_key)
        self._path = path
        self._inner = dir_prefix(path)
        self._spill_threshold = spill_threshold
        self._memory_budget = memory_budget
        self._tmp_dir = tmp_dir
        self._where = f"zip archive {archive_key!r} in {base.spec.to_url()}"
        self._temps = zr.TempArchives.of(base, self.archive_key, tmp_dir)
        self._cond = threading.Condition()
        self._flush_lock = threading.Lock()
        self._index: ArchiveIndex | None = None
        self._overlay: dict[str, zr.Pending | None] = {}  # None: deleted
        self._memory = 0
        self._readers = 0
        self._swapping = False
        self._retired: list[zr.Pending] = []
        self._warned: set[str] = set()
        self._members = MemberReads(self.fetch, self._where)

    @classmethod
    def from_spec(cls, spec: ZipSpec) -> ZipStore:
        assert spec.base is not None
        folder, leaf = split_path(spec.base.path)
        if not folder and spec.base.path.startswith("/"):
            folder = "/"
        return cls(open_spec(spec.base.with_path(folder)), leaf, spec.path)

    @property
    def spec(self) -> ZipSpec:
        base = self.base.spec
        folder = base.path if not base.path or base.path.endswith("/") else base.path + "/"
        return ZipSpec(path=self._path, base=base.with_path(folder + self.archive_key))

    # -- the index -------------------------------------------------------------------------

    def fetch(self, start: int, stop: int) -> bytes:
        """Exactly bytes ``[start, stop)`` of the archive, or StoreCorrupt."""
        data = None
        if 0 <= start <= stop:  # offsets come from the archive: a damaged one may say anything
            data = self.base.get(self.archive_key, ByteRange(start, stop - start))
        if data is None or len(data) != stop - start:
            raise StoreCorrupt(
                f"{self._where}: bytes {start}-{stop} are missing (the archive "
                "is truncated or changed underneath; refresh)"
            )
        return data

    def _load(self) -> ArchiveIndex:
        return load_index(
            self.base,
            self.archive_key,
            self.fetch,
            self._where,
            inner=self._inner,
            on_hidden=self._warn_hidden,
        )

    def _warn_hidden(self, hidden: list[str]) -> None:
        fresh = [name for name in hidden if name not in self._warned]
        if fresh:
            self._warned.update(fresh)
            log.warning(
                "%s: %d member name(s) not exposed (absolute, '..', backslash or drive letter): %s",
                self._where,
                len(fresh),
                ", ".join(map(repr, fresh[:10])),
            )

    def _index_locked(self) -> ArchiveIndex:
        """The index, loaded if need be (never from an archive that is being replaced).

        During a swap the old index stays valid for stat and list: the overlay still holds
        the changes being flushed until the new index replaces it.
        """
        while self._index is None:
            if self._swapping:
                self._cond.wait()
            else:
                self._index = self._load()
        return self._index

    @contextlib.contextmanager
    def _reading(self, key: str = "") -> Iterator[tuple[ArchiveIndex, object]]:
        """Hold off an archive swap while the old archive is read; yield (index, pending)."""
        with self._cond:
            while self._swapping:
                self._cond.wait()
            index = self._index_locked()
            pending = self._overlay.get(key, _MISSING)
            self._readers += 1
        try:
            yield index, pending
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._close_retired()
                    self._cond.notify_all()

    def _close_retired(self) -> None:
        for pending in self._retired:
            pending.close()
        self._retired.clear()

    # -- queries ---------------------------------------------------------------------------

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        with self._reading(self._key(key)) as (index, pending):
            if isinstance(pending, zr.Pending):
                start, stop = (byte_range or ByteRange(0)).resolve(pending.size)
                return pending.read(start, stop)
            member = index.files.get(key) if pending is _MISSING else None
            return None if member is None else self._members.read(index, member, byte_range)

    def stat(self, key: str) -> KeyInfo | None:
        with self._cond:
            pending = self._overlay.get(self._key(key), _MISSING)
            if isinstance(pending, zr.Pending):
                return KeyInfo(key, pending.size, pending.mtime)
            member = self._index_locked().files.get(key) if pending is _MISSING else None
        return None if member is None else KeyInfo(key, member.size, member.mtime)

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        check_prefix(prefix)
        with self._cond:
            index = self._index_locked()
            overlay = dict(self._overlay)
        listing = group_listing(live_infos(index, overlay, prefix, delimiter), prefix, delimiter)
        if not delimiter:
            return listing
        extra = set()
        for name in index.dirs:
            rest = name[len(prefix) :]
            cut = rest.find(delimiter)
            if name.startswith(prefix) and cut >= 0 and overlay.get(name, _MISSING) is not None:
                extra.add(prefix + rest[: cut + len(delimiter)])
        return Listing(listing.keys, tuple(sorted(extra.union(listing.prefixes))))

    # -- commands ---------------------------------------------------------------------------

    def _check_writable(self, key: str) -> None:
        if not self.base.traits.writable:
            raise ReadOnly(f"{self._where} sits on a read-only store: cannot change {key!r}")

    def _check_name(self, key: str) -> str:
        self._check_writable(self._key(key))
        if len((self._inner + key).encode()) > 0xFFFF:
            raise InvalidKey(key, "longer than a zip member name may be (65535 bytes)")
        return key

    def set(self, key: str, value: bytes) -> None:
        key = self._check_name(key)
        value = bytes(value)
        spill = len(value) > self._spill_threshold or (
            self._memory + len(value) > self._memory_budget
        )
        if spill:
            pending = zr.Pending.spilled(lambda f: f.write(value), len(value), self._tmp_dir)
        else:
            pending = zr.Pending(len(value), time.time(), data=value)
        self._install(key, pending)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Streams the file into a spill file when large, so memory stays bounded."""
        size = os.path.getsize(path)
        if size <= self._spill_threshold and self._memory + size <= self._memory_budget:
            super().put_file(key, path)
            return
        key = self._check_name(key)
        with open(path, "rb") as src:
            copy = zr.Pending.spilled(
                lambda f: shutil.copyfileobj(src, f, MiB), size, self._tmp_dir
            )
            self._install(key, copy)

    def copy(self, src: str, dst: str) -> None:
        """A copy keeps the member's date (a rename is copy + delete here)."""
        info = self.stat(src)
        super().copy(src, dst)
        if info is not None:
            self.set_mtime(dst, info.mtime)

    def set_mtime(self, key: str, mtime: float) -> None:
        """The member's date, written by the next rewrite (DOS dates: 2-second steps)."""
        key = self._check_name(key)
        with self._cond:
            pending = self._overlay.get(key, _MISSING)
            if isinstance(pending, zr.Pending):
                # a copy sharing the bytes: a rewrite in flight still owns (and drops) the
                # old entry, this one stays pending with the new date
                self._overlay[key] = dataclasses.replace(pending, mtime=mtime)
                return
            if pending is None or self._index_locked().files.get(key) is None:
                raise KeyNotFound(key)
        data = self.get(key)
        if data is None:
            raise KeyNotFound(key)
        self.set(key, data)
        self.set_mtime(key, mtime)

    def _install(self, key: str, pending: zr.Pending | None) -> None:
        with self._cond:
            self._retire(self._overlay.get(key))
            self._overlay[key] = pending
            if pending is not None and pending.data is not None:
                self._memory += pending.size

    def _retire(self, pending: zr.Pending | None) -> None:
        """Drop an overlay value; a spill file closes once no read can be using it."""
        if pending is None:
            return
        if pending.data is not None:
            self._memory -= pending.size
        self._retired.append(pending)
        if not self._readers:
            self._close_retired()

    def delete(self, key: str) -> None:
        self._check_writable(self._key(key))
        with self._cond:
            if key in self._overlay or key in self._index_locked().files:
                self._install(key, None)

    def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        self._check_writable(prefix or "<root>")
        with self._cond:
            index = self._index_locked()
            keys = [info.key for info in live_infos(index, self._overlay, prefix, None)]
            dirs = [name for name in index.dirs if name.startswith(prefix)]
            for key in keys + dirs:
                self._install(key, None)
        return len(keys)

    # -- flush -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Rewrite the archive if anything changed, and put it in place atomically.

        Raises NoSpace (ENOSPC) before writing when the temp directory cannot hold the new
        archive, and any other failure with its own errno; either names the archive, and the
        pending changes stay for a retry.
        """
        with self._flush_lock:
            with self._cond:
                snapshot = dict(self._overlay)
            if not snapshot:
                return
            self._check_writable(self.archive_key)
            attempt = zr.Attempt(self._where, len(snapshot), self._temps.directory)
            try:
                self._rewrite(snapshot, attempt)
            except Exception as exc:
                explained = attempt.explain(exc)
                if explained is None:
                    raise
                raise explained from exc

    def _rewrite(self, snapshot: Mapping[str, zr.Pending | None], attempt: zr.Attempt) -> None:
        changes = {self._inner + key: pending for key, pending in snapshot.items()}
        tmp = None
        try:
            with self._reading() as (index, _):
                kept = [m for m in index.members if m.name not in changes]
                tmp = self._temps.new_path()
                attempt.check_space(zr.size_bound(index.start, kept, changes, index.comment))
                with open(tmp, "xb") as out:
                    old = zw.ArchiveReader(self.fetch, index.size, self._where)
                    members, offsets = zr.write_archive(
                        out, old, index.start, kept, changes, index.comment
                    )
                    size = out.tell()
            new = build_index(
                members,
                size,
                index.comment,
                0,
                inner=self._inner,
                on_hidden=self._warn_hidden,
                data_offsets=offsets,
            )
            attempt.putting = True
            self._swap(tmp, new, snapshot)
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _swap(self, tmp: str, new: ArchiveIndex, snapshot: Mapping[str, zr.Pending | None]) -> None:
        """Put the new archive in place once no read of the old one is in flight."""
        with self._cond:
            self._swapping = True
            while self._readers:
                self._cond.wait()
        try:
            self._temps.put_in_place(tmp)
        except BaseException:
            with self._cond:
                self._swapping = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._index = new
            for key, pending in snapshot.items():
                if self._overlay.get(key, _MISSING) is pending:
                    del self._overlay[key]
                    self._retire(pending)
            for key in [k for k, p in self._overlay.items() if p is None]:
                if key not in new.files and key not in new.dirs:
                    del self._overlay[key]  # a deletion the new archive already reflects
            self._swapping = False
            self._cond.notify_all()

    # -- leftovers of killed rewrites --------------------------------------------------------

    def fault_counters(self) -> dict[str, int]:
        """The base store's: the archive's bytes travel through it."""
        return self.base.fault_counters()

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        """Temp archives of this archive that rewrites left (beside it on a file base, else
        in the temp dir); they belong to the whole archive, so only ``prefix=""`` has any."""
        check_prefix(prefix)
        if prefix:
            return ()
        # ... and what a killed upload of the archive itself left in the base (S3 multipart)
        uploads = [
            left for left in self.base.leftovers(self.archive_key) if left.path == self.archive_key
        ]
        return self._temps.leftovers() + tuple(uploads)

    def remove_leftover(self, leftover: Leftover) -> None:
        if leftover.path == self.archive_key:
            self.base.remove_leftover(leftover)
        else:
            self._temps.remove(leftover)

    def refresh(self) -> None:
        """Forget the index (the archive changed from outside); pending changes stay."""
        with self._cond:
            while self._swapping:
                self._cond.wait()
            self._index = None

    def close(self) -> None:
        self.flush()
        with self._cond:
            for pending in self._overlay.values():
                self._retire(pending)
            self._overlay.clear()
        self.base.close()
