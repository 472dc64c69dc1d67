"""Rewriting a zip archive: where the new archive goes, whether it fits, what a failure says,
and what a killed rewrite leaves behind.

:meth:`ZipStore.flush <n5fs.kvstore.zip.ZipStore.flush>` hands this module a snapshot of its
pending changes and the index of the archive; :func:`write_archive` writes the whole new
archive (unchanged members copied raw, new ones added) into a local temp file. The staged
values themselves are :class:`Pending` records (bytes in memory, or an anonymous spill file).

:class:`TempArchives` owns the temp archives of one archive: beside it when the base is a
:class:`~n5fs.kvstore.file.FileStore` (same filesystem: ``move_file`` renames the finished
archive into place, no copy), else in ``tmp_dir`` or the system temp dir, whence
``put_file`` uploads it. Every temp archive is hidden and carries its writer's tag
(:mod:`~n5fs.kvstore.tempnames`), so a later mount tells a dead daemon's leftovers, safe to
remove, from a live daemon's rewrite in flight.

:class:`Attempt` checks the space before a byte is written (``statvfs`` of the temp
directory against an upper bound of the new archive's size, see :func:`size_bound`) and turns
any failure into an error naming the archive and how many staged changes stay pending:
:class:`~n5fs.errors.NoSpace` when room runs out, else the failure's own type and errno.

No shared state: the caller holds its flush lock; a :class:`TempArchives` is immutable.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, BinaryIO

from n5fs.errors import InvalidKey, N5fsError, NoSpace
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.keys import split_path
from n5fs.kvstore.tempnames import (
    NAME_MAX,
    Leftover,
    is_dead,
    is_partial,
    temp_name,
    writer_of,
)
from n5fs.kvstore.zip import format as zf
from n5fs.kvstore.zip import writer as zw

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from n5fs.kvstore.base import KvStore

#: our local header with a ZIP64 extra field, without the name
_LOCAL_MAX = zf.LOCAL_HEADER_SIZE + 20
#: a central entry with a ZIP64 extra of three fields, without name, other extras, comment
_CENTRAL_MAX = zf.CENTRAL.size + 28
_DESCRIPTOR_MAX = 24
_END_MAX = zf.EOCD64.size + zf.LOCATOR.size + zf.EOCD.size
#: what a temp name puts between the name it stands for and the writer tag
_TAG_START = ".n5fs~"
_SPILL_READ = 8 << 20  # bytes per read of a spill file


@dataclass(eq=False)
class Pending:
    """A value staged but not in the archive yet: in memory, or in an anonymous temp file
    (gone with its descriptor, so a killed daemon leaves no spill file behind)."""

    size: int
    mtime: float
    data: bytes | None = None
    spill: IO[bytes] | None = None

    @classmethod
    def spilled(
        cls, write: Callable[[IO[bytes]], object], size: int, tmp_dir: str | None
    ) -> Pending:
        spill = tempfile.TemporaryFile(prefix="n5fs-zip-", dir=tmp_dir)  # noqa: SIM115
        try:
            write(spill)
            spill.flush()
        except BaseException:
            spill.close()
            raise
        return cls(size, time.time(), spill=spill)

    def read(self, start: int, stop: int) -> bytes:
        if self.data is not None:
            return self.data[start:stop]
        assert self.spill is not None
        parts = []
        while start < stop:
            part = os.pread(self.spill.fileno(), min(stop - start, _SPILL_READ), start)
            if not part:
                break
            parts.append(part)
            start += len(part)
        return b"".join(parts)

    def chunks(self) -> Iterator[bytes]:
        for at in range(0, self.size, _SPILL_READ):
            yield self.read(at, min(at + _SPILL_READ, self.size))

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


# -- the new archive ---------------------------------------------------------------------------


def deflate_bound(size: int) -> int:
    """The most raw deflate may write for ``size`` input bytes (zlib's ``deflateBound``); the
    writer falls back to stored after trying, so the file may briefly hold this much."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 13


def size_bound(
    start: int,
    kept: Iterable[zf.Member],
    changes: Mapping[str, Pending | None],
    comment: bytes,
) -> int:
    """An upper bound of the new archive's size: the bytes before the first member, every
    kept member's compressed bytes and headers, every new value as if it did not compress,
    the central directory and the end records."""
    total = start + _END_MAX + len(comment)
    for m in kept:
        names = 2 * len(m.raw_name) + len(m.extra) + len(m.comment)
        total += _LOCAL_MAX + m.csize + _DESCRIPTOR_MAX + _CENTRAL_MAX + names
    for name, staged in changes.items():
        if staged is not None:
            raw = len(zw.encode_name(name)[0])
            total += _LOCAL_MAX + _CENTRAL_MAX + 2 * raw + deflate_bound(staged.size)
    return total


def write_archive(
    out: BinaryIO,
    old: zw.ArchiveReader,
    start: int,
    kept: Sequence[zf.Member],
    changes: Mapping[str, Pending | None],
    comment: bytes,
) -> tuple[tuple[zf.Member, ...], dict[int, int]]:
    """Write the new archive: the old one's leading bytes (a self-extractor stub), the kept
    members in their order, the new values sorted by name, then the directory. Returns the
    members as written and their data offsets (header offset -> data offset)."""
    writer = zw.ArchiveWriter(out)
    writer.write_raw(old.chunks(0, start))
    for member in sorted(kept, key=lambda m: m.header_offset):
        writer.copy_member(member, old.member_data(member))
    for name in sorted(changes):
        staged = changes[name]
        if staged is not None:
            writer.add(name, staged.size, staged.mtime, staged.chunks)
    return writer.finish(comment), writer.data_offsets


# -- where temp archives live ------------------------------------------------------------------


@dataclass(frozen=True)
class TempArchives:
    """The temp archives of one archive: where new ones go, and those a writer left."""

    base: KvStore
    archive_key: str
    directory: str  # a local directory
    stem: str  # the name each temp name stands for
    root: str | None  # the FileStore's root when the temp archives sit beside the archive

    @classmethod
    def of(cls, base: KvStore, archive_key: str, tmp_dir: str | None) -> TempArchives:
        folder, leaf = split_path(archive_key)
        if isinstance(base, FileStore):
            root = str(base.root)
            return cls(base, archive_key, os.path.normpath(os.path.join(root, folder)), leaf, root)
        # one temp dir serves many archives: a digest of the archive's URL tells them apart
        url = f"{base.spec.to_url()}|{archive_key}".encode(errors="surrogateescape")
        digest = hashlib.blake2b(url, digest_size=4).hexdigest()
        directory = tmp_dir or tempfile.gettempdir()
        return cls(base, archive_key, directory, f"n5fs-zip-{digest}-{leaf}", None)

    @property
    def beside(self) -> bool:
        return self.root is not None

    def new_path(self) -> str:
        """A fresh writer-tagged temp name in :attr:`directory` (created if need be)."""
        os.makedirs(self.directory, exist_ok=True)
        return os.path.join(self.directory, temp_name(self.stem))

    def put_in_place(self, tmp: str) -> None:
        """Replace the archive with the finished temp archive, atomically."""
        if self.beside:
            self.base.move_file(self.archive_key, tmp)  # a rename, made durable
        else:
            self.base.put_file(self.archive_key, tmp)

    def is_ours(self, name: str) -> bool:
        """A temp name of this archive (a long name is cut to fit ``NAME_MAX``)."""
        if not (name.startswith(".") and is_partial(name)) or writer_of(name) is None:
            return False
        head = name[1 : name.rfind(_TAG_START)]
        if head == self.stem:
            return True
        cut = len(name.encode(errors="surrogateescape")) > NAME_MAX - 4
        return cut and bool(head) and self.stem.startswith(head)

    def leftovers(self) -> tuple[Leftover, ...]:
        """Temp archives of this archive in :attr:`directory` (not below it)."""
        try:
            with os.scandir(self.directory) as it:
                entries = [e for e in it if self.is_ours(e.name)]
        except (FileNotFoundError, NotADirectoryError):
            return ()
        found = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # put in place (or removed) meanwhile
            if not entry.is_file(follow_symlinks=False):
                continue
            writer = writer_of(entry.name)
            found.append(
                Leftover(
                    path=self._path_of(entry.name),
                    what="temp archive",
                    size=st.st_size,
                    mtime=st.st_mtime,
                    writer=str(writer),
                    dead=is_dead(entry.name, st.st_mtime),
                )
            )
        return tuple(sorted(found, key=lambda leftover: leftover.path))

    def _path_of(self, name: str) -> str:
        """Beside the archive: relative to the FileStore's root; else the absolute path."""
        if self.root is None:
            return os.path.join(self.directory, name)
        return split_path(self.archive_key)[0] + name

    def remove(self, leftover: Leftover) -> None:
        """Remove a temp archive :meth:`leftovers` reported (nothing else, whatever it says)."""
        full = leftover.path if self.root is None else os.path.join(self.root, leftover.path)
        folder, name = os.path.split(full)
        if os.path.normpath(folder) != os.path.normpath(self.directory) or not self.is_ours(name):
            raise InvalidKey(leftover.path, f"not a temp archive of {self.archive_key!r}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(full)


# -- one attempt: space check and failures -----------------------------------------------------


@dataclass
class Attempt:
    """One rewrite of the archive ``where`` names, with ``staged`` changes at stake."""

    where: str
    staged: int
    directory: str
    need: int = 0
    free: int | None = None
    putting: bool = False  # past writing: the new archive is being put in place
    refusal: NoSpace | None = None  # what check_space raised: it says it all already

    @property
    def _kept(self) -> str:
        return f"{self.staged} staged change(s) stay pending for a retry"

    def check_space(self, need: int) -> None:
        """Refuse (NoSpace) before writing when ``directory`` has less than ``need`` free."""
        self.need = need
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return  # cannot tell: the write itself will say
        self.free = st.f_bavail * st.f_frsize
        if need > self.free:
            self.refusal = NoSpace(
                f"{self.where}: not enough space in {self.directory} to rewrite it: the new "
                f"archive needs up to {need:,} bytes, {self.free:,} are free; {self._kept}"
            )
            raise self.refusal

    def explain(self, exc: Exception) -> Exception | None:
        """The error to raise instead of ``exc`` (None: raise ``exc`` itself)."""
        if exc is self.refusal:
            return None
        if isinstance(exc, OSError) and (exc.errno == errno.ENOSPC or isinstance(exc, NoSpace)):
            return NoSpace(self._no_space(exc))
        text = str(exc) if self.where in str(exc) else f"{self.where}: the rewrite failed: {exc}"
        message = f"{text}; {self._kept}"
        if isinstance(exc, N5fsError):
            try:
                return type(exc)(message)
            except TypeError:  # a class that wants more than a message: keep it as it is
                return None
        if isinstance(exc, OSError) and exc.errno:
            return OSError(exc.errno, message)  # the builtin subclass of that errno
        return None

    def _no_space(self, exc: OSError) -> str:
        if self.putting:
            return (
                f"{self.where}: no space left to put the new archive in place: {exc}; {self._kept}"
            )
        free = "" if self.free is None else f", {self.free:,} were free"
        return (
            f"{self.where}: ran out of space in {self.directory} while writing the new archive "
            f"(up to {self.need:,} bytes needed{free}); {self._kept}"
        )
