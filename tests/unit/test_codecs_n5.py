"""N5 codecs: block header, lz4-java LZ4Block framing, the N5 compression objects.

Byte literals here are hand-written from the published layouts (N5 README block format,
lz4-java ``LZ4BlockOutputStream``), never produced by the code under test.
"""

from __future__ import annotations

import json
import os
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash
from numcodecs.lz4 import LZ4

from n5fs.codecs import lz4_block
from n5fs.codecs.limits import CodecError
from n5fs.codecs.n5_compression import (
    COMPRESSIONS,
    BloscCompression,
    GzipCompression,
    Lz4Compression,
    compression_from_type,
    parse_compression,
)
from n5fs.codecs.n5_header import MODE_DEFAULT, MODE_VARLENGTH, decode_header, encode_header

# --- block header ------------------------------------------------------------------------

# The N5 README's example: a 3-D uint16 block of 1x2x3, default mode.
README_HEADER = bytes.fromhex("00000003000000010000000200000003")


def test_header_from_the_spec_example() -> None:
    header = decode_header(README_HEADER + b"\x00\x01")
    assert header.mode == MODE_DEFAULT
    assert header.dims == (1, 2, 3)
    assert header.num_elements == 6
    assert header.size == 16
    assert not header.varlength


def test_varlength_header_carries_its_count() -> None:
    data = bytes.fromhex("0001000200000004000000040000000a") + b"x" * 10
    header = decode_header(data)
    assert header.mode == MODE_VARLENGTH
    assert header.varlength
    assert header.dims == (4, 4)
    assert header.num_elements == 10
    assert header.size == 16  # 2 + 2 + 2 * 4 + 4


