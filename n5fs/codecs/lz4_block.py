"""lz4-java's ``LZ4BlockOutputStream`` framing, which N5's ``lz4`` compression writes.

This is neither the LZ4 frame format (``.lz4`` files) nor numcodecs' LZ4 (a 4-byte size
prefix). lz4-java (``net.jpountz.lz4.LZ4BlockOutputStream``) cuts the input into blocks of
at most ``blockSize`` bytes and writes each as::

    magic                "LZ4Block" (8 bytes)
    token                1 byte: method (0x10 raw, 0x20 LZ4) | level, where
                         blockSize <= 1 << (10 + level)
    compressed length    int32 little endian
    decompressed length  int32 little endian
    checksum             int32 little endian: XXHash32 (seed 0x9747b28c) of the
                         decompressed bytes, masked with 0x0FFFFFFF (lz4-java's
                         ``StreamingXXHash32.asChecksum()`` drops the top 4 bits)
    data                 compressed length bytes (a raw LZ4 block, or the bytes as they are)

``finish()`` ends the stream with an empty block (both lengths 0, checksum 0). The checks
below are those of lz4-java's ``LZ4BlockInputStream.refill()``.

z5 (z5py) writes N5 ``lz4`` differently: one bare LZ4 block (``LZ4_compress_default``, no
magic, no lengths, no size prefix). :func:`decode_n5` tells the two apart per chunk by the
magic. A valid bare block can never start with it: its first byte would be the token
``'L'`` (4 literals, ``"Z4Bl"``, then a match) whose offset ``"oc"`` (25455) points before
the 4 bytes produced so far, which LZ4 forbids.
"""

from __future__ import annotations

import struct

import xxhash

from n5fs.codecs.limits import CodecError, too_large

MAGIC = b"LZ4Block"
HEADER_LENGTH = len(MAGIC) + 1 + 4 + 4 + 4
METHOD_RAW = 0x10
METHOD_LZ4 = 0x20
DEFAULT_SEED = 0x9747B28C
CHECKSUM_MASK = 0x0FFFFFFF
COMPRESSION_LEVEL_BASE = 10
MIN_BLOCK_SIZE = 64
MAX_BLOCK_SIZE = 1 << (COMPRESSION_LEVEL_BASE + 0x0F)
DEFAULT_BLOCK_SIZE = 1 << 16

_LENGTHS = struct.Struct("<iiI")  # compressed, decompressed (signed, as Java reads), checksum
_SIZE_PREFIX = struct.Struct("<I")  # numcodecs.LZ4's uncompressed-size prefix


def compression_level(block_size: int) -> int:
    """The token's low nibble for ``block_size``: ceil(log2(blockSize)) - 10, at least 0."""
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(
            f"lz4 blockSize must be in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}], not {block_size}"
        )
    return max(0, (block_size - 1).bit_length() - COMPRESSION_LEVEL_BASE)


def checksum(data: bytes) -> int:
    """The checksum lz4-java stores for a block's decompressed ``data``."""
    return xxhash.xxh32_intdigest(data, DEFAULT_SEED) & CHECKSUM_MASK


def _lz4_compress(data: bytes) -> bytes:
    """A raw LZ4 block (numcodecs.LZ4 output without its 4-byte size prefix)."""
    from numcodecs.lz4 import LZ4  # late: importing numcodecs is slow; only lz4 pays it

    return bytes(LZ4().encode(data))[_SIZE_PREFIX.size :]


def _lz4_decompress(block: bytes, size: int, what: str) -> bytes:
    """Decode one raw LZ4 block that must yield exactly ``size`` bytes and use all input."""
    from numcodecs.lz4 import LZ4

    try:
        return bytes(LZ4().decode(_SIZE_PREFIX.pack(size) + block))
    except (RuntimeError, ValueError) as exc:
        raise CodecError(f"{what} block is corrupt: {exc}", rule="undecodable") from exc


def encode(data: bytes, block_size: int = DEFAULT_BLOCK_SIZE) -> bytes:
    """What ``new LZ4BlockOutputStream(out, blockSize)`` writes for ``data``, then ``close()``."""
    level = compression_level(block_size)
    out = bytearray()
    for start in range(0, len(data), block_size):
        piece = data[start : start + block_size]
        packed = _lz4_compress(piece)
        method = METHOD_LZ4
        if len(packed) >= len(piece):  # incompressible: lz4-java stores the bytes as they are
            method, packed = METHOD_RAW, piece
        out += MAGIC + bytes([method | level])
        out += _LENGTHS.pack(len(packed), len(piece), checksum(piece)) + packed
    out += MAGIC + bytes([METHOD_RAW | level]) + _LENGTHS.pack(0, 0, 0)
    return bytes(out)


def _corrupt(what: str, offset: int, reason: str) -> CodecError:
    return CodecError(
        f"{what} (lz4-java LZ4Block stream) is corrupt at byte {offset}: {reason}",
        rule="undecodable",
    )


def _check_lengths(what: str, at: int, method: int, stored: int, original: int, level: int) -> None:
    """lz4-java's consistency rules for one block header."""
    if method not in (METHOD_RAW, METHOD_LZ4):
        raise _corrupt(what, at, f"compression method 0x{method:02x} is neither 0x10 nor 0x20")
    if original < 0 or stored < 0:
        raise _corrupt(what, at, "negative block length")
    if original > 1 << (COMPRESSION_LEVEL_BASE + level):
        raise _corrupt(
            what,
            at,
            f"block of {original} bytes exceeds the token's block size "
            f"{1 << (COMPRESSION_LEVEL_BASE + level)}",
        )
    if (original == 0) != (stored == 0):
        raise _corrupt(what, at, "one block length is 0 and the other is not")
    if method == METHOD_RAW and original != stored:
        raise _corrupt(what, at, "a raw block's two lengths differ")


