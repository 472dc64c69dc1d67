"""Zarr v3 codec chain: configuration rules, real zarr-python chunks, bounded decoding."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    ZstdCodec,
)

from n5fs.codecs.limits import CodecError
from n5fs.codecs.v3 import ArraySpec, CodecChain, parse_data_type

LE = {"name": "bytes", "configuration": {"endian": "little"}}
BE = {"name": "bytes", "configuration": {"endian": "big"}}


def spec(shape: tuple[int, ...] = (4, 3), dtype: Any = "int16", fill: Any = 0) -> ArraySpec:
    data_type = parse_data_type(dtype)
    if data_type.vlen is None:
        fill = np.array(fill).astype(data_type.dtype)[()]
    return ArraySpec(shape, data_type, fill)


def chain(codecs: Any, shape: tuple[int, ...] = (4, 3), dtype: Any = "int16") -> CodecChain:
    fill = "" if dtype == "string" else 0
    return CodecChain.parse(codecs, spec(shape, dtype, fill))


def refused(rule: str, call: Any, *args: Any) -> CodecError:
    with pytest.raises(CodecError) as info:
        call(*args)
    assert info.value.rule == rule, info.value
    return info.value


# --------------------------------------------------------------------------- data types


@pytest.mark.parametrize(
    ("value", "numpy", "vlen"),
    [
        ("bool", "?", None),
        ("int8", "i1", None),
        ("uint64", "u8", None),
        ("float16", "f2", None),
        ("complex128", "c16", None),
        ({"name": "float32"}, "f4", None),
        ("r16", "V2", None),
        ("string", "O", "utf8"),
        ("variable_length_bytes", "O", "bytes"),
        ("bytes", "O", "bytes"),
        ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}}, "<U3", None),
        ({"name": "null_terminated_bytes", "configuration": {"length_bytes": 3}}, "S3", None),
        ({"name": "raw_bytes", "configuration": {"length_bytes": 4}}, "V4", None),
        (
            {"name": "numpy.datetime64", "configuration": {"unit": "ms", "scale_factor": 1}},
            "M8[ms]",
            None,
        ),
        (
            {"name": "numpy.timedelta64", "configuration": {"unit": "s", "scale_factor": 10}},
            "m8[10s]",
            None,
        ),
    ],
)
def test_data_types(value: Any, numpy: str, vlen: str | None) -> None:
    data_type = parse_data_type(value)
    assert data_type.dtype == np.dtype(numpy)
    assert data_type.vlen == vlen


@pytest.mark.parametrize(
    "value",
    [
        "float128",
        "r12",
        "r0",
        "structured",
        5,
        None,
        {"configuration": {}},
        {"name": "int8", "configuration": {"x": 1}},
        {"name": "float32", "must_understand": False},
        {"name": "fixed_length_utf32", "configuration": {"length_bytes": 5}},
        {"name": "raw_bytes", "configuration": {"length_bytes": 0}},
        {"name": "numpy.datetime64", "configuration": {"unit": "fortnight", "scale_factor": 1}},
    ],
)
def test_data_types_refused(value: Any) -> None:
    refused("data-type", parse_data_type, value)


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("codecs", "dtype", "words"),
    [
        ([{"name": "bytes"}], "int16", "requires 'endian'"),
        ([{"name": "bytes", "configuration": {"endian": "middle"}}], "int16", "endian"),
        ([{"name": "bytes", "configuration": {"endian": "little", "x": 1}}], "int16", "unknown"),
        ([{"name": "bytes", "configuration": {"endian": "little"}}], "string", "vlen-utf8"),
        ([{"name": "vlen-utf8"}], "int16", "variable-length"),
        ([{"name": "transpose", "configuration": {"order": [0, 0]}}, LE], "int16", "permutation"),
        ([{"name": "transpose", "configuration": {"order": [0]}}, LE], "int16", "permutation"),
        ([{"name": "transpose", "configuration": {"order": "X"}}, LE], "int16", "permutation"),
        ([LE, {"name": "gzip", "configuration": {"level": 10}}], "int16", "0..9"),
        ([LE, {"name": "gzip", "configuration": {"level": True}}], "int16", "0..9"),
        ([LE, {"name": "gzip"}], "int16", "lacks required ['level']"),
        ([LE, {"name": "zstd", "configuration": {"level": 23}}], "int16", "-131072..22"),
        ([LE, {"name": "zstd", "configuration": {"level": 1, "checksum": "yes"}}], "int16", "true"),
        ([LE, {"name": "zstd", "configuration": {"level": 1, "window": 3}}], "int16", "unknown"),
        (
            [
                LE,
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "lzma",
                        "clevel": 1,
                        "shuffle": "shuffle",
                        "typesize": 2,
                        "blocksize": 0,
                    },
                },
            ],
            "int16",
            "cname",
        ),
        (
            [
                LE,
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "lz4",
                        "clevel": 10,
                        "shuffle": "noshuffle",
                        "blocksize": 0,
                    },
                },
            ],
            "int16",
            "clevel",
        ),
        (
            [
                LE,
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "lz4",
                        "clevel": 1,
                        "shuffle": "auto",
                        "blocksize": 0,
                    },
                },
            ],
            "int16",
            "shuffle",
        ),
        (
            [
                LE,
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "lz4",
                        "clevel": 1,
                        "shuffle": "shuffle",
                        "blocksize": 0,
                    },
                },
            ],
            "int16",
            "typesize is required",
        ),
        (
            [
                LE,
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "lz4",
                        "clevel": 1,
                        "shuffle": "shuffle",
                        "typesize": 0,
                        "blocksize": 0,
                    },
                },
            ],
            "int16",
            "typesize",
        ),
        (
            [
                LE,
                {
                    "name": "blosc",
                    "configuration": {"cname": "lz4", "clevel": 1, "shuffle": "noshuffle"},
                },
            ],
            "int16",
            "blocksize",
        ),
        ([LE, {"name": "crc32c", "configuration": {"x": 1}}], "int16", "unknown"),
        ([LE, {"name": "gzip", "configuration": {"level": 1}, "extra": 1}], "int16", "beyond"),
        ([LE, {"name": "gzip", "configuration": [1]}], "int16", "must be an object"),
        (
            [LE, {"name": "gzip", "configuration": {"level": 1}, "must_understand": "no"}],
            "int16",
            "must_understand",
        ),
        ([LE, 7], "int16", "name"),
    ],
)
def test_codec_config_refused(codecs: list[Any], dtype: str, words: str) -> None:
    error = refused("codec-config", chain, codecs, (4, 3), dtype)
    assert words in error.message


@pytest.mark.parametrize(
    ("codecs", "words"),
    [
        ([], "non-empty"),
        ("bytes", "non-empty"),
        ([{"name": "gzip", "configuration": {"level": 1}}, LE], "before any array -> bytes"),
        (
            [LE, {"name": "transpose", "configuration": {"order": [1, 0]}}],
            "after the array -> bytes",
        ),
        ([LE, BE], "second array -> bytes codec"),
        ([{"name": "transpose", "configuration": {"order": [1, 0]}}], "no array -> bytes codec"),
    ],
)
def test_codec_order_refused(codecs: Any, words: str) -> None:
    error = refused("codec-order", chain, codecs)
    assert words in error.message


def test_unknown_codec_is_named() -> None:
    error = refused("unknown-codec", chain, [LE, {"name": "numcodecs.lz4"}])
    assert "'numcodecs.lz4'" in error.message
    assert "codecs[1]" in error.message


def test_unknown_codec_marked_must_understand_false_is_ignored() -> None:
    extra = {"name": "example.checksum", "must_understand": False}
    parsed = chain([LE, extra])
    values = np.arange(12, dtype="int16").reshape(4, 3)
    assert parsed.encode(values) == values.astype("<i2").tobytes()
    assert parsed.to_json() == [LE, extra]


def test_short_hand_names_and_normalized_json() -> None:
    parsed = chain(["bytes", "crc32c"], dtype="uint8")
    assert parsed.to_json() == [{"name": "bytes"}, {"name": "crc32c"}]
    assert (
        chain([LE, {"name": "crc32c", "configuration": {}}], dtype="uint8").to_json()
        == parsed.to_json()
    )


def test_legacy_transpose_order_letters() -> None:
    f_order = chain([{"name": "transpose", "configuration": {"order": "F"}}, LE], (2, 3, 4))
    assert f_order.array_array[0].to_json()["configuration"]["order"] == [2, 1, 0]


# --------------------------------------------------------------------------- encoding


def test_bytes_big_endian_layout() -> None:
    values = np.arange(12, dtype="int16").reshape(4, 3) - 6
    assert chain([BE]).encode(values) == values.astype(">i2").tobytes()


def test_transpose_layout() -> None:
    values = np.arange(24, dtype="float64").reshape(2, 3, 4)
    codecs = [{"name": "transpose", "configuration": {"order": [2, 0, 1]}}, LE]
    parsed = chain(codecs, (2, 3, 4), "float64")
    data = parsed.encode(values)
    assert data == np.transpose(values, (2, 0, 1)).astype("<f8").tobytes()
    assert np.array_equal(parsed.decode(data), values)


def test_crc32c_check_value() -> None:
    # The CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720, appendix B.4).
    parsed = chain(["bytes", "crc32c"], (9,), "uint8")
    data = parsed.encode(np.frombuffer(b"123456789", dtype="uint8"))
    assert data[-4:] == (0xE3069283).to_bytes(4, "little")


@pytest.mark.parametrize(
    "tail",
    [
        [{"name": "gzip", "configuration": {"level": 6}}],
        [{"name": "zstd", "configuration": {"level": 3, "checksum": True}}],
        [{"name": "zstd", "configuration": {"level": -5}}],
        [
            {
                "name": "blosc",
                "configuration": {
                    "cname": "lz4",
                    "clevel": 5,
                    "shuffle": "bitshuffle",
                    "typesize": 8,
                    "blocksize": 0,
                },
            }
        ],
        [
            {
                "name": "blosc",
                "configuration": {
                    "cname": "zstd",
                    "clevel": 1,
                    "shuffle": "noshuffle",
                    "blocksize": 0,
                },
            }
        ],
        [{"name": "gzip", "configuration": {"level": 1}}, {"name": "crc32c"}],
    ],
)
@pytest.mark.parametrize("dtype", ["float64", "complex128", "bool", "int64"])
def test_round_trip(tail: list[Any], dtype: str) -> None:
    rng = np.random.default_rng(7)
    values = (rng.normal(size=(5, 6)) * 100).astype(dtype)
    parsed = chain(
        [{"name": "transpose", "configuration": {"order": [1, 0]}}, BE, *tail], (5, 6), dtype
    )
    decoded = parsed.decode(parsed.encode(values))
    assert decoded.dtype == np.dtype(dtype)
    assert np.array_equal(decoded, values)


def test_round_trip_strings() -> None:
    values = np.array([["", "é"], ["long" * 50, "x"]], dtype=object)
    parsed = chain(
        [{"name": "vlen-utf8"}, {"name": "zstd", "configuration": {"level": 0}}], (2, 2), "string"
    )
    assert parsed.decode(parsed.encode(values)).tolist() == values.tolist()
    raw = chain([{"name": "vlen-bytes"}], (2,), "bytes")
    assert raw.decode(raw.encode(np.array([b"\x00", b""], dtype=object))).tolist() == [b"\x00", b""]


def test_fixed_strings_and_datetimes_round_trip() -> None:
    utf32 = {"name": "fixed_length_utf32", "configuration": {"length_bytes": 8}}
    values = np.array(["ab", "ü", ""], dtype="<U2")
    parsed = chain([BE], (3,), utf32)
    assert parsed.encode(values) == values.astype(">U2").tobytes()
    assert parsed.decode(parsed.encode(values)).tolist() == ["ab", "ü", ""]
    when = {"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}}
    stamps = np.array(["2024-01-02T03:04:05", "NaT"], dtype="M8[s]")
    decoded = chain([LE], (2,), when).decode(stamps.astype("<M8[s]").tobytes())
    assert str(decoded[0]) == "2024-01-02T03:04:05"
    assert np.isnat(decoded[1])


# --------------------------------------------------------------------------- real writer


def _zarr_write(path: Path, values: np.ndarray[Any, Any], **kwargs: Any) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = zarr.create_array(
            store=str(path),
            shape=values.shape,
            dtype=values.dtype,
            zarr_format=3,
            fill_value=0,
            **kwargs,
        )
        array[...] = values
    return dict(json.loads((path / "zarr.json").read_text()))


ZARR_CODECS = [
    {"serializer": BytesCodec(endian="big"), "compressors": [GzipCodec(level=4)]},
    {"filters": [TransposeCodec(order=(1, 0))], "compressors": [ZstdCodec(level=2, checksum=True)]},
    {"compressors": [BloscCodec(cname="lz4", shuffle="bitshuffle")]},
    {"compressors": [BloscCodec(cname="zstd", shuffle="noshuffle")]},
    {"compressors": [GzipCodec(level=1), Crc32cCodec()]},
    {"compressors": None},
]


@pytest.mark.parametrize("kwargs", ZARR_CODECS)
@pytest.mark.parametrize("dtype", ["int32", "float32", "uint8"])
def test_zarr_python_chunks_decode_and_ours_read_back(
    tmp_path: Path, kwargs: dict[str, Any], dtype: str
) -> None:
    values = np.arange(48, dtype=dtype).reshape(6, 8)
    meta = _zarr_write(tmp_path, values, chunks=(3, 4), **kwargs)
    parsed = CodecChain.parse(meta["codecs"], spec((3, 4), dtype))
    ours = np.arange(12, dtype=dtype).reshape(3, 4) + 100
    for i, j in np.ndindex(2, 2):
        key = tmp_path / "c" / str(i) / str(j)
        expected = values[3 * i : 3 * i + 3, 4 * j : 4 * j + 4]
        assert np.array_equal(parsed.decode(key.read_bytes()), expected)
        key.write_bytes(parsed.encode(ours + i))
    reread = zarr.open_array(str(tmp_path), mode="r")[...]
    assert np.array_equal(reread[3:6, 4:8], ours + 1)


# --------------------------------------------------------------------------- bad bytes


GZ = [LE, {"name": "gzip", "configuration": {"level": 5}}]
ZS = [LE, {"name": "zstd", "configuration": {"level": 3}}]
BL = [
    LE,
    {
        "name": "blosc",
        "configuration": {
            "cname": "lz4",
            "clevel": 5,
            "shuffle": "shuffle",
            "typesize": 2,
            "blocksize": 0,
        },
    },
]
BOMB = b"\x00" * 4_000_000


@pytest.mark.parametrize(
    ("codecs", "data", "rule"),
    [
        (GZ, gzip.compress(BOMB), "decoded-size"),
        (ZS, zstandard.ZstdCompressor().compress(BOMB), "decoded-size"),
        (ZS, zstandard.ZstdCompressor(write_content_size=False).compress(BOMB), "decoded-size"),
        (BL, bytes(numcodecs.Blosc().encode(BOMB)), "decoded-size"),
        ([*GZ, {"name": "crc32c"}], gzip.compress(bytes(24)) + bytes(4), "checksum"),
        (GZ, b"definitely not gzip", "undecodable"),
        (GZ, gzip.compress(bytes(24))[:-6], "undecodable"),
        (GZ, gzip.compress(bytes(22)), "decoded-size"),
        (ZS, b"\x28\xb5\x2f\xfd" + b"\xff" * 12, "undecodable"),
        (ZS, b"plain bytes", "undecodable"),
        (BL, b"\x02\x01", "undecodable"),
        ([LE], bytes(23), "decoded-size"),
        ([LE], bytes(25), "decoded-size"),
        ([LE, {"name": "crc32c"}], bytes(24) + b"\x00\x00\x00\x01", "checksum"),
        ([LE, {"name": "crc32c"}], b"\x01", "checksum"),
    ],
)
def test_bad_chunk_bytes_refused(codecs: list[Any], data: bytes, rule: str) -> None:
    refused(rule, chain(codecs).decode, data)


def test_crc32c_guards_a_bomb_behind_it() -> None:
    codecs = [*GZ, {"name": "crc32c"}]
    payload = gzip.compress(BOMB)
    framed = chain(codecs).bytes_bytes[1].encode(payload)
    refused("decoded-size", chain(codecs).decode, framed)


def test_bool_bytes_must_be_zero_or_one() -> None:
    parsed = chain(["bytes"], (3,), "bool")
    assert parsed.decode(b"\x00\x01\x00").tolist() == [False, True, False]
    refused("invalid-value", parsed.decode, b"\x00\x02\x00")


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (b"\x03\x00\x00\x00" + b"\x01\x00\x00\x00a" * 2, "decoded-size"),
        (b"\x02\x00\x00\x00" + b"\x01\x00\x00\x00a" * 2 + b"!", "trailing-data"),
        (b"\x02\x00\x00\x00" + b"\x01\x00\x00\x00\xff" * 2, "undecodable"),
        (b"\x02\x00\x00\x00" + b"\x09\x00\x00\x00abc", "undecodable"),
        (b"\x02", "decoded-size"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00", "undecodable"),
    ],
)
def test_bad_vlen_refused(data: bytes, rule: str) -> None:
    refused(rule, chain([{"name": "vlen-utf8"}], (2,), "string").decode, data)


# --------------------------------------------------------------------------- fuzz

FUZZ_CHAINS = [
    GZ,
    ZS,
    BL,
    [LE, {"name": "crc32c"}],
    [{"name": "vlen-utf8"}],
    [{"name": "transpose", "configuration": {"order": [1, 0]}}, BE],
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
CODEC_JSON = st.fixed_dictionaries(
    {
        "name": st.sampled_from(
            [
                "bytes",
                "transpose",
                "gzip",
                "zstd",
                "blosc",
                "crc32c",
                "vlen-utf8",
                "sharding_indexed",
                "x",
            ]
        )
    },
    optional={
        "configuration": st.dictionaries(
            st.sampled_from(
                [
                    "endian",
                    "order",
                    "level",
                    "checksum",
                    "cname",
                    "clevel",
                    "shuffle",
                    "typesize",
                    "blocksize",
                    "chunk_shape",
                    "codecs",
                    "index_codecs",
                    "index_location",
                ]
            ),
            JSON,
            max_size=4,
        ),
        "must_understand": JSON,
    },
)


@settings(max_examples=150, deadline=None)
@given(index=st.integers(0, len(FUZZ_CHAINS) - 1), data=st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_codec_error(index: int, data: bytes) -> None:
    codecs = FUZZ_CHAINS[index]
    parsed = chain(
        codecs,
        (3,) if codecs[0] == {"name": "vlen-utf8"} else (4, 3),
        "string" if codecs[0] == {"name": "vlen-utf8"} else "int16",
    )
    try:
        decoded = parsed.decode(data)
    except CodecError:
        return
    assert decoded.shape == parsed.spec.shape


ARRAY_ARRAY = st.builds(
    lambda o: {"name": "transpose", "configuration": {"order": o}},
    st.sampled_from([[1, 0], [0, 1], "F", [1, 0], [0, 1], [0], [1, 1]]),
)
ARRAY_BYTES = st.sampled_from([LE, BE, LE, BE, LE, BE, {"name": "bytes"}, {"name": "vlen-utf8"}])
BYTES_BYTES = st.sampled_from(
    [
        {"name": "gzip", "configuration": {"level": 9}},
        {"name": "crc32c"},
        "crc32c",
        {"name": "zstd", "configuration": {"level": 0, "checksum": True}},
        {
            "name": "blosc",
            "configuration": {
                "cname": "blosclz",
                "clevel": 0,
                "shuffle": "noshuffle",
                "blocksize": 0,
            },
        },
    ]
)
# Mostly well-formed chains (duplicated strategies weigh one_of) with some noise mixed in.
CHAINS = st.builds(
    lambda a, b, c: [*a, b, *c],
    st.lists(ARRAY_ARRAY, max_size=1),
    st.one_of(ARRAY_BYTES, ARRAY_BYTES, ARRAY_BYTES, CODEC_JSON),
    st.lists(st.one_of(BYTES_BYTES, BYTES_BYTES, BYTES_BYTES, CODEC_JSON), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    codecs=st.one_of(CHAINS, CHAINS, CHAINS, st.lists(CODEC_JSON | JSON, max_size=4)),
    dtype=st.sampled_from(["int16", "int16", "string"]),
)
def test_arbitrary_codec_json_only_raises_codec_error(codecs: Any, dtype: str) -> None:
    try:
        parsed = chain(codecs, (4, 3), dtype)
    except CodecError:
        return
    values = parsed.spec.filled()
    assert np.array_equal(parsed.decode(parsed.encode(values)), values)
