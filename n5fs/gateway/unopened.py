"""Reads without opens: the descriptors behind zero-message opens, one per reading thread.

On a read-only mount of local files the kernel may open files by itself (libfuse's
zero-message opens, engaged by the FUSE front): no OPEN, FLUSH or RELEASE reaches the gateway,
and each READ names a path, not a handle. Reading 10k small files is then two FUSE calls each
(lookup, read) instead of four, which took the benchmark's small-file read from about the
passthrough's time to half of it.

A read is answered with a descriptor that libfuse reads from itself, in C, after the callback
returned (as handle reads are: :meth:`~n5fs.gateway.filecalls.FileCalls.read_fd`); answering
with bytes instead cost a third of the throughput of large sequential reads (a Python
``pread`` and a copy per 128 KiB, plus an open and a close). So the descriptor must outlive
the call, and nobody releases it. libfuse reads it on the thread that called, before that
thread takes its next request; so each thread holds the descriptor of its last read and closes
it at its own next read, never another thread's. A thread whose next read is of the same path
keeps it for up to :data:`REUSE_SECONDS` (the kernel spreads one reader's read-ahead over its
threads): a large file costs an ``open`` per thread and second, not one per 128 KiB; a file
replaced on disk is seen once that time is over, well inside the attribute timeout the kernel
already keeps a file's pages for on such a mount.

State and locks: ``_held`` maps a thread's ident to its :class:`_Held` slot; a thread reads and
replaces only its own slot (one dict ``get`` or item set at a time: atomic under the GIL, no
lock). libfuse 3's workers never outnumber ``max_idle_threads`` (the front sets it to the
thread cap), so at most that many descriptors are held. :meth:`close` (unmount, when no
request runs) closes them all.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound
from n5fs.gateway.namespace import is_control, path_to_key
from n5fs.kvstore.keys import basename
from n5fs.kvstore.tempnames import is_partial

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.gateway.reader import LocalFile, ObjectReader


#: a thread's descriptor serves later reads of its path for this long (seconds), then the
#: file is opened again: a file replaced on disk is seen by then, as a new open would see it
REUSE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _Held:
    path: str
    local: LocalFile
    until: float


class UnopenedReads:
    """The descriptors of reads by path (module docstring)."""

    def __init__(self, reader: ObjectReader, clock: Callable[[], float] = time.monotonic) -> None:
        self._reader = reader
        self._clock = clock
        self._held: dict[int, _Held] = {}

    def read_fd(self, path: str, size: int, offset: int) -> int:
        """A descriptor to read ``size`` bytes at ``offset`` of the file at ``path`` from,
        open until this thread's next call. KeyNotFound when there is no such local file;
        a control entry has none (the caller renders it)."""
        ident = threading.get_ident()
        held = self._held.get(ident)
        now = self._clock()
        if held is not None and (held.path != path or now > held.until):
            del self._held[ident]
            held.local.close()  # libfuse read it before this thread took this request
            held = None
        if held is None:
            held = _Held(path, self._open(path), now + REUSE_SECONDS)
            self._held[ident] = held
        self._reader.count_local(held.local, size, offset)
        return held.local.fd

    def _open(self, path: str) -> LocalFile:
        key = path_to_key(path)
        local = None
        if not is_control(key) and not is_partial(basename(key)):
            local = self._reader.open_local(key)
        if local is None:
            raise KeyNotFound(f"no such file: {path}")
        return local

    def close(self) -> None:
        """Close every held descriptor (no request may run: unmount)."""
        held, self._held = self._held, {}
        for slot in held.values():
            slot.local.close()
