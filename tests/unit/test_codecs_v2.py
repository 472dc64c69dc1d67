"""Zarr v2 codec pipeline: numcodecs writes the bytes, the pipeline decodes them bounded."""

from __future__ import annotations

import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import numcodecs
import numcodecs.categorize
import numcodecs.delta
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numcodecs.compat import ensure_contiguous_ndarray

from n5fs.codecs import limits
from n5fs.codecs.limits import CodecError
from n5fs.codecs.pickle_check import SAFE_PICKLE_GLOBALS, check_pickle
from n5fs.codecs.v2_pipeline import V2Pipeline, build_codec, encoded_nbytes

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


@pytest.mark.parametrize(
    ("compressor", "filters", "dtype"),
    [
        (None, [{"id": "delta", "dtype": "<u2"}, {"id": "vlen-bytes"}], U2),
        (None, [{"id": "json2"}], U2),
        ({"id": "pickle"}, [{"id": "vlen-utf8"}], OBJ),
        (None, [{"id": "vlen-utf8"}, {"id": "vlen-bytes"}], OBJ),
    ],
)
def test_item_codecs_only_first_in_object_arrays(
    compressor: Any, filters: list[dict[str, Any]], dtype: np.dtype[Any]
) -> None:
    """A 4-byte chunk through vlen-bytes anywhere else would allocate GiB of item slots."""
    with pytest.raises(CodecError) as info:
        V2Pipeline(compressor, filters, dtype)
    assert info.value.rule == "object-codec"


def test_categorize_converts_the_arrays_own_dtype() -> None:
    V2Pipeline(
        None,
        [{"id": "categorize", "labels": ["a"], "dtype": "<U1", "astype": "u1"}],
        np.dtype("<U1"),
    )
    with pytest.raises(CodecError) as info:
        V2Pipeline(
            None,
            [{"id": "categorize", "labels": ["a"], "dtype": "<U1000000", "astype": "u1"}],
            OBJ,
        )
    assert info.value.rule == "codec-config"


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


# --- what a codec raises: bad input is a refusal, anything else is not ----------------------

#: every numcodecs codec as a compressor or filter of a "<u2" array, and the object codecs
GARBAGE_PIPELINES: list[tuple[Any, list[dict[str, Any]] | None, np.dtype[Any]]] = [
    *((c, None, U2) for c in COMPRESSORS),
    ({"id": "lzma", "format": 3, "filters": [{"id": 33}]}, None, U2),  # raw: not bounded
    *((None, [f], U2) for f, _ in FILTERS),
    *((None, [{"id": i}], OBJ) for i in ("vlen-utf8", "vlen-bytes", "json2", "pickle")),
    (None, [{"id": "vlen-array", "dtype": "<i4"}], OBJ),
    (None, [{"id": "categorize", "labels": ["a"], "dtype": "|O", "astype": "|u1"}], OBJ),
]


def _garbage_ids() -> list[str]:
    return [f"{c and c['id']}-{[f['id'] for f in fs or ()]}" for c, fs, _ in GARBAGE_PIPELINES]


@pytest.mark.parametrize(("compressor", "filters", "dtype"), GARBAGE_PIPELINES, ids=_garbage_ids())
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=96) | st.sampled_from([b"", b"\x00" * 4, b"\xff" * 16]))
def test_garbage_is_refused_never_crashes(
    compressor: Any, filters: list[dict[str, Any]] | None, dtype: np.dtype[Any], data: bytes
) -> None:
    pipe = V2Pipeline(compressor, filters, dtype)
    try:
        if pipe.is_object:
            pipe.check_objects(data, 4)
        else:
            pipe.decode(data, 32)
    except CodecError:
        pass


