"""Compressed frames that store their payload uncompressed, so their size follows from it.

A view must state every file's size before anyone reads it (``stat``, ``readdir``), from
metadata and listings alone. A chunk it passes through keeps its stored size (less the N5
header); a chunk it has to rebuild (an N5 end block padded to the full chunk) is re-encoded
in one of these frames, whose size is a function of the payload's length only. Each frame is
a valid stream of its format that every decoder reads (zlib, numcodecs, TensorStore):

- gzip / zlib: deflate "stored" blocks (RFC 1951 section 3.2.4, BTYPE 00) of at most 65,535
  bytes, in a gzip (RFC 1952) or zlib (RFC 1950) wrapper;
- zstd: one frame of raw blocks (RFC 8878 section 3.1.1.2, Block_Type 0) of at most 128 KiB,
  single-segment with an 8-byte content size;
- blosc: c-blosc's ``clevel=0`` buffer (its 16-byte header, then the bytes as they are).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

_DEFLATE_BLOCK = 65_535
_ZSTD_BLOCK = 128 << 10
_ZSTD_MAGIC = struct.pack("<I", 0xFD2FB528)
#: frame header descriptor: 8-byte content size (flag 3), single segment
_ZSTD_DESCRIPTOR = bytes([0xE0])
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, mtime 0, unknown OS
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, "fastest" (the stored level)
BLOSC_OVERHEAD = 16


def _blocks(size: int, block: int) -> int:
    """Blocks a payload of ``size`` bytes takes (an empty one still takes one)."""
    return max(1, -(-size // block))


def _deflate_stored(data: bytes) -> bytes:
    parts: list[bytes] = []
    view = memoryview(data)
    count = _blocks(len(data), _DEFLATE_BLOCK)
    for i in range(count):
        piece = view[i * _DEFLATE_BLOCK : (i + 1) * _DEFLATE_BLOCK]
        final = 1 if i == count - 1 else 0
        parts.append(struct.pack("<BHH", final, len(piece), len(piece) ^ 0xFFFF))
        parts.append(bytes(piece))
    return b"".join(parts)


def gzip_stored(data: bytes) -> bytes:
    trailer = struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)
    return _GZIP_HEADER + _deflate_stored(data) + trailer


def zlib_stored(data: bytes) -> bytes:
    return _ZLIB_HEADER + _deflate_stored(data) + struct.pack(">I", zlib.adler32(data))


def zstd_raw(data: bytes) -> bytes:
    parts = [_ZSTD_MAGIC, _ZSTD_DESCRIPTOR, struct.pack("<Q", len(data))]
    view = memoryview(data)
    count = _blocks(len(data), _ZSTD_BLOCK)
    for i in range(count):
        piece = view[i * _ZSTD_BLOCK : (i + 1) * _ZSTD_BLOCK]
        last = 1 if i == count - 1 else 0
        parts.append(struct.pack("<I", len(piece) << 3 | last)[:3])  # Block_Type 0: raw
        parts.append(bytes(piece))
    return b"".join(parts)


def blosc_memcpy(data: bytes, typesize: int) -> bytes:
    from numcodecs import blosc  # late: importing numcodecs is slow; only blosc data pays it

    out = bytes(blosc.compress(data, b"lz4", 0, 0, 0, max(1, min(typesize, 255))))
    if len(out) != len(data) + BLOSC_OVERHEAD:  # c-blosc's memcpy path, stated in its header
        raise RuntimeError(f"blosc clevel 0 made {len(out)} bytes of {len(data)}")
    return out


@dataclass(frozen=True)
class StoredFrame:
    """One frame kind: how to make it, and its size for a payload of ``n`` bytes."""

    name: str
    encode: Callable[[bytes], bytes]
    size: Callable[[int], int]


RAW = StoredFrame("raw", bytes, lambda n: n)
GZIP = StoredFrame("gzip", gzip_stored, lambda n: 18 + n + 5 * _blocks(n, _DEFLATE_BLOCK))
ZLIB = StoredFrame("zlib", zlib_stored, lambda n: 6 + n + 5 * _blocks(n, _DEFLATE_BLOCK))
ZSTD = StoredFrame("zstd", zstd_raw, lambda n: 13 + n + 3 * _blocks(n, _ZSTD_BLOCK))


def blosc_frame(typesize: int) -> StoredFrame:
    return StoredFrame(
        "blosc", lambda data: blosc_memcpy(data, typesize), lambda n: n + BLOSC_OVERHEAD
    )
