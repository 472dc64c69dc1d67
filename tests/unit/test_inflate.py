"""The inflater (ISA-L when installed) is exactly as strict as zlib: every stream, good or
damaged, gets the same verdict and the same bytes through :mod:`n5fs.codecs.limits` and the
streaming check as through the standard library's zlib."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from n5fs.codecs.limits import INFLATE, CodecError, gzip_decompress, inflater, zlib_decompress
from n5fs.formats.n5 import N5ArrayNode, N5Format
from n5fs.gateway.commit.streamcheck import Unsure, parser_for

RAMP = (np.arange(64**3, dtype=np.uint16) % 4093).astype(">u2").tobytes()


def gzip_bytes(data: bytes) -> bytes:
    comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return comp.compress(data) + comp.flush()


def damaged(stream: bytes) -> dict[str, bytes]:
    """A good gzip stream and ways to break it, each one byte-level edit."""
    middle = len(stream) // 2
    crc_at = len(stream) - 8
    return {
        "good": stream,
        "truncated": stream[:middle],
        "bit flipped": stream[:middle] + bytes([stream[middle] ^ 0x10]) + stream[middle + 1 :],
        "bad crc": stream[:crc_at] + bytes([stream[crc_at] ^ 0xFF]) + stream[crc_at + 1 :],
        "bad size": stream[:-4] + struct.pack("<I", len(RAMP) + 1),
        "bad magic": b"\x1f\x8c" + stream[2:],
        "empty": b"",
    }


def stdlib_verdict(stream: bytes, wbits: int) -> bytes | None:
    """What zlib itself makes of ``stream``: its bytes, or None when it refuses."""
    dec = zlib.decompressobj(wbits)
    try:
        out = dec.decompress(stream) + dec.flush()
    except zlib.error:
        return None
    return out if dec.eof and not dec.unused_data else None


@pytest.mark.parametrize("case", list(damaged(gzip_bytes(RAMP))))
def test_bounded_decode_agrees_with_zlib(case: str) -> None:
    stream = damaged(gzip_bytes(RAMP))[case]
    expected = stdlib_verdict(stream, 16 + zlib.MAX_WBITS)
    try:
        got: bytes | None = gzip_decompress(stream, len(RAMP))
    except CodecError:
        got = None
    assert got == expected, f"{INFLATE} and zlib disagree on a {case} stream"
    assert (expected is not None) == (case == "good")


@pytest.mark.parametrize("case", list(damaged(gzip_bytes(RAMP))))
def test_streaming_check_agrees_with_zlib(case: str) -> None:
    """Fed in 128 KiB pieces as a writer's data arrives, the streaming check of an N5 gzip
    block accepts exactly the streams zlib decodes to the block's size."""
    stream = damaged(gzip_bytes(RAMP))[case]
    attrs = {"dimensions": [64] * 3, "blockSize": [64] * 3, "dataType": "uint16",
             "compression": {"type": "gzip"}}  # fmt: skip
    node = N5Format().parse_metadata("attributes.json", json.dumps(attrs).encode())
    assert isinstance(node, N5ArrayNode)
    header = struct.pack(">HH3I", 0, 3, 64, 64, 64)
    parser = parser_for(node, (0, 0, 0))
    assert parser is not None
    accepted = True
    try:
        data = header + stream
        for at in range(0, len(data), 128 << 10):
            parser.feed(data[at : at + (128 << 10)])
        accepted = parser.complete()
    except Unsure:
        accepted = False
    assert accepted == (stdlib_verdict(stream, 16 + zlib.MAX_WBITS) == RAMP)


def test_zlib_framing_and_trailing_bytes() -> None:
    stream = zlib.compress(RAMP)
    assert zlib_decompress(stream, len(RAMP)) == RAMP
    with pytest.raises(CodecError, match="trailing"):
        zlib_decompress(stream + b"x", len(RAMP))
    with pytest.raises(CodecError, match="more than"):
        zlib_decompress(stream, len(RAMP) - 1)
    dec = inflater()
    assert dec.decompress(stream, 100) == RAMP[:100]
    assert dec.unconsumed_tail  # the protocol the streaming check relies on


def zlib_damaged(stream: bytes) -> dict[str, bytes]:
    """A good zlib-framed stream (Zarr v2 ``zlib``, N5 ``useZlib``) and ways to break it."""
    middle = len(stream) // 2
    return {
        "good": stream,
        "truncated": stream[:middle],
        "bit flipped": stream[:middle] + bytes([stream[middle] ^ 0x10]) + stream[middle + 1 :],
        "bad adler": stream[:-1] + bytes([stream[-1] ^ 0xFF]),
        "bad header": b"\x78\x00" + stream[2:],
    }


@pytest.mark.parametrize("case", list(zlib_damaged(zlib.compress(RAMP))))
def test_zlib_framed_decode_agrees_with_zlib(case: str) -> None:
    stream = zlib_damaged(zlib.compress(RAMP))[case]
    expected = stdlib_verdict(stream, zlib.MAX_WBITS)
    try:
        got: bytes | None = zlib_decompress(stream, len(RAMP))
    except CodecError:
        got = None
    assert got == expected, f"{INFLATE} and zlib disagree on a {case} zlib stream"
    assert (expected is not None) == (case == "good")
