"""The file driver: :class:`FileStore`, a local directory as a store, with atomic and durable
writes, and no key that resolves outside the root.

Modules have plain names, no leading underscores: the package's public surface is what this
file exports (``__all__``), and the modules are named by what they own because tests replace
their attributes (``store.MAX_UNSYNCED``, ``store.sync_filesystem``), docstrings cite them and
log records carry their names. Nothing outside the package imports them, tests aside.

- ``store``: :class:`FileStore`: keys to paths, symlink rules, when each write is made
  durable (:class:`Durability`, the vocabulary of :mod:`n5fs.kvstore.abilities`, is
  exported here too);
- ``localio``: POSIX primitives: atomic replacement, fsync of files and folders, copies that
  keep holes;
- ``localwalk``: the flat listing of a folder tree, relative to each folder's descriptor.

State and locks, all of them a :class:`FileStore`'s:

- ``_unsynced_lock``, a leaf lock, guards the paths written since the last flush
  (``Durability.FSYNC``: a bounded set, synced early when full) and the count of writes past
  the bound.
- ``_folders`` (folders whose path a lookup walked, by device and inode) is a hint without a
  lock: one ``get`` or item set at a time, re-checked at every use, replaced whole when full.
- ``_warned_links`` (symlinked folders already named in a warning) is a bounded set without a
  lock: two racing listings may name one link twice, which is harmless.
- ``localio`` and ``localwalk`` are stateless.
"""

from __future__ import annotations

from n5fs.kvstore.file.store import PARTIAL_SUFFIX, Durability, FileStore

__all__ = ["PARTIAL_SUFFIX", "Durability", "FileStore"]
