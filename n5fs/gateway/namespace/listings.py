"""The namespace a mount shows: folder listings, directories that live only in the gateway,
hdmf-zarr links as symlinks, files still being written, and the hidden ``/.n5fs/`` control
folder.

State and locks:
- listings: a :class:`~n5fs.singleflight.LoadingCache` of immutable :class:`DirEntries` (one
  LIST per folder however many threads miss it; a LIST that began before one of our commits is
  never stored; our commits replace the cached value with a patched copy, so a committed name
  is visible to ``stat`` and ``readdir`` the moment the commit returns). Each is packed
  (:class:`~n5fs.gateway.namespace.paths.PackedFiles`, some 30 bytes a chunk file) and weighed
  by its bytes: past ``max_bytes`` the least recently used are dropped, and listed again when
  next asked (a commit to a dropped folder patches nothing: the next LIST sees it). On a
  store with :class:`~n5fs.kvstore.abilities.NameListings` (a local disk) a folder is listed
  by names, and a file's size and mtime come from one ``stat`` when first asked;
- walks (:mod:`~n5fs.gateway.namespace.walks`, its own locks): on a store that prefers flat listings,
  a miss of a folder of an array's chunk tree waits for one flat listing of the array (or of
  the part of it holding the folder), which fills the listing of every folder it passes
  (never one a commit touched meanwhile, never over a live one). Its workers take no lock
  of the gateway's, so a waiter may hold any (a node lock in ``create``);
- a folder that the cached listing of a folder above does not name holds no key: it is
  answered empty without a LIST and without a cache entry (a commit there patches the folder
  above, so the next question sees it);
- on a store of round trips (S3), a lookup in a folder not listed yet lists the folder
  below it too, beside its own folder (:meth:`NamespaceView._list_ahead`): a flight of the
  listings cache like any other, so it obeys the same rules;
- virtual directories (``mkdir`` on a store without empty prefixes): a set under ``_vlock``,
  a leaf lock;
- on a store whose ``stat`` of one key is cheaper than listing its folder (a local disk), a
  lookup of a file in a folder with no live listing asks ``stat`` for that file alone, unless
  a cached listing above leaves the folder out; a name with nothing on disk is a miss
  (``nothing_at``) without a listing; anything else there lists the folder, as elsewhere;
- uncommitted new files come from :class:`~n5fs.gateway.write.handles.OpenFiles` (its own locks).
Nothing here writes to the store except ``make_prefix``/``remove_prefix`` for directories.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from functools import partial
from typing import TYPE_CHECKING

from n5fs.detect import FolderKind
from n5fs.errors import DetectionFailed, KeyNotFound, NotAPrefix, Rejected
from n5fs.formats.registry import PROBE_NAMES
from n5fs.gateway.namespace.links import links_of
from n5fs.gateway.namespace.paths import (
    CONTROL,
    CONTROL_FILES,
    Attr,
    DirEntries,
    DirListing,
    EntryKind,
    FileMap,
    is_control,
)
from n5fs.gateway.namespace.walks import ArrayWalks
from n5fs.gateway.read.byte_cache import LoadingCache
from n5fs.kvstore.abilities import name_listings
from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.keys import basename, dir_prefix, folder_of, parent
from n5fs.locking import LEAF, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from n5fs.detect import Detector
    from n5fs.gateway.write.handles import OpenFiles
    from n5fs.kvstore.base import KvStore
    from n5fs.workers import Workers

#: the listing of a folder that holds no key
_EMPTY = DirEntries()


def _weight(entries: DirEntries) -> int:
    return entries.nbytes


#: a folder listing that took this long is served past its TTL while it is listed again
#: (:mod:`n5fs.singleflight`): half a second is some five to ten LIST pages of 1,000 keys on S3
SLOW_LISTING = 0.5


class NamespaceView:
    def __init__(
        self,
        store: KvStore,
        detector: Detector,
        files: OpenFiles,
        *,
        ttl: float,
        clock: Callable[[], float],
        writable: bool,
        control: Callable[[str], bytes],
        workers: Workers,
        show_control: bool = False,
        flat_keys: int = 100_000,
        max_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.detector = detector
        self.files = files
        self.writable = writable
        self.show_control = show_control
        self._control = control
        # an expired listing that took a while to read answers while it is read again (not
        # in strict consistency, whose TTL of 0 asks the store on every lookup)
        # weighed by the bytes each holds, the least recently used dropped past ``max_bytes``
        # (and listed again when next asked)
        self.listings: LoadingCache[DirEntries] = LoadingCache(
            ttl,
            clock=clock,
            revalidate_after=SLOW_LISTING if ttl else None,
            workers=workers,
            weigh=_weight,
            max_bytes=max_bytes,
        )
        self.walks = ArrayWalks(
            store, self.listings, budget=flat_keys, ttl=ttl, clock=clock, workers=workers
        )
        self._vdirs: set[str] = set()
        self._vlock = ranked_lock("virtual directories", LEAF)
        #: where the store lists names for less than whole listings (a local disk)
        self._names = name_listings(store)
        #: a lookup in a folder not listed yet lists the folder below too (:meth:`_list_ahead`)
        self._ahead = store.traits.remote_reads and ttl > 0

    # -- listings ------------------------------------------------------------------------------

    def entries(self, prefix: str) -> DirEntries:
        if not self.listings.answers(prefix):  # (an expired slow listing answers, refreshed)
            if self._absent(prefix):
                return _EMPTY
            if self._walked(prefix) and self._absent(prefix):
                return _EMPTY  # the walk found no key there
        return self.listings.load(prefix, partial(self._list_one, prefix))

    def _list_one(self, prefix: str) -> DirEntries:
        names = self._names
        if names is not None:  # a directory on disk: names and kinds now, sizes when asked
            files, dirs = names.list_names(prefix)
            return DirEntries.from_names(prefix, files, dirs, self.store.stat)
        return DirEntries.from_listing(prefix, self.store.list(prefix))

    def _absent(self, prefix: str) -> bool:
        """Does the nearest folder above ``prefix`` with a cached listing leave it out (so it
        holds no key)? Only cached listings are asked: never a LIST."""
        child = prefix.rstrip("/")
        while child:
            head, _, name = child.rpartition("/")
            known = self.listings.get(head + "/" if head else "")
            if known is not None:
                return name not in known.dirs
            child = head
        return False

    def _walked(self, prefix: str) -> bool:
        """If detection says ``prefix`` is an array or one of its chunk folders and the store
        prefers flat listings, wait until the array's walk answered it; False otherwise."""
        if not self.walks.enabled or not self._maybe_below_node(prefix):
            return False
        try:
            folder = self.detector.folder(prefix)
            if folder.kind is FolderKind.CHUNKS and folder.array_prefix is not None:
                folder = self.detector.folder(folder.array_prefix)
        except (DetectionFailed, Rejected):
            return False  # a broken folder is listed as it is, folder by folder
        if folder.kind is not FolderKind.ARRAY:
            return False
        self.walks.wait_for(folder.prefix, prefix, folder.array)
        return True

    def _maybe_below_node(self, prefix: str) -> bool:
        """False when the cached listings of every folder above ``prefix`` hold no metadata
        name: it is then no array's chunk folder, and the probes a detection would send
        (five GETs on S3) are spared in plain trees; an array's own folder is then listed
        by itself, and its chunk folders are walked at their first miss."""
        child = prefix.rstrip("/")
        while child:
            known = self.listings.get(folder_of(child))
            if known is None or any(name in known.files for name in PROBE_NAMES):
                return True
            child = parent(child)
        return False

    def _list_ahead(self, folder: str, name: str) -> None:
        """A lookup of ``name`` in a folder not listed yet, on a store of round trips: list
        the folder ``name`` would be beside the folder it is in, not after it.

        Why: the kernel resolves a path one name at a time, so a cold ``open`` of
        ``a/b/c/f`` waits for the LISTs of the root, ``a/``, ``a/b/`` and ``a/b/c/`` one after
        another. Listed in pairs, the names of a path cost half the round trips (the next
        lookup finds its folder listed or in flight). A name that is a file costs one LIST
        that answers nothing, sent beside the one waited for; a format's metadata name is
        never listed so (it is a file), nor is anything under an array or group, whose
        chunk folders the array's walk answers. Not in strict consistency, where every
        lookup asks the store anyway."""
        if not self._ahead or self.listings.answers(folder):
            return
        if name in PROBE_NAMES or self._absent(folder) or self._maybe_below_node(folder):
            return
        child = folder + name + "/"
        self.listings.load_behind(child, partial(self._list_one, child))

    def cached_files(self, prefix: str) -> FileMap | None:
        """The files of folder ``prefix`` as a cached listing holds them; never a LIST."""
        entries = self.listings.get(prefix)
        return None if entries is None else entries.files

    def info(self, key: str) -> KeyInfo | None:
        """The stored object's size and mtime, as the folder's listing says."""
        return self.entries(folder_of(key)).files.get(basename(key))

    def exists(self, key: str) -> bool:
        return self.info(key) is not None

    def is_vdir(self, key: str) -> bool:
        with self._vlock:
            return key in self._vdirs

    # -- questions -----------------------------------------------------------------------------

    def stat(self, key: str) -> Attr:
        """What ``key`` (``""`` is the root) is: the answer ``getattr`` gives."""
        if not key:
            return Attr(EntryKind.DIR, mtime=0.0, writable=self.writable)
        if is_control(key):
            return self.control_attr(key)
        node = self.files.node(key)
        if node is not None:
            attr = node.pending_attr(self.writable)
            if attr is not None:
                return attr
        if self.is_vdir(key):
            return Attr(EntryKind.DIR, writable=self.writable)
        folder, name = folder_of(key), basename(key)
        listed = True
        if (
            self.store.traits.cheap_stat
            and not self.listings.answers(folder)
            and not self._absent(folder)
        ):
            # a local disk: the file alone, not a scandir and a stat of all its neighbours
            # (reading 10k of 51k chunks cold listed every folder of the tree, far behind a
            # passthrough); a name with nothing on disk is a miss without a listing
            # either (a stat storm of absent chunk keys); a folder or a link is the listing's
            info = self.store.stat(key)
            if info is not None:
                return Attr(EntryKind.FILE, info.size, info.mtime, self.writable)
            listed = not self.store.nothing_at(key)
        if listed:
            self._list_ahead(folder, name)
            entries = self.entries(folder)
            if name in entries.dirs:
                return Attr(EntryKind.DIR, writable=self.writable)
            info = entries.files.get(name)
            if info is not None:
                return Attr(EntryKind.FILE, info.size, info.mtime, self.writable)
        target = self.links(folder).get(name)  # hdmf-zarr links live in metadata, not on disk
        if target is not None:
            return Attr(EntryKind.SYMLINK, len(target), writable=self.writable)
        raise KeyNotFound(f"no such file or directory: /{key}")

    def with_kept_mtime(self, key: str, attr: Attr) -> Attr:
        """``attr`` with the mtime the store kept for ``key`` (``utimens``) where its listing
        cannot say (S3: one HEAD). Files being written keep the time they show."""
        node = self.files.node(key)
        if is_control(key) or (node is not None and node.pending):
            return attr
        info = self.store.stat(key)
        return attr if info is None else dataclasses.replace(attr, mtime=info.mtime)

    def lookup(self, key: str) -> Attr | None:
        try:
            return self.stat(key)
        except KeyNotFound:
            return None

    def readdir(self, key: str) -> Sequence[tuple[str, Attr]]:
        """The entries of folder ``key``, sorted by name: a :class:`DirListing` over the
        folder's cached files (no object per file until it is read), else a list."""
        if is_control(key):
            if key != CONTROL:
                raise NotAPrefix(f"/{key}")
            return [(name, self.control_attr(f"{CONTROL}/{name}")) for name in CONTROL_FILES]
        if self.stat(key).kind is not EntryKind.DIR:
            raise NotAPrefix(f"not a directory: /{key}")
        prefix = dir_prefix(key)
        entries = self.entries(prefix)  # immutable: safe to iterate while others commit
        files = entries.files
        writable = self.writable
        # every entry but the stored files; each replaces a stored file of its name, but a
        # link gives way to one
        extras: dict[str, Attr] = {
            name: Attr(EntryKind.SYMLINK, len(target), writable=writable)
            for name, target in self.links(prefix).items()
            if name not in files
        }
        extras.update(self.files.pending_children(key, writable))
        with self._vlock:
            vdirs = [basename(v) for v in self._vdirs if parent(v) == key]
        for name in itertools.chain(entries.dirs, vdirs):
            extras[name] = Attr(EntryKind.DIR, writable=writable)
        # /.n5fs is reachable by its path but not listed (ZFS's snapdir=hidden): cp -r, tar
        # and rsync of a mount must not carry the control entries along; -o show_control lists it
        if not key and self.show_control:
            extras[CONTROL] = Attr(EntryKind.DIR, writable=False)
        packed = files.packed()
        if packed is not None:
            with contextlib.suppress(UnicodeEncodeError):  # (a name that cannot be packed)
                return DirListing(packed, extras, writable=writable)
        out: dict[str, Attr] = {
            name: Attr(EntryKind.FILE, info.size, info.mtime, writable)
            for name, info in files.items()
        }
        out.update(extras)
        return sorted(out.items())

    def links(self, prefix: str) -> dict[str, str]:
        """hdmf-zarr links of the group at ``prefix``: name -> symlink text."""
        try:
            return links_of(self.detector.folder(prefix))
        except (DetectionFailed, Rejected):
            return {}  # a broken folder has no links to show

    def readlink(self, key: str) -> str:
        target = self.links(folder_of(key)).get(basename(key))
        if target is None:
            raise KeyNotFound(f"not a symlink: /{key}")
        return target

    def control_attr(self, key: str) -> Attr:
        if key == CONTROL:
            return Attr(EntryKind.DIR, writable=False)
        return Attr(EntryKind.FILE, len(self._control(key)), time.time(), writable=False)

    # -- our own changes -----------------------------------------------------------------------

    def note_set(
        self, key: str, size: int, mtime: float | None = None, etag: str | None = None
    ) -> KeyInfo:
        """``key`` now holds ``size`` bytes (modified at ``mtime``, else now; at version
        ``etag`` where the write returned one): patch the listings of its folder and of every
        folder above (each holds a directory now). Returns the info the listing shows."""
        info = KeyInfo(key, size, time.time() if mtime is None else mtime, etag)
        name = basename(key)
        self.listings.replace(folder_of(key), lambda e: e.with_file(name, info))
        child = parent(key)
        while child:
            with self._vlock:
                self._vdirs.discard(child)
            folder, sub = folder_of(child), basename(child)
            known = self.listings.get(folder)
            if known is not None and sub in known.dirs:
                break  # known, so every folder above knows its way here too
            self.listings.replace(folder, partial(DirEntries.with_dir, name=sub))
            child = parent(child)
        return info

    def forget(self, key: str) -> None:
        """Another writer changed ``key``: its folder is listed again at the next question,
        and so is every folder above whose cached listing does not lead to it. That writer
        may have made those folders too, and a cached listing that leaves a folder out
        answers it empty without a LIST (:meth:`_absent`): a name another mount created
        would stay missing here until that listing expired (a create that lost a conflict
        to it would read ENOENT where the winner's file is)."""
        self.listings.invalidate(folder_of(key))
        child = parent(key)
        while child:
            folder = folder_of(child)
            known = self.listings.get(folder)
            if known is not None and basename(child) in known.dirs:
                return  # known, so every folder above knows its way here too
            self.listings.invalidate(folder)
            child = parent(child)

    def note_delete(self, key: str) -> None:
        name = basename(key)
        folder = parent(key)
        self.listings.replace(dir_prefix(folder), lambda e: e.without_file(name))
        if folder and not self.store.traits.empty_prefixes:
            with self._vlock:  # keep the directory visible: `rm d/f; rmdir d` must work
                self._vdirs.add(folder)

    def note_mkdir(self, key: str) -> None:
        if self.store.make_prefix(key):
            name = basename(key)
            self.listings.replace(folder_of(key), lambda e: e.with_dir(name))
        else:
            with self._vlock:
                self._vdirs.add(key)

    def note_rmdir(self, key: str) -> None:
        with self._vlock:
            self._vdirs.discard(key)
        self.store.remove_prefix(key)
        name = basename(key)
        self.listings.replace(folder_of(key), lambda e: e.without_dir(name))
        self.listings.invalidate(dir_prefix(key))

    def note_moved_dir(self, src: str, dst: str, *, empty: bool) -> None:
        """A directory moved: virtual directories move with it; listings are re-read."""
        with self._vlock:
            self._vdirs = {
                dst + v[len(src) :] if v == src or v.startswith(src + "/") else v
                for v in self._vdirs
            }
            if empty and not self.store.traits.empty_prefixes:
                self._vdirs.add(dst)
        self.clear()

    def clear(self) -> None:
        self.listings.clear()
        self.walks.clear()
