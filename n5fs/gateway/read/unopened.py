"""Reads without opens: the descriptors behind zero-message opens, shared by the threads
reading a file and held by each until its next read.

On a read-only mount of local files the kernel may open files by itself (libfuse's
zero-message opens, engaged by the FUSE front): no OPEN, FLUSH or RELEASE reaches the gateway,
and each READ names a path, not a handle. Reading 10k small files is then two FUSE calls each
(lookup, read) instead of four: each call saved is a Python callback, and the per-file calls
are what bound reading many small files.

A read is answered with a descriptor that libfuse reads from itself, in C, after the callback
returned (as handle reads are: :meth:`~n5fs.gateway.write.filecalls.FileCalls.read_fd`); answering
with bytes instead slowed large sequential reads markedly (a Python ``pread`` and a copy per
128 KiB, plus an open and a close). So the descriptor must outlive
the call, and nobody releases it. libfuse reads it on the thread that called, before that
thread takes its next request: so each thread *holds* the descriptor of its last read until
its own next read, and a descriptor is closed once no thread holds it. Threads reading one
file share one descriptor, as the handles of one open do: the kernel spreads a reader's
read-ahead over its threads, and a descriptor per thread split the backing file's own
read-ahead into as many strided streams (cold reads of gzip N5 blocks fell far behind the
passthrough's). A descriptor serves new holders for up to :data:`REUSE_SECONDS`; after that a
read opens the file again, so a file replaced on disk is seen within that time, well inside
the attribute timeout the kernel already keeps a file's pages for on such a mount.

State and locks: ``_files`` (path -> the descriptor new readers of it share) and ``_held``
(thread ident -> the descriptor that thread holds), with each descriptor's holder count,
live under ``_lock``, a leaf lock held for dict and counter updates only: files are opened
and closed outside it. Every descriptor in ``_files`` or ``_held`` has a holder, so at most
one descriptor per FUSE thread is open (libfuse 3's workers never outnumber
``max_idle_threads``, which the front sets to the thread cap). :meth:`close` (unmount, when no
request runs) closes them all.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.errors import KeyNotFound
from n5fs.gateway.namespace.paths import path_to_key
from n5fs.kvstore.keys import basename
from n5fs.kvstore.tempnames import is_partial
from n5fs.locking import LEAF, assert_held, ranked_lock

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.gateway.read.reader import LocalFile, ObjectReader


#: a thread's descriptor serves later reads of its path for this long (seconds), then the
#: file is opened again: a file replaced on disk is seen by then, as a new open would see it
REUSE_SECONDS = 1.0


@dataclass(slots=True)
class _Shared:
    """One descriptor of a file and how many threads hold it (under ``_lock``)."""

    path: str
    local: LocalFile
    until: float
    holders: int = 0


class UnopenedReads:
    """The descriptors of reads by path (module docstring)."""

    def __init__(self, reader: ObjectReader, clock: Callable[[], float] = time.monotonic) -> None:
        self._reader = reader
        self._clock = clock
        self._lock = ranked_lock("unopened reads", LEAF)
        self._files: dict[str, _Shared] = {}
        self._held: dict[int, _Shared] = {}

    def read_fd(self, path: str, size: int, offset: int) -> int:
        """A descriptor to read ``size`` bytes at ``offset`` of the file at ``path`` from,
        open until this thread's next call. KeyNotFound when there is no such local file;
        a control entry has none (the caller renders it)."""
        ident = threading.get_ident()
        now = self._clock()
        with self._lock:
            unheld = self._let_go(ident, path, now)
            shared = self._take(ident, path, now)
        if unheld is not None:
            unheld.close()  # no thread holds it: every read of it was answered
        if shared is None:
            shared = self._open_shared(ident, path, now)
        self._reader.count_local(shared.local, size, offset)
        return shared.local.fd

    def _let_go(self, ident: int, path: str, now: float) -> LocalFile | None:
        """Under ``_lock``: this thread's hold ends unless it reads on in the same, still
        fresh descriptor; returns the descriptor to close when it was the last holder."""
        assert_held(self._lock)
        held = self._held.get(ident)
        if held is None or (held.path == path and now <= held.until):
            return None
        del self._held[ident]
        held.holders -= 1
        if held.holders:
            return None
        if self._files.get(held.path) is held:
            del self._files[held.path]
        return held.local

    def _take(self, ident: int, path: str, now: float) -> _Shared | None:
        """Under ``_lock``: hold the fresh shared descriptor of ``path``, None if there is none."""
        assert_held(self._lock)
        held = self._held.get(ident)
        if held is not None:
            return held  # kept by _let_go: same path, fresh
        shared = self._files.get(path)
        if shared is None or now > shared.until:
            return None
        shared.holders += 1
        self._held[ident] = shared
        return shared

    def _open_shared(self, ident: int, path: str, now: float) -> _Shared:
        """Open ``path`` (outside the lock) and hold it; a descriptor another thread opened
        meanwhile wins and ours is closed."""
        local = self._open(path)
        with self._lock:
            shared = self._files.get(path)
            spare = None
            if shared is None or now > shared.until:
                shared = self._files[path] = _Shared(path, local, now + REUSE_SECONDS)
            else:
                spare = local
            shared.holders += 1
            self._held[ident] = shared
        if spare is not None:
            spare.close()
        return shared

    def _open(self, path: str) -> LocalFile:
        key = path_to_key(path)  # a control entry is the caller's (FileCalls), never here
        local = None if is_partial(basename(key)) else self._reader.open_local(key)
        if local is None:
            raise KeyNotFound(f"no such file: {path}")
        return local

    def close(self) -> None:
        """Close every held descriptor (no request may run: unmount)."""
        with self._lock:
            shared = {id(s): s for s in self._held.values()}
            self._held, self._files = {}, {}
        for slot in shared.values():
            slot.local.close()