def decode(data: bytes, limit: int, what: str = "lz4") -> bytes:
    """Decode a whole stream to at most ``limit`` bytes, checking every block's checksum.

    Each block states its decompressed length before any work, so a stream that would pass
    ``limit`` is refused without inflating it. Bytes after the end block are refused; a
    stream without the end block is accepted (N5 Java's reader never reads that far).
    """
    out = bytearray()
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER_LENGTH:
            raise _corrupt(what, pos, f"{len(data) - pos} bytes left, a block header has 21")
        if data[pos : pos + len(MAGIC)] != MAGIC:
            raise _corrupt(what, pos, "the block does not start with the magic 'LZ4Block'")
        token = data[pos + len(MAGIC)]
        stored, original, check = _LENGTHS.unpack_from(data, pos + len(MAGIC) + 1)
        _check_lengths(what, pos, token & 0xF0, stored, original, token & 0x0F)
        body = pos + HEADER_LENGTH
        if original == 0:
            if check != 0:
                raise _corrupt(what, pos, "the end block has a non-zero checksum")
            if body != len(data):
                raise CodecError(
                    f"{what} stream has {len(data) - body} bytes after its end block",
                    rule="trailing-data",
                )
            break
        if len(out) + original > limit:
            raise too_large(limit, what)
        if len(data) - body < stored:
            raise _corrupt(what, pos, f"the block needs {stored} bytes, {len(data) - body} left")
        block = data[body : body + stored]
        piece = block if token & 0xF0 == METHOD_RAW else _lz4_decompress(block, original, what)
        computed = checksum(piece)
        if computed != check:
            raise CodecError(
                f"{what} block at byte {pos}: checksum mismatch (stored "
                f"0x{check:08x}, computed 0x{computed:08x})",
                rule="checksum",
            )
        out += piece
        pos = body + stored
    return bytes(out)


# -- z5's bare LZ4 block ---------------------------------------------------------------------

_MIN_MATCH = 4
_RUN_MASK = 0x0F


def _bare_corrupt(what: str, offset: int, reason: str) -> CodecError:
    return CodecError(
        f"{what} (bare LZ4 block) is corrupt at byte {offset}: {reason}", rule="undecodable"
    )


def _length(block: bytes, pos: int, base: int, what: str) -> tuple[int, int]:
    """A literal or match length: ``base`` (15 means "more follows"), then bytes of 255
    until one below 255. Returns (length, position after it)."""
    if base != _RUN_MASK:
        return base, pos
    while True:
        if pos >= len(block):
            raise _bare_corrupt(what, pos, "a length runs past the end")
        byte = block[pos]
        base += byte
        pos += 1
        if byte != 0xFF:
            return base, pos


def bare_size(block: bytes, limit: int, what: str = "lz4") -> int:
    """How many bytes one bare LZ4 block decodes to, from its sequence headers alone.

    Nothing is decompressed; the walk stops (:func:`~n5fs.codecs.limits.too_large`) as soon
    as the count passes ``limit``, so a bomb costs at most one pass over its own bytes.
    Each sequence is: token (literal length << 4 | match length - 4), literal length
    extension, literals, 2-byte little-endian offset (1 .. bytes so far), match length
    extension; the last sequence stops after its literals.
    """
    pos = produced = 0
    while True:
        if pos >= len(block):
            raise _bare_corrupt(what, pos, "the block ends before its last literals")
        token = block[pos]
        literals, pos = _length(block, pos + 1, token >> 4, what)
        pos += literals
        produced += literals
        if pos > len(block):
            raise _bare_corrupt(what, len(block), "literals run past the end")
        if produced > limit:
            raise too_large(limit, what)
        if pos == len(block):
            return produced
        if pos + 2 > len(block):
            raise _bare_corrupt(what, pos, "a match offset is cut short")
        offset = block[pos] | block[pos + 1] << 8
        if not 0 < offset <= produced:
            raise _bare_corrupt(what, pos, f"match offset {offset} with {produced} bytes out")
        match, pos = _length(block, pos + 2, token & _RUN_MASK, what)
        produced += match + _MIN_MATCH
        if produced > limit:
            raise too_large(limit, what)


def decode_bare(block: bytes, limit: int, what: str = "lz4") -> bytes:
    """Decode one bare LZ4 block (what z5 writes) to at most ``limit`` bytes.

    The block states no size, so the fast path decodes into exactly ``limit`` bytes (an N5
    chunk's expected size); when that fails, :func:`bare_size` says why - too large (a
    bomb, refused uninflated), corrupt, or shorter (then decoded at its own size, and the
    caller's size check names the difference).
    """
    if limit > 0:
        try:
            from numcodecs.lz4 import LZ4  # late: importing numcodecs is slow; only lz4 pays it

            return bytes(LZ4().decode(_SIZE_PREFIX.pack(limit) + block))
        except (RuntimeError, ValueError):
            pass  # diagnosed below
    size = bare_size(block, limit, what)
    if size == 0:
        return b""  # the one-byte empty block (numcodecs refuses a zero size prefix)
    if size == limit:
        # The sequence headers add up but LZ4 still refused it (e.g. its end-of-block rules).
        raise _bare_corrupt(what, 0, f"its sequences add up to {size} bytes but do not decode")
    return _lz4_decompress(block, size, f"{what} (bare LZ4 block)")


def decode_n5(data: bytes, limit: int, what: str = "lz4") -> bytes:
    """An N5 ``lz4`` payload: lz4-java's LZ4Block stream (N5 Java) when it starts with the
    magic, else one bare LZ4 block (z5). Both bounded by ``limit``."""
    if data.startswith(MAGIC):
        return decode(data, limit, what)
    return decode_bare(data, limit, what)
