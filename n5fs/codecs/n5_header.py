"""The N5 block header: what every N5 chunk file starts with.

Per the N5 file-system specification (saalfeldlab/n5 README, "Chunks are stored in the
following binary format")::

    mode                  uint16 big endian   (default = 0x0000, varlength = 0x0001)
    number of dimensions  uint16 big endian
    dimension 1[,...,n]   uint32 big endian   (N5 order: the fastest-varying dimension first)
    [mode == varlength ? number of elements (uint32 big endian)]
    compressed data       (big endian values)

The header is the truth about a block: its dimensions may be smaller than the dataset's
``blockSize`` (N5 Java and z5 clip end blocks). Mode 2 ("object", newer N5 Java for
serialised objects, which has no dimensions) is refused as unsupported: its payload has no
fixed layout n5fs could check.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

from n5fs.codecs.limits import CodecError

if TYPE_CHECKING:
    from collections.abc import Sequence

MODE_DEFAULT = 0
MODE_VARLENGTH = 1
MODE_OBJECT = 2

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U32_MAX = 0xFFFFFFFF
_PREFIX = 4  # mode + number of dimensions


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """A parsed N5 block header.

    ``dims`` is in N5 order (as ``dimensions`` in ``attributes.json``); ``count`` is the
    stored element count of a varlength block (None in default mode). ``size`` is the
    header's length in bytes: the payload starts there.
    """

    mode: int
    dims: tuple[int, ...]
    count: int | None
    size: int

    @property
    def varlength(self) -> bool:
        return self.mode == MODE_VARLENGTH

    @property
    def num_elements(self) -> int:
        """Elements in the payload: the stored count, else the product of ``dims``.

        Check ``dims`` against the dataset first: the product of 65535 untrusted uint32
        values takes seconds to compute.
        """
        return prod(self.dims) if self.count is None else self.count


def _malformed(message: str) -> CodecError:
    return CodecError(f"N5 block header: {message}", rule="block-header")


def decode_header(data: bytes) -> BlockHeader:
    """Parse the header at the start of ``data``; the payload is ``data[header.size:]``."""
    if len(data) < _PREFIX:
        raise _malformed(
            f"{len(data)} bytes, shorter than the 4 bytes of mode and number of dimensions"
        )
    (mode,) = _U16.unpack_from(data, 0)
    (ndim,) = _U16.unpack_from(data, 2)
    if mode == MODE_OBJECT:
        raise CodecError(
            "N5 block mode 2 (object) is not supported: only default (0) and varlength (1) "
            "blocks hold array values n5fs can check",
            rule="block-mode",
        )
    if mode not in (MODE_DEFAULT, MODE_VARLENGTH):
        raise CodecError(
            f"N5 block mode {mode} is unknown; the spec defines default = 0x0000 and "
            "varlength = 0x0001",
            rule="block-mode",
        )
    size = _PREFIX + 4 * ndim + (4 if mode == MODE_VARLENGTH else 0)
    if len(data) < size:
        raise _malformed(
            f"{len(data)} bytes, but mode {mode} with {ndim} dimensions needs a {size}-byte header"
        )
    dims = tuple(_U32.unpack_from(data, _PREFIX + 4 * i)[0] for i in range(ndim))
    count = _U32.unpack_from(data, size - 4)[0] if mode == MODE_VARLENGTH else None
    return BlockHeader(mode=mode, dims=dims, count=count, size=size)


def encode_header(dims: Sequence[int], *, num_elements: int | None = None) -> bytes:
    """A header for a block of ``dims`` (N5 order): default mode, or varlength if
    ``num_elements`` is given (N5 Java writes varlength only when the count differs)."""
    if len(dims) > 0xFFFF:
        raise ValueError(f"an N5 block has at most 65535 dimensions, not {len(dims)}")
    if any(not 0 <= d <= _U32_MAX for d in dims):
        raise ValueError(f"N5 block dimensions must fit in uint32: {list(dims)}")
    mode = MODE_DEFAULT if num_elements is None else MODE_VARLENGTH
    parts = [_U16.pack(mode), _U16.pack(len(dims)), *(_U32.pack(d) for d in dims)]
    if num_elements is not None:
        if not 0 <= num_elements <= _U32_MAX:
            raise ValueError(f"an N5 varlength count must fit in uint32, not {num_elements}")
        parts.append(_U32.pack(num_elements))
    return b"".join(parts)
