"""Reads: the bytes of stored objects, from the store to the kernel.

State this package owns:

- the byte cache (:class:`~n5fs.gateway.read.byte_cache.ByteLRU`): whole small objects and
  the translated pieces views keep, under one byte budget for what is cached *and* what is
  being fetched; each entry carries the version it came from, and a reader's *ticket* goes
  stale when the key changes, so old bytes are never stored after a commit;
- the opened stamps (:class:`~n5fs.gateway.read.byte_cache.OpenedStamps`): the version each
  key had at its last open, which decides whether the kernel may keep its pages;
- the read-ahead (:mod:`~n5fs.gateway.read.prefetch`): objects and bytes in flight for the
  whole mount, single-flight fetches, the next objects of a folder being read in order;
- the descriptors (:mod:`~n5fs.gateway.read.reader`, :mod:`~n5fs.gateway.read.unopened`):
  a read-only handle of a local file reads its own descriptor (libfuse reads it in C), and
  zero-message opens share a descriptor per thread.

Locks: every lock here is a *leaf* of the gateway's lock order (see :mod:`n5fs.gateway`):
held for dictionary and counter work only, never around store I/O, and no other lock is taken
under one, except that a new read flight reserves its bytes in the byte cache under the
flight table's lock (an outer leaf, :data:`~n5fs.locking.OUTER_LEAF`). Callers may hold a node
lock or a commit-order hold while reading; fetches run on the read-ahead pool (the gateway's
``n5fs-read``, :class:`~n5fs.workers.Workers`), which takes no gateway lock.
"""