def test_encode_header_writes_the_spec_layout() -> None:
    assert encode_header((1, 2, 3)) == README_HEADER
    assert encode_header((4, 4), num_elements=10) == bytes.fromhex(
        "0001000200000004000000040000000a"
    )


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (b"", "block-header"),
        (b"\x00\x00\x00", "block-header"),
        (bytes.fromhex("0000000300000001"), "block-header"),  # 3 dims promised, 1 given
        (bytes.fromhex("0001000100000004"), "block-header"),  # varlength without count
        (bytes.fromhex("000200000004"), "block-mode"),  # object mode
        (bytes.fromhex("0007000100000004"), "block-mode"),
        (bytes.fromhex("ffff000100000004"), "block-mode"),
    ],
)
def test_malformed_headers_are_refused(data: bytes, rule: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_header(data)
    assert info.value.rule == rule


def test_object_mode_is_named_in_the_refusal() -> None:
    with pytest.raises(CodecError, match="object"):
        decode_header(bytes.fromhex("000200000004"))


# --- lz4-java LZ4Block framing -----------------------------------------------------------

SEED = 0x9747B28C


def _java_checksum(data: bytes) -> int:
    """lz4-java: StreamingXXHash32(seed 0x9747b28c).asChecksum() keeps the low 28 bits."""
    return xxhash.xxh32_intdigest(data, SEED) & 0x0FFFFFFF


def _block(token: int, stored: bytes, original: bytes) -> bytes:
    """One block: magic, token, int32 LE lengths, int32 LE checksum, data."""
    return (
        b"LZ4Block"
        + bytes([token])
        + struct.pack("<i", len(stored))
        + struct.pack("<i", len(original))
        + struct.pack("<i", _java_checksum(original))
        + stored
    )


def _end(level: int) -> bytes:
    return b"LZ4Block" + bytes([0x10 | level]) + b"\x00" * 12


def test_hand_built_raw_and_lz4_blocks_decode() -> None:
    # An LZ4 block made of one literal run: token 0x50 = 5 literals, no match.
    level = 6  # blockSize 65536 = 1 << (10 + 6)
    stream = (
        _block(0x10 | level, b"raw! ", b"raw! ")
        + _block(0x20 | level, b"\x50hello", b"hello")
        + _end(level)
    )
    assert lz4_block.decode(stream, 100) == b"raw! hello"


def test_encoder_writes_the_published_layout() -> None:
    data = b"abcdefgh" * 40 + os.urandom(100)  # compressible, then incompressible
    stream = lz4_block.encode(data, block_size=256)
    # blockSize 256 -> level max(0, 8 - 10) = 0; blocks of at most 256 bytes, then the end.
    pos, out = 0, b""
    while True:
        assert stream[pos : pos + 8] == b"LZ4Block"
        token = stream[pos + 8]
        stored, original, check = struct.unpack_from("<iii", stream, pos + 9)
        assert token & 0x0F == 0
        if original == 0:
            assert (token, stored, check) == (0x10, 0, 0)
            assert pos + 21 == len(stream)
            break
        assert original <= 256
        body = stream[pos + 21 : pos + 21 + stored]
        if token & 0xF0 == 0x10:
            piece = body
        else:
            assert token & 0xF0 == 0x20
            assert stored < original
            piece = bytes(LZ4().decode(struct.pack("<I", original) + body))
        assert check == _java_checksum(piece)
        out += piece
        pos += 21 + stored
    assert out == data
    assert lz4_block.decode(stream, len(data)) == data


def test_level_follows_block_size() -> None:
    assert lz4_block.compression_level(64) == 0
    assert lz4_block.compression_level(1024) == 0
    assert lz4_block.compression_level(1025) == 1
    assert lz4_block.compression_level(65536) == 6
    assert lz4_block.compression_level(1 << 25) == 15
    with pytest.raises(ValueError, match="blockSize"):
        lz4_block.compression_level(63)


def test_empty_input_is_just_the_end_block() -> None:
    assert lz4_block.encode(b"") == _end(6)
    assert lz4_block.decode(_end(6), 0) == b""


def test_missing_end_block_is_accepted() -> None:
    # N5 Java reads exactly the elements it needs and never looks at the end block.
    assert lz4_block.decode(_block(0x16, b"abc", b"abc"), 3) == b"abc"


def _bad_checksum() -> bytes:
    good = _block(0x16, b"abc", b"abc")
    return good[:17] + struct.pack("<i", _java_checksum(b"abd")) + good[21:] + _end(6)


@pytest.mark.parametrize(
    ("stream", "rule"),
    [
        (_bad_checksum(), "checksum"),
        (b"LZ4Blocc" + _block(0x16, b"abc", b"abc")[8:], "undecodable"),
        (_block(0x36, b"abc", b"abc"), "undecodable"),  # method 0x30
        (_block(0x16, b"abcd", b"abcd")[:-1], "undecodable"),  # data cut short
        (_block(0x16, b"abc", b"abc")[:15], "undecodable"),  # header cut short
        (_block(0x26, b"\x50hellojunk", b"hello"), "undecodable"),  # LZ4 block with junk
        (_block(0x26, b"\x60hello", b"hello"), "undecodable"),  # 6 literals promised
        (_block(0x16, b"abc", b"abc") + _end(6) + b"x", "trailing-data"),
        (_end(6)[:-4] + b"\x01\x00\x00\x00", "undecodable"),  # end block with a checksum
        (
            _block(0x16, b"ab", b"ab")[:9]
            + struct.pack("<ii", 2, 3)
            + _block(0x16, b"ab", b"ab")[17:],
            "undecodable",
        ),  # raw lengths differ
        (_block(0x10, b"a" * 1025, b"a" * 1025), "undecodable"),  # over level 0's 1024
    ],
)
def test_bad_lz4_streams_are_refused(stream: bytes, rule: str) -> None:
    with pytest.raises(CodecError) as info:
        lz4_block.decode(stream, 1 << 20)
    assert info.value.rule == rule


def test_lz4_decode_refuses_past_the_limit_before_inflating() -> None:
    stream = lz4_block.encode(b"\x00" * (1 << 20), block_size=1 << 16)
    tracemalloc.start()
    try:
        with pytest.raises(CodecError) as info:
            lz4_block.decode(stream, 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.rule == "decoded-size"
    assert peak < 256 * 1024  # never held even one decoded 64 KiB block


# --- z5's bare LZ4 block -------------------------------------------------------------------

# Sequences by the LZ4 block format: token (literals << 4 | match - 4), literals, offset LE.
HELLO = b"\x50hello"  # 5 literals, nothing else: "hello"
TAIL = b"\xc0hello world!"  # 12 literals: LZ4 wants a match to end 12 bytes before the end
ABAB = b"\x22ab\x02\x00" + TAIL  # "ab", then 6 bytes copied from 2 back, then the tail


def _bare_bomb(extension_bytes: int) -> bytes:
    """'a', then one match from 1 back of 15 + 4 + 255 * n bytes, then the tail."""
    return b"\x1fa\x01\x00" + b"\xff" * extension_bytes + b"\x00" + TAIL


def test_hand_built_bare_blocks_decode() -> None:
    assert lz4_block.decode_n5(HELLO, 5) == b"hello"
    assert lz4_block.decode_n5(ABAB, 20) == b"abababab" + b"hello world!"
    assert lz4_block.bare_size(ABAB, 100) == 20
    # A block shorter than the limit comes back at its own size (the caller checks it).
    assert lz4_block.decode_n5(ABAB, 100) == b"ababababhello world!"
    assert lz4_block.decode_n5(b"\x00", 0) == b""  # LZ4_compress_default of nothing


def test_bare_block_from_the_lz4_library() -> None:
    data = (np.arange(5000) % 37).astype(">u2").tobytes()
    bare = bytes(LZ4().encode(data))[4:]  # numcodecs' size prefix dropped: z5's layout
    assert not bare.startswith(b"LZ4Block")
    assert lz4_block.decode_n5(bare, len(data)) == data
    assert Lz4Compression().decode(bare, len(data)) == data


@pytest.mark.parametrize(
    ("block", "rule"),
    [
        (HELLO[:-1], "undecodable"),  # literals cut short
        (b"", "undecodable"),
        (b"\x22ab\x02", "undecodable"),  # offset cut short
        (b"\x22ab\x00\x00" + TAIL, "undecodable"),  # offset 0
        (b"\x22ab\x03\x00" + TAIL, "undecodable"),  # offset before the start
        (b"\x22ab\x02\x00" + HELLO, "undecodable"),  # adds up, but breaks LZ4's end rule
        (b"\xf0" + b"\xff" * 3, "undecodable"),  # literal length runs off the end
        (_bare_bomb(4000), "decoded-size"),
    ],
)
def test_bad_bare_blocks_are_refused(block: bytes, rule: str) -> None:
    with pytest.raises(CodecError) as info:
        lz4_block.decode_n5(block, 1000)
    assert info.value.rule == rule


def test_bare_bomb_is_refused_without_inflating() -> None:
    bomb = _bare_bomb(400_000)  # ~100 MiB from 400 KB
    assert lz4_block.bare_size(bomb, 1 << 30) > 100_000_000
    tracemalloc.start()
    try:
        with pytest.raises(CodecError) as info:
            Lz4Compression().decode(bomb, 4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.rule == "decoded-size"
    assert peak < 1 << 20


def test_the_magic_picks_the_lz4_java_framing() -> None:
    stream = _block(0x16, b"abc", b"abc") + _end(6)
    assert lz4_block.decode_n5(stream, 3) == b"abc"
    # A stream with the magic is judged as a stream, never retried as a bare block.
    with pytest.raises(CodecError, match="LZ4Block"):
        lz4_block.decode_n5(stream[:-3], 3)


# --- compression objects -----------------------------------------------------------------


def test_defaults_follow_n5_java() -> None:
    assert parse_compression({"type": "gzip"}).canonical() == {
        "type": "gzip",
        "level": -1,
        "useZlib": False,
    }
    assert parse_compression({"type": "bzip2"}).canonical() == {"type": "bzip2", "blockSize": 9}
    assert parse_compression({"type": "xz"}).canonical() == {"type": "xz", "preset": 6}
    assert parse_compression({"type": "lz4"}).canonical() == {"type": "lz4", "blockSize": 65536}
    assert parse_compression({"type": "zstd"}).canonical() == {"type": "zstd", "level": 3}
    assert parse_compression(
        {"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}
    ).canonical() == {"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}
    assert parse_compression({"type": "raw"}).canonical() == {"type": "raw"}


BLOSC_REQUIRED = {"cname": "zstd", "clevel": 5, "shuffle": 2}


@pytest.mark.parametrize("member", sorted(BLOSC_REQUIRED))
def test_blosc_without_a_member_tensorstore_needs_is_refused(member: str) -> None:
    config = {"type": "blosc", **{k: v for k, v in BLOSC_REQUIRED.items() if k != member}}
    with pytest.raises(CodecError, match=f"lacks '{member}'") as info:
        parse_compression(config)
    assert info.value.rule == "compression"


def test_blosc_without_any_member_names_all_three() -> None:
    with pytest.raises(CodecError, match="lacks 'cname', 'clevel', 'shuffle'"):
        parse_compression({"type": "blosc"})


def test_tensorstore_agrees_on_what_blosc_requires(tmp_path: Path) -> None:
    """The rule for blosc is TensorStore's: check it against TensorStore itself."""
    import tensorstore as ts

    def opens(config: dict[str, object]) -> bool:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        attrs = {"dimensions": [4], "blockSize": [4], "dataType": "uint8", "compression": config}
        (folder / "attributes.json").write_text(json.dumps(attrs))
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(folder)}}
        try:
            ts.open(spec, open=True).result()
        except ValueError:
            return False
        return True

    for member in BLOSC_REQUIRED:
        config = {"type": "blosc", **{k: v for k, v in BLOSC_REQUIRED.items() if k != member}}
        assert not opens(config)
    assert opens({"type": "blosc", **BLOSC_REQUIRED})  # blocksize may be absent
    parse_compression({"type": "blosc", **BLOSC_REQUIRED})
    for optional in ({"type": "gzip"}, {"type": "bzip2"}, {"type": "xz"}, {"type": "zstd"}):
        assert opens(optional)
        parse_compression(optional)


@pytest.mark.parametrize(
    "block_size", [-(1 << 31), -3, 0, 1, 6, 63, 1 << 25, (1 << 25) + 1, (1 << 31) - 1]
)
def test_lz4_block_size_is_only_a_writer_hint(block_size: int) -> None:
    codec = parse_compression({"type": "lz4", "blockSize": block_size})
    assert isinstance(codec, Lz4Compression)
    assert codec.canonical() == {"type": "lz4", "blockSize": block_size}
    data = bytes(range(256)) * 300
    stream = codec.encode(data)
    # What we write is what lz4-java's LZ4BlockOutputStream accepts: blocks of 64 B .. 32 MiB.
    level = stream[8] & 0x0F
    expected = block_size if 64 <= block_size <= 1 << 25 else 1 << 16
    assert level == lz4_block.compression_level(expected)
    assert codec.decode(stream, len(data)) == data


def test_version0_compression_type_string() -> None:
    assert compression_from_type("gzip") == GzipCompression()
    assert compression_from_type("lz4") == Lz4Compression()
    with pytest.raises(CodecError) as info:
        compression_from_type("blosc")  # version 0 knew raw, gzip, bzip2, lz4, xz only
    assert info.value.rule == "unknown-compression"


def test_writer_extras_are_tolerated() -> None:
    blosc = parse_compression(
        {
            "type": "blosc",
            "cname": "zstd",
            "clevel": 3,
            "shuffle": 2,
            "blocksize": 0,
            "typesize": 2,
            "nthreads": 4,
        }
    )
    assert isinstance(blosc, BloscCompression)
    assert blosc.typesize == 2
    assert blosc == parse_compression(
        {"type": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2}, itemsize=8
    )
    zstd = parse_compression(
        {
            "type": "zstd",
            "level": 5,
            "nbWorkers": 0,
            "windowLog": 0,
            "useChecksums": False,
            "dict": None,
        }
    )
    assert zstd.canonical() == {"type": "zstd", "level": 5}


@pytest.mark.parametrize(
    ("config", "rule"),
    [
        ("gzip", "compression"),
        ({}, "compression"),
        ({"type": 5}, "compression"),
        ({"type": "gzip", "level": 10}, "compression"),
        ({"type": "gzip", "level": True}, "compression"),
        ({"type": "gzip", "level": "9"}, "compression"),
        ({"type": "gzip", "useZlib": 1}, "compression"),
        ({"type": "bzip2", "blockSize": 0}, "compression"),
        ({"type": "xz", "preset": 10}, "compression"),
        ({"type": "lz4", "blockSize": 1 << 31}, "compression"),
        ({"type": "lz4", "blockSize": -(1 << 31) - 1}, "compression"),
        ({"type": "lz4", "blockSize": True}, "compression"),
        ({"type": "lz4", "blockSize": 6.0}, "compression"),
        ({"type": "blosc", **BLOSC_REQUIRED, "cname": "lzma"}, "compression"),
        ({"type": "blosc", **BLOSC_REQUIRED, "shuffle": 3}, "compression"),
        ({"type": "blosc", **BLOSC_REQUIRED, "typesize": -1}, "compression"),
        ({"type": "blosc", **BLOSC_REQUIRED, "clevel": "5"}, "compression"),
        ({"type": "zstd", "level": 23}, "compression"),
        ({"type": "zstd", "dict": [1, 2, 3]}, "compression"),
        ({"type": "snappy"}, "unknown-compression"),
    ],
)
def test_bad_compression_objects_are_refused(config: object, rule: str) -> None:
    with pytest.raises(CodecError) as info:
        parse_compression(config)
    assert info.value.rule == rule


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(CodecError) as info:
        parse_compression({"type": "jpeg"})
    for name in ("raw", "gzip", "bzip2", "xz", "blosc", "zstd", "lz4"):
        assert name in str(info.value)


CONFIGS = [
    {"type": "raw"},
    {"type": "gzip", "level": 5},
    {"type": "gzip", "useZlib": True},
    {"type": "bzip2", "blockSize": 1},
    {"type": "xz", "preset": 1},
    {"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
    {"type": "zstd", "level": 1},
    {"type": "lz4", "blockSize": 256},
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["type"])
def test_encode_then_decode_round_trips(config: dict[str, object]) -> None:
    data = (np.arange(3000) % 50).astype(">u2").tobytes()
    codec = parse_compression(config, itemsize=2)
    encoded = codec.encode(data)
    assert codec.decode(encoded, len(data)) == data
    if config["type"] != "raw":
        assert len(encoded) < len(data)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["type"])
def test_decode_never_passes_the_limit(config: dict[str, object]) -> None:
    data = b"\x00" * 100_000
    codec = parse_compression(config, itemsize=1)
    with pytest.raises(CodecError) as info:
        codec.decode(codec.encode(data), 1000)
    assert info.value.rule in {"decoded-size", "trailing-data"}


def test_gzip_bomb_is_refused_without_inflating() -> None:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\x00" * (1 << 20)
    bomb = b"".join(comp.compress(zeros) for _ in range(100)) + comp.flush()  # 100 MiB
    assert len(bomb) < 200_000
    codec = parse_compression({"type": "gzip"})
    tracemalloc.start()
    try:
        with pytest.raises(CodecError) as info:
            codec.decode(bomb, 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.rule == "decoded-size"
    assert peak < 1 << 20  # the 100 MiB were never held


def test_zstd_bytes_after_the_frame_are_refused() -> None:
    codec = parse_compression({"type": "zstd"})
    frame = codec.encode(b"abc" * 100)
    with pytest.raises(CodecError) as info:
        codec.decode(frame + b"junk", 300)
    assert info.value.rule == "trailing-data"


def test_summaries_are_short_and_name_the_parameters() -> None:
    assert parse_compression({"type": "gzip"}).summary() == "gzip(level=-1)"
    assert parse_compression({"type": "gzip", "useZlib": True}).summary() == (
        "gzip(level=-1, useZlib=true)"
    )
    assert parse_compression({"type": "raw"}).summary() == "raw"
    assert parse_compression({"type": "lz4"}).summary() == "lz4(blockSize=65536)"


def test_every_known_type_is_exercised() -> None:
    assert {c["type"] for c in CONFIGS} == set(COMPRESSIONS)
