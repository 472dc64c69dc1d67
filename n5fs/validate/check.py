"""One chunk read from a local folder and judged: what every worker of ``n5fs validate`` does,
in a thread (:mod:`.chunks`) or in a worker process (:mod:`.procs`).

Why apart: both kinds of worker must give one verdict per chunk, by one rule: a key whose
bytes could not be had is ``unreadable``, bytes refused by the array are ``invalid``, any other
failure of a check is ``unreadable`` too (it was not judged).

A local chunk is opened relative to its folder's open descriptor (``openat``, ``O_NOFOLLOW``,
``O_NONBLOCK``) and read with one ``read`` of the size expected, no Python file object; a
file that cannot be opened so (a link, gone, an error) is left to the store's ``get``, which
decides, as everywhere else, whether the key is there and where a link may lead.

Stateless: no shared state, no locks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from n5fs.errors import N5fsError, Rejected
from n5fs.validate.report import Finding, finding

if TYPE_CHECKING:
    from n5fs.formats.base import ArrayNode

#: a chunk file: never through a link (``get`` checks where it leads), never blocking (a FIFO
#: planted at a chunk's name reads as empty: judged, not waited on)
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: a folder whose chunks are opened relative to it
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: bytes asked of each further ``read`` of a file longer than its first read
READ_MORE = 1 << 16
#: the first read of a chunk listed without its size: small chunks are read whole by it
GUESS = 1 << 16
#: errors that make a key unreadable rather than end the run: every n5fs error (a refusal
#: is told apart where it can occur) and the ``OSError`` a local store's read lets through
#: (EIO, EACCES); anything else is a bug and ends the run
STORE_FAULTS = (N5fsError, OSError)
#: the reason of a key that was listed but is gone when read (deleted since, e.g. by a
#: writer still at work): its bytes were never seen, so it is unreadable, not valid
VANISHED = "vanished while validating (listed, then gone when read)"

#: why a key has no bytes to judge
Unread: TypeAlias = N5fsError | OSError


@dataclass(frozen=True, slots=True)
class ChunkVerdict:
    finding: Finding
    #: the chunk could not be read or decoded (a store fault): not checked, as opposed to
    #: read and judged invalid
    unreadable: bool


def first_read(size: int) -> int:
    """Bytes to ask of a chunk's first ``read``: its listed ``size`` plus one (to see that it
    did not grow since), or :data:`GUESS` for a chunk listed without a size (negative)."""
    return size + 1 if size >= 0 else GUESS


def read_file(directory: int, name: str, expect: int) -> bytes | None:
    """File ``name`` of the open folder ``directory``, read with one ``read`` of ``expect``
    bytes where that finds its end (a short read of a regular file is its end), else to its
    end. None for a link (``get`` decides where it leads), a missing file, or one that cannot
    be read."""
    try:
        fd = os.open(name, OPEN_FLAGS, dir_fd=directory)
    except OSError:
        return None
    try:
        data = os.read(fd, expect)
        if len(data) < expect:
            return data
        parts = [data]  # longer than expected: it grew since it was listed, or was not sized
        rest = max(READ_MORE, os.fstat(fd).st_size - len(data) + 1)
        while more := os.read(fd, rest):
            parts.append(more)
            rest = READ_MORE
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def judge(
    array: ArrayNode, key: str, position: tuple[int, ...], data: bytes | Unread
) -> ChunkVerdict | None:
    """None for a valid chunk; an unreadable verdict for a read that failed (``data`` is
    its error) or a check that failed for another reason than the bytes (any error but
    :class:`Rejected`); an invalid one only when the bytes were read and refused."""
    if not isinstance(data, bytes):
        return ChunkVerdict(finding(key, data), unreadable=True)
    try:
        array.validate_chunk(position, data, path=key)
    except Rejected as exc:
        return ChunkVerdict(finding(key, exc), unreadable=False)
    except N5fsError as exc:  # not an OSError: decoding reads no store, so that is a bug
        return ChunkVerdict(finding(key, exc), unreadable=True)
    return None
