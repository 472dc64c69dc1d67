"""The zip driver: :class:`ZipStore`, the members of a zip archive as keys, the archive read
by range through any base store (file, S3, memory) and rewritten whole on ``flush``.

Modules have plain names, no leading underscores: the package's public surface is what this
file exports (``__all__``), and the modules are named by what they own because tests replace
their attributes (``writer.ZIP64_LIMIT``, ``rewrite.size_bound``), docstrings cite them and
log records carry their names. Nothing outside the package imports them, tests aside.

- ``store``: :class:`ZipStore`: the overlay of pending writes, the locks, the swap of a
  rewritten archive;
- ``index``: the index of an archive as the store exposes it, and member reads by range;
- ``format``: reading the zip container (end records, central directory, decoding);
- ``writer``: writing an archive into a local file, ZIP64 only where a field overflows;
- ``rewrite``: where a new archive goes, whether it fits, what a failure says, and the temp
  archives a killed rewrite leaves.

State and locks, all of them a :class:`ZipStore`'s:

- ``_cond`` (a condition) guards the index pointer, the overlay and its memory count, the
  count of reads in flight, ``_swapping`` and the spill files retired by a swap; the index
  is loaded under it (first use, and after ``refresh``). A read of a member holds it only to
  count itself as a reader: the ranged reads of the base happen outside it, and a swap waits
  until no reader is left.
- ``_flush_lock`` serialises flushes: it is taken before ``_cond``, never the other way, and
  the new archive is written with only it held.
- An :class:`~n5fs.kvstore.zip.index.ArchiveIndex` is frozen but for ``data_offsets``, a
  cache readers fill without a lock (one ``dict`` item set each, every reader computing the
  same value). ``format``, ``writer`` and ``rewrite`` keep no shared state.
"""

from __future__ import annotations

from n5fs.kvstore.zip.store import ZipStore

__all__ = ["ZipStore"]
