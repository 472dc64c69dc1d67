"""glibc malloc's thresholds, set once per process for the kind of work it does.

glibc serves a request of at least its *mmap threshold* with a mapping of its own, unmapped
at free; below it, from the heap of the thread's arena, which keeps freed memory unless more
than the *trim threshold* is free at its top. By default both move: the mmap threshold rises
to the size of every mapped buffer freed (up to 32 MiB). Chunk buffers are large (a 128^3
uint16 block decodes to 4 MiB), so which side of the thresholds they fall on decides between
two costs, and the right choice depends on the process:

- a daemon (:func:`map_large_buffers`, every mount; why in :mod:`n5fs.gateway.read.reader`,
  "Memory"): long-lived, with cached buffers between transient ones in as many arenas as
  threads, so heaps fragment and RSS outgrows the cache budget. Buffers of
  :data:`MMAP_THRESHOLD` and more get mappings of their own, so RSS comes back to the cache
  budget after a burst of reads; each 4 MiB buffer costs its page faults.
- a batch job (:func:`reuse_large_buffers`, ``n5fs validate``): its memory is bounded by its
  own window and it ends, so it reuses heap memory. Given a fresh mapping, every decoded 4 MiB
  block cost a thousand page faults and its unmap a TLB shootdown on every core, which
  dominated validating gzip blocks from the command line; reusing buffers up to
  :data:`BATCH_MMAP_THRESHOLD` removed that cost and left peak RSS about where it was.

A threshold the user set (``MALLOC_MMAP_THRESHOLD_``, the ``glibc.malloc`` tunables) wins;
elsewhere than glibc there is nothing to set.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BATCH_MMAP_THRESHOLD", "MMAP_THRESHOLD", "map_large_buffers", "reuse_large_buffers"]

#: a daemon's buffers at least this large get a mapping of their own, unmapped at free
MMAP_THRESHOLD = 2 << 20
#: a batch job's buffers up to this size come from the heap (glibc's own dynamic maximum) ...
BATCH_MMAP_THRESHOLD = 32 << 20
#: ... which keeps this much free memory at its top before it gives any back
BATCH_TRIM_THRESHOLD = 2 * BATCH_MMAP_THRESHOLD
# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, unless this is not glibc or the user tuned malloc already."""
    if platform.libc_ver()[0] != "glibc":
        return None
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return None
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.mmap_threshold" in tunables or "glibc.malloc.trim_threshold" in tunables:
        return None
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return cast("Callable[[int, int], int]", mallopt)


@functools.cache
def map_large_buffers() -> bool:
    """Fix the mmap threshold at :data:`MMAP_THRESHOLD` (a daemon: module docstring); True
    when this call set it. Idempotent."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


@functools.cache
def reuse_large_buffers() -> bool:
    """Fix the thresholds at :data:`BATCH_MMAP_THRESHOLD` and :data:`BATCH_TRIM_THRESHOLD`
    (a batch job: module docstring); True when this call set them. Idempotent."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, BATCH_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, BATCH_TRIM_THRESHOLD)
    )
