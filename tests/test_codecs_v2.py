"""Zarr v2 codec pipeline: numcodecs writes the bytes, the pipeline decodes them bounded."""

from __future__ import annotations

import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
from numcodecs.compat import ensure_contiguous_ndarray

from n5fs.codecs.limits import CodecError
from n5fs.codecs.v2_pipeline import (
    V2Pipeline,
    build_codec,
    check_pickle,
    encoded_nbytes,
)

U2 = np.dtype("<u2")
OBJ = np.dtype(object)
RAMP = (np.arange(4096, dtype=U2) * 7 % 1000).astype(U2)

COMPRESSORS: list[dict[str, Any]] = [
    {"id": "zlib", "level": 5},
    {"id": "gzip", "level": 1},
    {"id": "bz2", "level": 9},
    {"id": "lzma", "format": 1, "check": -1, "preset": None, "filters": None},
    {"id": "lzma", "format": 2, "check": -1, "preset": None, "filters": None},
    {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2, "blocksize": 0},
    {"id": "zstd", "level": 3},
    {"id": "zstd", "level": 1, "checksum": True},
    {"id": "lz4", "acceleration": 1},
]


def _ids(configs: list[dict[str, Any]]) -> list[str]:
    return ["-".join(str(v) for v in c.values())[:30] for c in configs]


def _bomb(codec_id: str) -> bytes:
    """A few KiB that inflate to 32 MiB, written by the codec itself."""
    zeros = np.zeros(32 << 20, dtype=np.uint8)
    return bytes(numcodecs.get_codec({"id": codec_id}).encode(zeros))


# --- codec construction ---------------------------------------------------------------------


def test_unknown_codec_id_is_named() -> None:
    with pytest.raises(CodecError, match="'no-such-codec'") as info:
        build_codec({"id": "no-such-codec"}, what="compressor")
    assert info.value.rule == "unknown-codec"


@pytest.mark.parametrize("config", [{"id": "zlib", "bogus": 1}, {"id": "delta", "dtype": "zz"}])
def test_bad_codec_parameters_refused(config: dict[str, Any]) -> None:
    with pytest.raises(CodecError) as info:
        build_codec(config, what="filters[0]")
    assert info.value.rule == "codec-config"
    assert "filters[0]" in str(info.value)


@pytest.mark.parametrize("config", [None, "zlib", {"level": 1}, {"id": 3}, ["zlib"]])
def test_codec_config_must_be_an_object_with_an_id(config: Any) -> None:
    with pytest.raises(CodecError) as info:
        build_codec(config, what="compressor")
    assert info.value.rule == "codec-config"


@pytest.mark.parametrize("protocol", ["5", 6, -2, None])
def test_pickle_protocol_must_be_a_real_one(protocol: Any) -> None:
    with pytest.raises(CodecError) as info:
        V2Pipeline(None, [{"id": "pickle", "protocol": protocol}], OBJ)
    assert info.value.rule == "codec-config"


def test_filters_must_be_a_list() -> None:
    with pytest.raises(CodecError) as info:
        V2Pipeline(None, {"id": "delta", "dtype": "<u2"}, U2)
    assert info.value.rule == "codec-config"


def test_configs_are_normalised_by_numcodecs() -> None:
    pipe = V2Pipeline({"id": "zstd"}, [{"id": "delta", "dtype": "<u2"}], U2)
    compressor, filters = pipe.configs()
    assert compressor == numcodecs.Zstd().get_config()
    assert filters == [numcodecs.Delta(dtype="<u2").get_config()]
    assert pipe.summary() == "delta | zstd"


# --- fixed-size chunks -----------------------------------------------------------------------


@pytest.mark.parametrize("config", COMPRESSORS, ids=_ids(COMPRESSORS))
def test_compressed_chunk_decodes_exactly(config: dict[str, Any]) -> None:
    data = bytes(numcodecs.get_codec(dict(config)).encode(RAMP))
    out = V2Pipeline(config, None, U2).decode(data, RAMP.nbytes)
    assert np.array_equal(np.frombuffer(out, dtype=U2), RAMP)


