"""A local directory as a store: atomic, durable writes; nothing escapes the root.

``set`` writes a hidden temp file, fsyncs it, renames it over the key and fsyncs the directory
(TensorStore's file driver is durable by default; zarr's ``_atomic_write`` is not: we are).
A key never resolves outside the root, even through a symlink planted inside it.

Symlinks in the folder are never followed as folders, so no loop in it (``ln -s . self``,
``ln -s ../grp grp/up``) can be listed, walked or copied out of a mount, and each file is a
key once. The rule, for every query, listing, walk and command alike:

- a symlink to a regular file inside the root is that file: its key reads, lists and walks as
  the file it leads to (an edit of the key replaces the link by a file, as any ``set`` does);
- a symlink to a folder, even one inside the root, is no prefix: it is not listed, not walked,
  and no key below it exists (reads miss; writes there are refused as below a file, NotAPrefix;
  deletes find nothing); each such link is named once in a warning;
- a symlink that dangles, leads out of the root or to anything else is no key either;
- the root itself may be a symlink (it is resolved once).

Durability is a choice (:class:`Durability`), atomicity is not: every ``set``/``put_file``
goes through a temp file and a rename, so a reader sees the old value or the new one. With
``COMMIT`` (the store's default) each returns durable: the two fsyncs cost more than the write
itself, which only fills the page cache while they wait for the disk. With ``FSYNC`` (a
mount's default) they are deferred to :meth:`FileStore.flush` (the mount's ``fsync()`` and
unmount), as a local filesystem makes ``close()`` cheap and ``fsync()`` durable; the paths
written since are remembered (a bounded set, synced early when full) under a leaf lock.
Folders a lookup walked (no link on their path) are remembered by (device, inode) in a plain
dict without a lock: one ``get`` or item set at a time, a hint re-checked at every use, and
replaced whole when full.
The file operations themselves (temp file + rename, fsync of a file or a folder, copies that
keep holes) are :mod:`~n5fs.kvstore.file.localio`; this module decides when each is due.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import operator
import os
import shutil
import stat as stat_mod
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from n5fs.errors import (
    AccessDenied,
    IsAPrefix,
    KeyNotFound,
    N5fsError,
    NotAPrefix,
    PrefixNotEmpty,
)
from n5fs.kvstore.abilities import Durability, StoreTraits
from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing, group_listing
from n5fs.kvstore.file.localio import (
    atomic_writer,
    can_sync_filesystem,
    copy_sparse,
    fsync_dir,
    fsync_file,
    sync_filesystem,
    write_pieces,
)
from n5fs.kvstore.file.localwalk import walk_keys
from n5fs.kvstore.keys import check_prefix, dir_prefix
from n5fs.kvstore.spec import FileSpec
from n5fs.kvstore.tempnames import (
    PARTIAL_SUFFIX,
    Leftover,
    is_alive,
    is_dead,
    is_partial,
    writer_of,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "PARTIAL_SUFFIX",
    "Durability",
    "FileStore",
    "atomic_writer",
    "copy_sparse",
    "fsync_dir",
]

log = logging.getLogger(__name__)

_BY_KEY = operator.attrgetter("key")
#: with deferred durability, at most this many written paths are remembered for a flush; past
#: it the flush syncs the whole filesystem (or, without ``syncfs``, they are synced at once)
MAX_UNSYNCED = 4096
#: folders :meth:`FileStore._resolve` remembers as checked (a hint; forgotten all at once)
MAX_CHECKED_FOLDERS = 4096
#: :meth:`FileStore._checked_folder`: a component of the folder is a link
_LINKED = "\0linked"
#: a folder opened to be listed (its entries stat-ed relative to it)
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: symlinked folders a store names in a warning (past it, once more for all the others)
MAX_WARNED_LINKS = 1000


class FileStore(KvStore):
    """Keys are files under ``root``; a prefix with nothing under it may exist (a directory).

    Abilities (:mod:`n5fs.kvstore.abilities`): :class:`LocalFiles`,
    :class:`SettableDurability`, :class:`PartWrites`, :class:`NameListings`; no conditional
    writes.
    """

    spec_type = FileSpec
    #: a folder is a directory (it may be empty, and moves in one ``rename``); a ``stat``
    #: costs a few ``lstat`` calls, less than listing the folder
    traits = StoreTraits(atomic_prefix_rename=True, empty_prefixes=True, cheap_stat=True)

    def __init__(
        self, root: str | os.PathLike[str], *, durability: Durability = Durability.COMMIT
    ) -> None:
        self._spec = FileSpec(path=os.fspath(root))
        self._root = os.path.abspath(self._spec.path)
        self._real_root: str | None = None
        #: folders whose path :meth:`_checked_folder` walked: key -> (st_dev, st_ino); a hint
        #: re-checked at each use; one ``get`` or item set at a time (atomic), emptied by
        #: replacing the dict when full: no lock
        self._folders: dict[str, tuple[int, int]] = {}
        #: when a set is on disk (:meth:`set_durability`)
        self.durability = Durability(durability)
        self._unsynced: dict[str, None] = {}  # paths set since the last flush (FSYNC), in order
        self._untracked = 0  # sets past MAX_UNSYNCED: the next flush syncs the filesystem
        self._unsynced_lock = threading.Lock()
        #: keys of the symlinked folders already named in a warning (:meth:`_skip_folder_link`)
        self._warned_links: set[str] = set()

    @classmethod
    def from_spec(cls, spec: FileSpec) -> FileStore:
        return cls(spec.path)

    @property
    def spec(self) -> FileSpec:
        return self._spec

    @property
    def root(self) -> Path:
        return Path(self._root)

    # -- path resolution -----------------------------------------------------------------------

    def _path(self, key: str) -> str:
        path = os.path.join(self._root, self._key(key))
        self._check_inside(path, key)
        return path

    def _check_inside(self, path: str, key: str) -> None:
        # Resolve symlinks of every existing component: a link planted inside the root must
        # not lead out of it. The root itself may be a symlink (resolved the same way).
        real_root = self._real_root or os.path.realpath(self._root)
        if self._real_root is None and os.path.isdir(real_root):
            self._real_root = real_root  # stable once the root exists
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
            raise AccessDenied(f"{key!r} resolves outside the store root {self._root!r}")

    # -- queries -------------------------------------------------------------------------------

    def _through_link(self, folder: str) -> bool:
        """A component of ``folder`` (a key without a trailing ``/``; ``""``: the root) is a
        symlink: nothing below it is in the store (symlinked folders are not followed)."""
        if not folder:
            return False
        real_root = self._resolved_root()
        return real_root is not None and self._checked_folder(real_root, folder) is _LINKED

    def _refuse_below_link(self, key: str) -> None:
        """NotAPrefix where a symlinked folder is on ``key``'s path: a write there would land
        in a folder the store does not list (a set that no get could read back)."""
        if self._through_link(key.rstrip("/").rpartition("/")[0]):
            raise NotAPrefix(
                f"cannot store {key!r}: a symlink is in the way of its folder "
                "(symlinked folders are not followed)"
            )

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        path = self.local_path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                if byte_range is None:
                    return f.read()
                size = os.fstat(f.fileno()).st_size
                start, stop = byte_range.resolve(size)
                f.seek(start)
                return f.read(stop - start)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def local_path(self, key: str) -> str | None:
        """The file of ``key``, None when absent, below a symlinked folder, or a link that is
        no key (see the module's rule). :meth:`get` reads it; every open of a mount asks; see
        :meth:`_resolve` for its cost."""
        found = self._resolve(key)
        return None if found is None else found[0]

    def local_folder(self, prefix: str) -> str | None:
        """The directory of ``prefix`` when it is inside the root with no link on its path
        (:meth:`_checked_folder`: one ``lstat`` once it was walked); None otherwise."""
        prefix = dir_prefix(prefix)
        real_root = self._resolved_root()
        if real_root is None or not prefix:
            return real_root
        folder = self._checked_folder(real_root, prefix[:-1])
        return None if folder is _LINKED else folder

    def _resolved_root(self) -> str | None:
        """The root's real path; None while the root does not exist (asked again next time)."""
        if self._real_root is None:
            with contextlib.suppress(AccessDenied):
                self._check_inside(self._root, "")  # sets it once the root exists
        return self._real_root

    def _resolve(self, key: str) -> tuple[str, os.stat_result] | None:
        """``key``'s path and its ``lstat`` (for a link at the name, the ``stat`` of the file
        it leads to); None as in :meth:`local_path`.

        Cost: an ``lstat`` of the key's folder and one of the file. The folder's path was
        walked once, an ``lstat`` per component below the resolved root (only the key's own
        components can be links), and its (device, inode) remembered; later it counts as
        checked while its path still leads to that directory. A link on the folder's path
        makes the key absent (symlinked folders are not followed: no ``realpath`` either);
        a link at the name costs a ``realpath`` and a ``stat`` (:meth:`_linked_stat`)."""
        real_root = self._resolved_root()
        if real_root is None:
            self._key(key)  # a bad key is refused even before the root exists
            return None
        path = self._entry_path(real_root, key)
        if path is None or path is _LINKED:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if stat_mod.S_ISLNK(st.st_mode):
            linked = self._linked_stat(path, key)
            return None if linked is None else (path, linked)
        return path, st

    def nothing_at(self, key: str) -> bool:
        """Nothing in the store at ``key``: a component of its folder is missing, a file or
        a symlink (not followed), or an ``lstat`` of it finds no entry."""
        real_root = self._resolved_root()
        if real_root is None:
            return not os.path.lexists(self._root)  # no root yet: no keys either
        path = self._entry_path(real_root, key)
        if path is None or path is _LINKED:
            return True
        try:
            os.lstat(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False

    def _entry_path(self, real_root: str, key: str) -> str | None:
        """Where ``key``'s entry would be, below its checked folder (:meth:`_checked_folder`;
        the entry itself is not looked at); ``_LINKED`` or None as that folder is."""
        folder, _, name = self._key(key).rpartition("/")
        base = self._checked_folder(real_root, folder) if folder else real_root
        if base is None or base is _LINKED:
            return base
        return f"{base}{os.sep}{name}"

    def _checked_folder(self, real_root: str, folder: str) -> str | None:
        """The path of ``folder`` (a key without a trailing ``/``) if every component is a
        directory and none a link; ``_LINKED`` if one is a link; None if one is missing."""
        path = f"{real_root}{os.sep}{folder}"
        known = self._folders.get(folder)
        if known is not None:
            try:
                st = os.lstat(path)
            except OSError:
                return None
            if stat_mod.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == known:
                return path
        walked = real_root
        for part in folder.split("/"):
            walked = f"{walked}{os.sep}{part}"
            try:
                st = os.lstat(walked)
            except OSError:
                return None
            if stat_mod.S_ISLNK(st.st_mode):
                return _LINKED
            if not stat_mod.S_ISDIR(st.st_mode):
                return None
        if len(self._folders) >= MAX_CHECKED_FOLDERS:
            self._folders = {}  # a hint only: forgetting costs one walk per folder
        self._folders[folder] = (st.st_dev, st.st_ino)
        return path

    def stat(self, key: str) -> KeyInfo | None:
        """A key as :meth:`list` shows it (a temp file of a writer is none), found by
        :meth:`_resolve` (two ``lstat`` calls where no link is involved)."""
        if is_partial(key.rpartition("/")[2]):
            return None
        found = self._resolve(key)
        if found is None:
            return None
        st = found[1]
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        return KeyInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        check_prefix(prefix)
        head, _, start = prefix.rpartition("/")
        base = head + "/" if head else ""
        if delimiter == "/":
            return self._list_dir(base, start)
        if delimiter is None:  # every key found is below ``prefix``: nothing to group
            return Listing(tuple(sorted(self._walk_from(base, start), key=_BY_KEY)), ())
        return group_listing(self._walk_from(base, start), prefix, delimiter)

    def _list_dir(self, base: str, start: str) -> Listing:
        """One folder: a ``scandir`` of its descriptor and an ``fstatat`` relative to it per
        entry (no walk of the path from the root for each), in one loop. A folder checked
        before (:meth:`_checked_folder`) costs one ``lstat``, not a ``realpath``. Every
        ``find``, ``ls -l`` and miss of a folder not yet listed passes here."""
        directory = self._listed_folder(base)
        if directory is None:
            return Listing()
        try:
            fd = os.open(directory, _DIR_OPEN | (os.O_NOFOLLOW if base else 0))
        except OSError as exc:  # gone, or a file or a link since it was checked
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return Listing()
            raise
        keys: list[KeyInfo] = []
        prefixes: list[str] = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    name = entry.name
                    if not name.startswith(start) or is_partial(name):
                        continue
                    st = self._entry_stat(entry, directory, base + name)
                    if st is None:
                        continue
                    if stat_mod.S_ISDIR(st.st_mode):
                        prefixes.append(f"{base}{name}/")
                    elif stat_mod.S_ISREG(st.st_mode):
                        keys.append(KeyInfo(base + name, st.st_size, st.st_mtime))
        finally:
            os.close(fd)
        keys.sort(key=_BY_KEY)
        prefixes.sort()
        return Listing(tuple(keys), tuple(prefixes))

    def list_names(self, prefix: str) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """:class:`~n5fs.kvstore.abilities.NameListings`: what :meth:`list` shows of folder
        ``prefix`` (``""`` or ``"a/b/"``), names only, from the kinds ``scandir`` reports: no
        ``stat`` per entry (a million chunks of one folder: seconds less). A symlink is asked
        as :meth:`list` asks it (a file inside the root is a key, anything else is none)."""
        check_prefix(prefix)
        files: list[bytes] = []
        folders: list[bytes] = []
        directory = self._listed_folder(prefix)
        if directory is None:
            return files, folders
        try:
            fd = os.open(directory, _DIR_OPEN | (os.O_NOFOLLOW if prefix else 0))
        except OSError as exc:  # gone, or a file or a link since it was checked
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return files, folders
            raise
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    name = entry.name
                    if name.endswith(PARTIAL_SUFFIX):  # (is_partial, inlined: per entry)
                        continue
                    try:
                        if entry.is_file(follow_symlinks=False):
                            files.append(name.encode("utf-8", "surrogateescape"))
                        elif entry.is_dir(follow_symlinks=False):
                            folders.append(name.encode("utf-8", "surrogateescape"))
                        elif entry.is_symlink():
                            st = self._linked_stat(os.path.join(directory, name), prefix + name)
                            if st is not None:
                                files.append(name.encode("utf-8", "surrogateescape"))
                    except FileNotFoundError:  # (a kind unknown to scandir: gone since)
                        continue
        finally:
            os.close(fd)
        return files, folders

    def _listed_folder(self, base: str) -> str | None:
        """The path of folder ``base`` (``""`` or ``"a/b/"``) to list; None when a component
        is missing, a file, or a symlink (a symlinked folder is not followed: nothing there)."""
        if not base:
            return self._root
        real_root = self._resolved_root()
        if real_root is None:
            return None
        checked = self._checked_folder(real_root, base[:-1])
        return None if checked is _LINKED else checked

    def _entry_stat(
        self, entry: os.DirEntry[str], directory: str, key: str
    ) -> os.stat_result | None:
        """A scanned entry of ``directory``: a symlink's :meth:`_linked_stat`, anything else
        its own ``lstat``; None when it is no key (such a link, or an entry renamed or removed
        since the scan by another thread's commit)."""
        if entry.is_symlink():
            return self._linked_stat(os.path.join(directory, entry.name), key)
        try:
            return entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _linked_stat(self, path: str, key: str) -> os.stat_result | None:
        """What the symlink at ``path`` (key ``key``) reads as: the ``stat`` of the regular
        file it leads to inside the root. None for anything else, which is then no key: a
        link that dangles or leads out of the root, and a link to a folder, which is never
        followed (named once in a warning: a loop such as ``ln -s . self`` is the usual one)."""
        try:
            self._check_inside(path, key)
            st = os.stat(path)
        except (OSError, AccessDenied):
            return None
        if stat_mod.S_ISREG(st.st_mode):
            return st
        if stat_mod.S_ISDIR(st.st_mode):
            self._skip_folder_link(key, path)
        return None

    def _skip_folder_link(self, key: str, path: str) -> None:
        """Name the skipped symlinked folder at ``path`` once per store, then at debug level
        (a bounded set; racing listings may name one twice, which is harmless)."""
        try:
            text = os.readlink(path)
        except OSError:
            text = "?"  # replaced since
        warned = self._warned_links
        if key in warned or len(warned) > MAX_WARNED_LINKS:
            log.debug("symlinked folder %r -> %r not followed", key, text)
            return
        warned.add(key)
        if len(warned) > MAX_WARNED_LINKS:
            log.warning(
                "over %d symlinked folders skipped; the rest at debug level", MAX_WARNED_LINKS
            )
            return
        log.warning(
            "%s: symlink %r -> %r is a folder: not listed or followed (n5fs never follows a "
            "symlink as a folder)",
            self._root,
            key,
            text,
        )

    def _scan(self, base: str) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
        directory = os.path.join(self._root, base)
        try:
            if base:
                self._check_inside(directory, base)
            with os.scandir(directory) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError, AccessDenied):
            return
        for entry in entries:
            if is_partial(entry.name):
                continue
            st = self._entry_stat(entry, directory, base + entry.name)
            if st is not None:
                yield entry, st

    def _walk_from(self, base: str, start: str) -> Sequence[KeyInfo]:
        """Every key below folder ``base`` whose name there starts with ``start``, unordered:
        the keys :meth:`_list_dir` would find folder by folder, at less cost per key; no
        symlink is walked into (:mod:`~n5fs.kvstore.file.localwalk`)."""
        return walk_keys(self._listed_folder(base), base, start, self._linked_stat)

    # -- commands ------------------------------------------------------------------------------

    def _prepare(self, key: str) -> str:
        """Where ``key``'s new file goes, its folder made. Below a checked folder (no link on
        its path, :meth:`_checked_folder`) with no folder or link at the key itself, that is
        two ``lstat`` calls: a commit of a small chunk paid as much for a ``realpath`` and a
        ``makedirs`` as for writing its bytes. Anything else takes the full check."""
        real_root = self._real_root
        if real_root is not None and self.traits.writable:
            path = self._entry_path(real_root, key)
            if path is not None and path is not _LINKED:
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    return path
                except OSError:
                    pass
                else:
                    if stat_mod.S_ISREG(st.st_mode):
                        return path
        path = self._path(key)
        self._check_writable(key)
        self._refuse_below_link(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise NotAPrefix(f"cannot store {key!r}: a file is in the way of its folder") from exc
        if os.path.isdir(path):
            raise IsAPrefix(f"cannot store {key!r}: it is a folder with keys under it")
        return path

    def set(self, key: str, value: bytes) -> None:
        self.set_parts(key, (value,))

    def set_parts(self, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """Write each part as it is: a staged chunk arrives as the pieces FUSE handed over,
        and joining them first cost a copy of every byte (and its page faults)."""
        path = self._prepare(key)
        durable = self.durability is Durability.COMMIT
        with atomic_writer(path, durable=durable) as f:
            for part in parts:
                write_pieces(f, part)
        if not durable:
            self._written(path)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy a local file in, holes kept: a staged sparse file stays sparse on disk."""
        target = self._prepare(key)
        durable = self.durability is Durability.COMMIT
        with open(path, "rb") as src, atomic_writer(target, durable=durable) as dst:
            copy_sparse(src, dst)
        if not durable:
            self._written(target)

    def _written(self, path: str) -> None:
        """Remember ``path`` for the next flush. Past :data:`MAX_UNSYNCED` paths the next
        flush syncs the whole filesystem (``syncfs``: one call) and further sets are only
        counted; where there is no ``syncfs``, everything waiting is synced now instead."""
        with self._unsynced_lock:
            past = self._untracked or len(self._unsynced) >= MAX_UNSYNCED
            if past and can_sync_filesystem():
                self._untracked += 1
                return
            self._unsynced.pop(path, None)
            self._unsynced[path] = None
            full = len(self._unsynced) >= MAX_UNSYNCED and not can_sync_filesystem()
        if full:
            self.flush()

    def flush(self) -> None:
        """Make every set since the last flush durable (files, then their folders; past
        :data:`MAX_UNSYNCED` of them, one ``syncfs``); nothing to do when each set was
        durable already (:attr:`Durability.COMMIT`). Why not an fsync per file there: a copy of
        many small chunks would spend a large share of its time in them; one ``syncfs`` is one
        call."""
        with self._unsynced_lock:
            paths, self._unsynced = list(self._unsynced), {}
            untracked, self._untracked = self._untracked, 0
        try:
            if untracked and sync_filesystem(self._root):
                return
            for path in paths:
                fsync_file(path)
            for folder in dict.fromkeys(os.path.dirname(p) for p in paths):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    fsync_dir(folder)
        except BaseException:
            # not durable: what this flush took waits for the next one, which must not
            # answer "synced" for sets it never saw
            with self._unsynced_lock:
                self._unsynced = {**dict.fromkeys(paths), **self._unsynced}
                self._untracked += untracked
            raise

    def set_durability(self, durability: Durability) -> None:
        """Sets from now on are durable as ``durability`` says (a mount's ``-o durable=``).
        Sets already waiting for a flush still wait for it."""
        self.durability = Durability(durability)

    @property
    def unsynced(self) -> int:
        """How many sets wait for a flush to be durable."""
        with self._unsynced_lock:
            return len(self._unsynced) + self._untracked

    def move_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Rename a local file into place (made durable first); copy it across filesystems."""
        target = self._prepare(key)
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.replace(path, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            super().move_file(key, path)
            return
        fsync_dir(os.path.dirname(target))

    def copy(self, src: str, dst: str) -> None:
        found = self._resolve(src)
        if found is None or not stat_mod.S_ISREG(found[1].st_mode):
            raise KeyNotFound(src)
        source, st = found
        self.put_file(dst, source)
        # a copy keeps the time, as S3's does (rename = copy + delete)
        os.utime(self._path(dst), ns=(st.st_atime_ns, st.st_mtime_ns))

    def set_mtime(self, key: str, mtime: float) -> None:
        """``os.utime`` (the access time stays); KeyNotFound if ``key`` is no file."""
        path = self._path(key)
        self._check_writable(key)
        if self._through_link(key.rpartition("/")[0]):
            raise KeyNotFound(f"cannot set the time of {key!r}: absent (below a symlink)")
        try:
            st = os.stat(path)
            if not stat_mod.S_ISREG(st.st_mode):
                raise KeyNotFound(f"cannot set the time of {key!r}: not a file")
            os.utime(path, ns=(st.st_atime_ns, round(mtime * 1e9)))
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise KeyNotFound(f"cannot set the time of {key!r}: absent") from exc

    def delete(self, key: str) -> None:
        path = self._path(key)
        self._check_writable(key)
        if self._through_link(key.rpartition("/")[0]):
            return  # nothing below a symlinked folder is a key
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except (IsADirectoryError, PermissionError) as exc:
            if os.path.isdir(path):
                return  # a folder is not a key: deleting the key is a no-op
            raise N5fsError(f"cannot delete {key!r}: {exc}") from exc

    def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        self._check_writable(prefix or "<root>")
        if prefix and not prefix.endswith("/"):
            return super().delete_prefix(prefix)
        if self._through_link(prefix[:-1]):
            return 0  # a symlinked folder holds no keys: nothing is removed through it
        count = sum(1 for _ in self._walk_from(prefix, ""))
        directory = os.path.join(self._root, dir_prefix(prefix))
        if prefix:
            self._check_inside(directory, prefix)
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for entry, _ in self._scan(""):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
        return count

    def rename(self, src: str, dst: str) -> None:
        """``os.replace``: atomic on one filesystem, and no bytes copied."""
        found = self._resolve(src)
        if found is None or not stat_mod.S_ISREG(found[1].st_mode):
            raise KeyNotFound(src)
        source = found[0]
        target = self._prepare(dst)
        os.replace(source, target)
        fsync_dir(os.path.dirname(target))
        if os.path.dirname(source) != os.path.dirname(target):
            fsync_dir(os.path.dirname(source))

    def rename_prefix(self, src: str, dst: str) -> int:
        """One ``os.rename`` of the folder: atomic, whatever it holds (empty folders too)."""
        if not (src.endswith("/") and dst.endswith("/")):
            return super().rename_prefix(src, dst)
        self._check_writable(dst)
        source, target = self._path(src.rstrip("/")), self._path(dst.rstrip("/"))
        if self._through_link(src[:-1]):
            return 0  # a symlinked folder holds no keys: it is not moved either
        self._refuse_below_link(dst)
        count = sum(1 for _ in self._walk_from(src, ""))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.rename(source, target)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise PrefixNotEmpty(f"cannot move {src!r} onto non-empty {dst!r}") from exc
            raise
        fsync_dir(os.path.dirname(target))
        return count

    def make_prefix(self, prefix: str) -> bool:
        """Create an empty folder (``mkdir`` on a mount over this store)."""
        path = self._path(prefix.rstrip("/"))
        self._check_writable(prefix)
        if self._through_link(prefix.rstrip("/")):
            raise NotAPrefix(f"cannot make folder {prefix!r}: a symlink is in the way")
        try:
            os.makedirs(path, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise NotAPrefix(f"cannot make folder {prefix!r}: a file is in the way") from exc
        return True

    def remove_prefix(self, prefix: str) -> None:
        """Remove an empty folder (``rmdir``); a folder with files in it stays."""
        path = self._path(prefix.rstrip("/"))
        self._check_writable(prefix)
        if self._through_link(prefix.rstrip("/")):
            return  # a symlinked folder is no folder of the store: nothing to remove
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
            if not self._clear_partials(path):
                raise PrefixNotEmpty(f"folder {prefix!r} is not empty") from exc
            os.rmdir(path)

    def _clear_partials(self, path: str) -> bool:
        """Remove the temp files that keep an otherwise empty folder from going (``rmdir``,
        ``rm -r``); True if that emptied it. A writer known to be alive keeps its file: its
        rename would fail; one on another host cannot be asked and loses the race to rmdir."""
        with os.scandir(path) as it:
            entries = list(it)
        if not all(is_partial(e.name) and e.is_file(follow_symlinks=False) for e in entries):
            return False
        alive = [e for e in entries if (w := writer_of(e.name)) is not None and is_alive(w)]
        if alive:
            return False
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        return True

    # -- leftovers of interrupted writers -------------------------------------------------------

    def leftovers(self, prefix: str = "") -> tuple[Leftover, ...]:
        """Hidden temp files under ``prefix`` (a folder): what killed writers left."""
        top = os.path.join(self._root, dir_prefix(check_prefix(prefix)))
        found: list[Leftover] = []
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            for name in files:
                if not is_partial(name):
                    continue
                full = os.path.join(folder, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # a live writer renamed it into place meanwhile
                writer = writer_of(name)
                found.append(
                    Leftover(
                        path=os.path.relpath(full, self._root).replace(os.sep, "/"),
                        what="temp file",
                        size=st.st_size,
                        mtime=st.st_mtime,
                        writer=str(writer) if writer else "an older n5fs",
                        dead=is_dead(name, st.st_mtime),
                    )
                )
        return tuple(sorted(found, key=lambda leftover: leftover.path))

    def remove_leftover(self, leftover: Leftover) -> None:
        self._check_writable(leftover.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._root, leftover.path))