@pytest.mark.parametrize(("compressor", "filters", "dtype"), GARBAGE_PIPELINES, ids=_garbage_ids())
def test_damaged_real_chunks_are_refused(
    compressor: Any, filters: list[dict[str, Any]] | None, dtype: np.dtype[Any]
) -> None:
    """Truncated and bit-flipped chunks the codecs themselves wrote."""
    pipe = V2Pipeline(compressor, filters, dtype)
    values = np.array(["a", "b", "a", "a"], dtype=object) if pipe.is_object else RAMP[:16]
    try:
        data = pipe.encode(values)
    except (TypeError, ValueError):
        data = bytes(range(64))  # the pipeline cannot write: judge any bytes
    damaged = [data[: len(data) // 2], data[:-1], data + b"\x00\x01"]
    for i in range(0, len(data), max(1, len(data) // 12)):
        flipped = bytearray(data)
        flipped[i] ^= 0x5A
        damaged.append(bytes(flipped))
    for chunk in damaged:
        try:
            if pipe.is_object:
                pipe.check_objects(chunk, values.size)
            else:
                pipe.decode(chunk, values.nbytes)
        except CodecError:
            pass


def test_lazily_accepted_bad_parameter_is_a_refusal() -> None:
    """numcodecs accepts ``format: "x"`` until it decodes: still the content's fault."""
    pipe = V2Pipeline({"id": "lzma", "format": "x"}, None, U2)
    with pytest.raises(CodecError) as info:
        pipe.decode(b"\xfd7zXZ\x00" + bytes(26), 32)
    assert info.value.rule == "undecodable"


def _raise(exc: BaseException) -> Any:
    def decode(*_args: Any, **_kwargs: Any) -> Any:
        raise exc

    return decode


@pytest.mark.parametrize("exc", [MemoryError(), AttributeError("a bug"), KeyError("a bug")])
def test_what_is_not_bad_input_propagates(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    """A MemoryError or a bug is not 'content refused' (EINVAL): it surfaces as itself."""
    kind = type(exc)
    monkeypatch.setattr(numcodecs.delta.Delta, "decode", _raise(exc))
    with pytest.raises(kind):
        V2Pipeline(None, [{"id": "delta", "dtype": "<u2"}], U2).decode(RAMP.tobytes(), RAMP.nbytes)
    monkeypatch.setattr(limits, "zlib_decompress", _raise(exc))  # the bounded path
    with pytest.raises(kind):
        V2Pipeline({"id": "zlib"}, None, U2).decode(b"x", 8)
    monkeypatch.setattr(numcodecs.categorize.Categorize, "decode", _raise(exc))  # objects
    pipe = V2Pipeline(None, [{"id": "categorize", "labels": ["a"], "dtype": "|O"}], OBJ)
    with pytest.raises(kind):
        pipe.check_objects(b"\x01", 1)


def test_a_codec_constructor_bug_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numcodecs.delta.Delta, "__init__", _raise(MemoryError()))
    with pytest.raises(MemoryError):
        build_codec({"id": "delta", "dtype": "<u2"}, what="filters[0]")


# --- a format's extra pickle globals ---------------------------------------------------------


class Reference(dict):  # type: ignore[type-arg]
    """A writer's own dict subclass, as hdmf-zarr's ZarrReference is."""


REFERENCE_GLOBAL = f"{__name__}.Reference"


@pytest.mark.parametrize("protocol", range(6))
def test_extra_pickle_globals_are_allowed_only_where_given(protocol: int) -> None:
    values = np.array([Reference(source=".", path="/a"), Reference()], dtype=object)
    data = pickle.dumps(values, protocol=protocol)
    with pytest.raises(CodecError, match="Reference") as info:
        check_pickle(data, protocol=protocol)
    assert info.value.rule == "pickle-global"
    check_pickle(data, protocol=protocol, allowed=SAFE_PICKLE_GLOBALS | {REFERENCE_GLOBAL})
    pipe = V2Pipeline({"id": "zlib"}, [{"id": "pickle", "protocol": protocol}], OBJ)
    chunk = pipe.encode(values)
    pipe.check_objects(chunk, 2, pickle_globals=frozenset({REFERENCE_GLOBAL}))
    with pytest.raises(CodecError):
        pipe.check_objects(chunk, 2)
    with pytest.raises(CodecError):  # the extra globals widen the list, never replace it
        pipe.check_objects(
            pipe.encode(np.array([_Payload(Path("x"))], dtype=object)),
            1,
            pickle_globals=frozenset({REFERENCE_GLOBAL}),
        )