@pytest.mark.parametrize("config", COMPRESSORS, ids=_ids(COMPRESSORS))
def test_chunk_of_the_wrong_size_refused(config: dict[str, Any]) -> None:
    data = bytes(numcodecs.get_codec(dict(config)).encode(RAMP[:-1]))
    with pytest.raises(CodecError) as info:
        V2Pipeline(config, None, U2).decode(data, RAMP.nbytes)
    assert info.value.rule == "decoded-size"


@pytest.mark.parametrize("config", COMPRESSORS, ids=_ids(COMPRESSORS))
def test_truncated_chunk_refused(config: dict[str, Any]) -> None:
    data = bytes(numcodecs.get_codec(dict(config)).encode(RAMP))
    with pytest.raises(CodecError) as info:
        V2Pipeline(config, None, U2).decode(data[: len(data) // 2], RAMP.nbytes)
    assert info.value.rule in {"undecodable", "decoded-size"}


@pytest.mark.parametrize("codec_id", ["zlib", "gzip", "bz2", "lzma", "blosc", "zstd", "lz4"])
def test_decompression_bomb_refused_without_inflating(codec_id: str) -> None:
    bomb = _bomb(codec_id)
    assert len(bomb) < 2 << 20  # the point: small input, huge output
    with pytest.raises(CodecError) as info:
        V2Pipeline({"id": codec_id}, None, U2).decode(bomb, 8192)
    assert info.value.rule == "decoded-size"


def test_bomb_hidden_in_the_filters_is_refused() -> None:
    """numcodecs lets any codec be a filter: a zlib filter is bounded like a compressor."""
    bomb = zlib.compress(bytes(32 << 20))
    pipe = V2Pipeline(None, [{"id": "zlib"}], U2)
    with pytest.raises(CodecError) as info:
        pipe.decode(bomb, 8192)
    assert info.value.rule == "decoded-size"


def test_uncompressed_chunk_must_be_exact() -> None:
    pipe = V2Pipeline(None, None, U2)
    assert bytes(pipe.decode(RAMP.tobytes(), RAMP.nbytes)) == RAMP.tobytes()
    with pytest.raises(CodecError) as info:
        pipe.decode(RAMP.tobytes() + b"\0", RAMP.nbytes)
    assert info.value.rule == "decoded-size"


def test_corrupt_stream_refused() -> None:
    data = bytearray(numcodecs.Zlib().encode(RAMP))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(CodecError) as info:
        V2Pipeline({"id": "zlib"}, None, U2).decode(bytes(data), RAMP.nbytes)
    assert info.value.rule in {"undecodable", "decoded-size"}


FILTERS: list[tuple[dict[str, Any], np.ndarray[Any, Any]]] = [
    ({"id": "delta", "dtype": "<u2"}, RAMP),
    ({"id": "delta", "dtype": "<u2", "astype": "<u4"}, RAMP),
    ({"id": "shuffle", "elementsize": 2}, RAMP),
    ({"id": "astype", "encode_dtype": "<f8", "decode_dtype": "<u2"}, RAMP),
    (
        {"id": "fixedscaleoffset", "offset": 0, "scale": 1, "dtype": "<f8", "astype": "<u2"},
        RAMP.astype("<f8"),
    ),
    ({"id": "quantize", "digits": 2, "dtype": "<f8"}, RAMP.astype("<f8") / 3),
    ({"id": "bitround", "keepbits": 5}, RAMP.astype("<f4")),
    ({"id": "packbits"}, RAMP % 3 == 0),
    ({"id": "crc32"}, RAMP),
    ({"id": "adler32"}, RAMP),
    ({"id": "fletcher32"}, RAMP),
    ({"id": "jenkins_lookup3"}, RAMP),
    ({"id": "crc32c"}, RAMP),
    ({"id": "base64"}, RAMP),
]


@pytest.mark.parametrize(("config", "values"), FILTERS, ids=[f[0]["id"] for f in FILTERS])
def test_size_rule_matches_what_numcodecs_writes(
    config: dict[str, Any], values: np.ndarray[Any, Any]
) -> None:
    codec = numcodecs.get_codec(dict(config))
    written = np.asarray(codec.encode(values))
    assert encoded_nbytes(codec, values.nbytes) == written.nbytes


@pytest.mark.parametrize(("config", "values"), FILTERS, ids=[f[0]["id"] for f in FILTERS])
def test_filtered_and_compressed_chunk_round_trips(
    config: dict[str, Any], values: np.ndarray[Any, Any]
) -> None:
    pipe = V2Pipeline({"id": "zstd", "level": 1}, [config], values.dtype)
    data = pipe.encode(values)
    out = np.frombuffer(pipe.decode(data, values.nbytes), dtype=values.dtype)
    codec = numcodecs.get_codec(dict(config))
    expected = ensure_contiguous_ndarray(codec.decode(codec.encode(values))).tobytes()
    assert np.array_equal(out, np.frombuffer(expected, dtype=values.dtype))


@pytest.mark.parametrize("codec_id", ["crc32", "adler32", "fletcher32", "crc32c"])
def test_checksum_mismatch_refused(codec_id: str) -> None:
    pipe = V2Pipeline(None, [{"id": codec_id}], U2)
    data = bytearray(pipe.encode(RAMP))
    data[100] ^= 0x01
    with pytest.raises(CodecError) as info:
        pipe.decode(bytes(data), RAMP.nbytes)
    assert info.value.rule == "undecodable"


def test_lz4_size_header_checked_before_decoding() -> None:
    forged = (1 << 30).to_bytes(4, "little") + b"\x00" * 16
    with pytest.raises(CodecError, match="decompression bomb") as info:
        V2Pipeline({"id": "lz4"}, None, U2).decode(forged, 8192)
    assert info.value.rule == "decoded-size"


# --- object chunks ---------------------------------------------------------------------------

OBJECTS = np.array(
    [
        {"source": ".", "path": "/acquisition/ts"},
        "text",
        3,
        None,
        1.5,
        b"raw",
        [1, 2],
        np.float32(2.5),
    ],
    dtype=object,
)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_chunks_written_by_numcodecs_pass_framing(protocol: int) -> None:
    pipe = V2Pipeline(None, [{"id": "pickle", "protocol": protocol}], OBJ)
    pipe.check_objects(pipe.encode(OBJECTS), OBJECTS.size)


@pytest.mark.parametrize("protocol", [0, 1])
def test_old_pickle_protocols_are_walked_too(protocol: int) -> None:
    check_pickle(pickle.dumps(OBJECTS, protocol=protocol), protocol=protocol)


class _Payload:
    """Unpickling this would create ``target`` (a stand-in for running any command)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.target),))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_malicious_pickle_refused_and_never_run(tmp_path: Path, protocol: int) -> None:
    target = tmp_path / "pwned"
    values = np.array([_Payload(target)], dtype=object)
    pipe = V2Pipeline(None, [{"id": "pickle", "protocol": protocol}], OBJ)
    data = pipe.encode(values)
    with pytest.raises(CodecError, match="mkdir") as info:
        pipe.check_objects(data, 1)
    assert info.value.rule == "pickle-global"
    with pytest.raises(CodecError):
        pipe.decode_objects(data, 1)
    assert not target.exists()


@pytest.mark.parametrize(
    ("payload", "rule"),
    [
        (b"", "pickle"),
        (b"\x80\x05K\x01", "pickle"),  # no STOP
        (b"\x80\x05K\x01.junk", "pickle"),  # bytes after STOP
        (b"\x80\x09K\x01.", "pickle"),  # protocol 9 does not exist
        (b"K\x01.", "pickle"),  # configured protocol 5 but no header
        (b"\x80\x05\xff.", "pickle"),  # unknown opcode
        # STACK_GLOBAL whose module comes from an int: cannot be named, refused
        (b"\x80\x04K\x01\x8c\x06system\x93.", "pickle-global"),
        # the names come from the memo: resolved, then refused
        (b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94h\x00h\x01\x93.", "pickle-global"),
        (b"\x80\x02cbuiltins\neval\n.", "pickle-global"),
        (b"\x80\x02\x82\x01.", "pickle-global"),  # EXT1: the copyreg extension registry
    ],
)
def test_bad_pickle_framing(payload: bytes, rule: str) -> None:
    with pytest.raises(CodecError) as info:
        check_pickle(payload, protocol=5)
    assert info.value.rule == rule


def test_pickle_chunks_are_never_decoded_to_objects() -> None:
    pipe = V2Pipeline(None, [{"id": "pickle"}], OBJ)
    with pytest.raises(CodecError) as info:
        pipe.decode_objects(pipe.encode(OBJECTS), OBJECTS.size)
    assert info.value.rule == "unsafe-codec"


@pytest.mark.parametrize("codec", [numcodecs.VLenUTF8(), numcodecs.VLenBytes()])
def test_vlen_chunk_count_must_match(codec: Any) -> None:
    items = ["a", "bé", ""] if codec.codec_id == "vlen-utf8" else [b"a", b"\xff", b""]
    values = np.array(items, dtype=object)
    pipe = V2Pipeline({"id": "zlib"}, [codec.get_config()], OBJ)
    data = pipe.encode(values)
    assert list(pipe.decode_objects(data, 3)) == items
    with pytest.raises(CodecError) as info:
        pipe.check_objects(data, 4)
    assert info.value.rule == "decoded-size"


def test_vlen_utf8_rejects_invalid_utf8() -> None:
    data = (1).to_bytes(4, "little") + (2).to_bytes(4, "little") + b"\xff\xfe"
    with pytest.raises(CodecError) as info:
        V2Pipeline(None, [{"id": "vlen-utf8"}], OBJ).check_objects(data, 1)
    assert info.value.rule == "undecodable"


def test_json_object_chunk_ignores_its_stated_dtype() -> None:
    """The dtype inside a json2 chunk is not trusted: a huge one allocates nothing."""
    data = b'["a","b","<U1000000000",[2]]'
    pipe = V2Pipeline(None, [{"id": "json2"}], OBJ)
    assert list(pipe.decode_objects(data, 2)) == ["a", "b"]
    with pytest.raises(CodecError) as info:
        pipe.check_objects(data, 3)
    assert info.value.rule == "decoded-size"


def test_json_object_chunk_written_by_numcodecs() -> None:
    pipe = V2Pipeline({"id": "blosc"}, [{"id": "json2"}], OBJ)
    values = np.array([{"path": "/a"}, [1, 2], "x"], dtype=object)
    assert list(pipe.decode_objects(pipe.encode(values), 3)) == list(values)


@pytest.mark.parametrize("filters", [None, [{"id": "zlib"}], [{"id": "delta", "dtype": "<u2"}]])
def test_object_arrays_need_an_object_codec_first(filters: Any) -> None:
    with pytest.raises(CodecError) as info:
        V2Pipeline(None, filters, OBJ)
    assert info.value.rule == "object-codec"


def test_object_chunk_bomb_refused_by_the_object_limit() -> None:
    pipe = V2Pipeline({"id": "zlib"}, [{"id": "vlen-bytes"}], OBJ, object_limit=1 << 20)
    with pytest.raises(CodecError) as info:
        pipe.check_objects(zlib.compress(bytes(32 << 20)), 1)
    assert info.value.rule == "decoded-size"


def test_categorize_object_chunk_is_size_checked() -> None:
    config = {"id": "categorize", "labels": ["a", "b"], "dtype": "|O", "astype": "|u1"}
    pipe = V2Pipeline({"id": "zlib"}, [config], OBJ)
    values = np.array(["a", "b", "a", "z"], dtype=object)
    data = pipe.encode(values)
    assert list(pipe.decode_objects(data, 4)) == ["a", "b", "a", ""]  # unknown labels -> ""
    with pytest.raises(CodecError) as info:
        pipe.check_objects(data, 5)
    assert info.value.rule == "decoded-size"
