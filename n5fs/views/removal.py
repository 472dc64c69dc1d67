"""Removing trees through a writable view: ``rm -r`` of an array or a group removes the native
data it stands for, whatever order the remover takes the names in.

A view's array is a document plus chunks, each of which stands for native keys (an N5
dataset's ``attributes.json`` and blocks; a Zarr array's ``zarr.json`` or ``.zarray`` and
``.zattrs`` and chunks). Removing a chunk removes its native chunk (the writes modules map the
name). Removing the document is the delicate part: once the native document is gone the
chunks are no chunks any more (N5 block folders become groups, Zarr chunk files plain
files), so a remover that took the document first (``rm -r`` takes names in listing order,
``.zarray`` before ``0.0``; above 10,000 entries GNU ``rm`` sorts them by inode) would find
the rest of its listing gone or changed. So:

- the document of an array that still has chunks is *hidden* (``stat`` and listings no longer
  show it; nothing native changes) and the array is *doomed*: its chunks stay shown and
  removable one by one, and removing its folder (``rmdir``, the last step of ``rm -r``; once
  no chunk is shown) removes the native document and the chunk folders left empty. A doomed
  array whose folder is never removed keeps its native document: at the next mount it is
  shown again, with the chunks still stored (never a folder of orphaned chunks);
- the document of an array without chunks is removed natively at once, with the chunk folders
  left empty below it (the array folder itself goes with its ``rmdir``);
- an array's attributes alone (``.zattrs`` of the ``zarr2`` view) are cleared natively;
- a group's document removes the group's native document (its attributes); at the root the
  group stays, without attributes, so the hierarchy keeps its format;
- a folder the view makes (an N5 block folder of a Zarr array) is removed when empty without
  a native call: nothing is stored under its name;
- a fill block (the ``n5`` view's block of an absent chunk of an array whose fill value is
  not 0) stands for nothing stored: removing it succeeds without a native call (it reads as
  the fill value still, as a removed block does), and a folder of fill blocks only is empty.

Names removed stay hidden until a document is written there again or their folder is
removed. What is hidden lives in memory, for the mount.

Owner and locks: one :class:`Removals` per writable view (so per mount), owned by its
:class:`~n5fs.views.writes.ViewWrites`; the hidden names and doomed arrays are its own, no
other module reads or changes them but through its methods. Two kinds of lock:

- a *hold* per folder (:meth:`Removals.holding`) is taken around each decision and the native
  calls that carry it out: removing a document (its folder's hold), removing a folder (its
  own), and a document written through the view (its folder's, taken by
  :meth:`ViewWrites._commit <n5fs.views.writes.ViewWrites._commit>` around the native store and
  :meth:`Removals.unhide`). The decision reads the gateway (is a chunk left?) and then
  changes it (the native document goes): without the hold a document written in between was
  removed with the old one (its writer's ``close()`` had succeeded), or hidden without its
  array doomed (its folder then never removable). Chunks take no hold: a chunk unlink and a
  folder's removal need none, since the removal finds the chunk still shown and refuses
  (``ENOTEMPTY``) until its native unlink is done. Holds are taken first, one at a time (a
  removal's own writes, :meth:`~n5fs.views.writes.ViewWrites.clear_attributes` and
  :meth:`~n5fs.views.writes.ViewWrites.clear_group`, do not pass through ``_commit``), then
  gateway locks inside the native calls;
- ``_lock``, a leaf lock around the two sets and the table of holds, never held during a
  native call.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound, PrefixNotEmpty
from n5fs.gateway.namespace.paths import EntryKind
from n5fs.kvstore.keys import basename, parent

if TYPE_CHECKING:
    from collections.abc import Iterator

    from n5fs.detect import Folder
    from n5fs.views.writes import ViewWrites

#: what a view document stands for
ARRAY, ATTRIBUTES, GROUP = "array", "attributes", "group"


class _Hold:
    """A folder's hold and how many threads hold or wait for it (the entry goes at 0)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class Removals:
    """Hidden documents and doomed arrays of one writable view (see the module docs)."""

    def __init__(self, writes: ViewWrites) -> None:
        self.writes = writes
        self.gateway = writes.gateway
        self.tree = writes.tree
        self._hidden: set[str] = set()
        #: prefixes of arrays whose document was removed while chunks remained
        self._doomed: set[str] = set()
        #: folder key -> its hold (module docs), only while held or awaited
        self._holds: dict[str, _Hold] = {}
        self._lock = threading.Lock()

    # -- holds ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def holding(self, folder: str) -> Iterator[None]:
        """Exclude the other removals and document writes of ``folder`` (a key, ``""`` the
        root) for the block: a decision and the native calls that carry it out."""
        with self._lock:
            hold = self._holds.setdefault(folder, _Hold())
            hold.users += 1
        try:
            with hold.lock:
                yield
        finally:
            with self._lock:
                hold.users -= 1
                if not hold.users:
                    del self._holds[folder]

    def writing(self, key: str) -> contextlib.AbstractContextManager[None]:
        """The hold a write of ``key`` takes: its folder's if ``key`` is a view document."""
        if basename(key) in self.writes.document_names():
            return self.holding(parent(key))
        return contextlib.nullcontext()

    def held_count(self) -> int:
        """Folders held or awaited now (tests: none is left behind)."""
        with self._lock:
            return len(self._holds)

    # -- what the view shows -------------------------------------------------------------------

    def hidden(self, key: str) -> bool:
        with self._lock:
            return key in self._hidden

    def unhide(self, key: str) -> None:
        """A document was written at ``key`` again."""
        with self._lock:
            self._hidden.discard(key)
            self._doomed.discard(parent(key) + "/" if parent(key) else "")

    def visible(self, folder: str) -> list[str]:
        """The names the view lists in ``folder`` (the tree's, less the hidden ones) that stand
        for stored data: a fill block (an N5 block of an absent chunk) is no data to remove."""
        names = [name for name, entry in self.tree.children(folder) if not entry.fill]
        with self._lock:
            return [n for n in names if (f"{folder}/{n}" if folder else n) not in self._hidden]

    # -- unlink --------------------------------------------------------------------------------

    def unlink(self, key: str) -> bool:
        """Remove the view document ``key`` (True), or leave ``key`` to the caller (False)."""
        folder = self.tree.access.folder(parent(key))
        role = self.writes.document_role(folder, basename(key))
        if role is None:
            return False
        with self.holding(parent(key)):
            self._remove_document(key, folder.prefix, role)
        self.writes.changed(key)
        return True

    def _remove_document(self, key: str, prefix: str, role: str) -> None:
        """The decision and its native calls, under the folder's hold."""
        shown = self.writes.declared(key) or self.tree.entry(key)
        if shown is None or self.hidden(key):
            raise KeyNotFound(f"no such file in the {self.tree.name} view: /{key}")
        with self._lock:
            doomed = prefix in self._doomed
        doom = False
        if role == ARRAY and not doomed:
            doom = self._chunks_left(parent(key))
            if not doom:
                self._erase(prefix)
        elif role == ATTRIBUTES and not doomed:
            self.writes.clear_attributes(prefix)
        elif role == GROUP:
            self.writes.clear_group(prefix)
        with self._lock:
            if doom:
                self._doomed.add(prefix)
            self._hidden.add(key)

    def _chunks_left(self, folder: str) -> bool:
        docs = self.writes.document_names()
        return any(name not in docs for name in self.visible(folder))

    def _erase(self, prefix: str) -> None:
        """Remove an array's native documents and the chunk folders left empty below it."""
        for name in self.writes.native_documents(prefix):
            if self.gateway.lookup("/" + prefix + name) is not None:
                self.gateway.unlink("/" + prefix + name)
        self._prune(prefix.rstrip("/"))
        self.writes.forget(prefix)
        with self._lock:
            self._doomed.discard(prefix)

    def _prune(self, folder: str) -> None:
        """Remove the empty native folders below ``folder`` (files stay, and their folders)."""
        for name, attr in self.gateway.readdir("/" + folder):
            if attr.kind is EntryKind.DIR:
                below = f"{folder}/{name}" if folder else name
                self._prune(below)
                with contextlib.suppress(PrefixNotEmpty):
                    self.gateway.rmdir("/" + below)

    # -- rmdir ---------------------------------------------------------------------------------

    def rmdir(self, key: str) -> None:
        """Remove the view folder ``key``: a doomed array's native remains, a folder the view
        makes, or the native folder."""
        with self.holding(key):
            self._remove_folder(key)

    def _remove_folder(self, key: str) -> None:
        prefix = key + "/"
        with self._lock:
            doomed = prefix in self._doomed
        if doomed:
            if self._chunks_left(key):
                raise PrefixNotEmpty(f"directory not empty: /{key}")
            self._erase(prefix)
        entry = self.tree.entry(key)
        made = entry is not None and not entry.native and entry.kind is EntryKind.DIR
        if made and key and self._in_array(key) and self.gateway.lookup("/" + key) is None:
            if self.visible(key):
                raise PrefixNotEmpty(f"directory not empty: /{key}")
            return
        self.gateway.rmdir("/" + key)
        with self._lock:
            self._hidden = {k for k in self._hidden if not k.startswith(prefix)}

    def _in_array(self, key: str) -> bool:
        folder: Folder = self.tree.access.folder(parent(key))
        return folder.array_prefix is not None or folder.array is not None
