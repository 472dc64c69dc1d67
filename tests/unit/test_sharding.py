"""sharding_indexed: shards written by zarr-python and TensorStore, and hand-broken shards."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

from n5fs.codecs.limits import CodecError
from n5fs.codecs.v3 import EMPTY, ArraySpec, CodecChain, ShardingCodec, parse_data_type

LE = {"name": "bytes", "configuration": {"endian": "little"}}
GZIP = {"name": "gzip", "configuration": {"level": 5}}
INDEX = [LE, {"name": "crc32c"}]


def sharding_json(
    inner: list[int],
    codecs: list[Any] | None = None,
    *,
    location: str = "end",
    index: list[Any] | None = None,
) -> dict[str, Any]:
    return {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": inner,
            "codecs": codecs or [LE],
            "index_codecs": index or INDEX,
            "index_location": location,
        },
    }


def shard_spec(shape: tuple[int, ...], dtype: str = "uint16", fill: Any = 0) -> ArraySpec:
    data_type = parse_data_type(dtype)
    return ArraySpec(shape, data_type, data_type.dtype.type(fill))


def codec_for(meta: dict[str, Any]) -> tuple[ShardingCodec, ArraySpec]:
    """The sharding codec and shard spec an array's zarr.json declares."""
    shard_shape = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
    spec = shard_spec(shard_shape, meta["data_type"], meta["fill_value"])
    codec = CodecChain.parse(meta["codecs"], spec).array_bytes
    assert isinstance(codec, ShardingCodec)
    return codec, spec


def make(
    shape: tuple[int, ...], inner: list[int], **kwargs: Any
) -> tuple[ShardingCodec, ArraySpec]:
    spec = shard_spec(shape)
    codec = CodecChain.parse([sharding_json(inner, **kwargs)], spec).array_bytes
    assert isinstance(codec, ShardingCodec)
    return codec, spec


def refused(rule: str, call: Any, *args: Any) -> CodecError:
    with pytest.raises(CodecError) as info:
        call(*args)
    assert info.value.rule == rule, info.value
    return info.value


def nonfill_inner(values: np.ndarray[Any, Any], inner: tuple[int, ...], fill: Any) -> set[Any]:
    grid = tuple(s // c for s, c in zip(values.shape, inner, strict=True))
    return {
        pos
        for pos in np.ndindex(*grid)
        if not np.all(
            values[tuple(slice(p * c, (p + 1) * c) for p, c in zip(pos, inner, strict=True))]
            == fill
        )
    }


# --------------------------------------------------------------------------- real writers


ZARR_SHARDS = [
    {
        "compressors": [ZstdCodec(level=3, checksum=True)],
        "filters": [TransposeCodec(order=(1, 0))],
        "serializer": BytesCodec(endian="big"),
    },
    {"compressors": [GzipCodec(level=1), Crc32cCodec()]},
    {"compressors": None},
]


@pytest.mark.parametrize("kwargs", ZARR_SHARDS)
def test_zarr_python_shards(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    values = np.arange(16 * 12, dtype="int32").reshape(16, 12)
    values[0:4, 0:3] = -1  # one inner chunk equal to fill: zarr-python leaves it empty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = zarr.create_array(
            store=str(tmp_path),
            shape=values.shape,
            dtype="int32",
            chunks=(4, 3),
            shards=(8, 6),
            fill_value=-1,
            zarr_format=3,
            **kwargs,
        )
        array[...] = values
    codec, spec = codec_for(json.loads((tmp_path / "zarr.json").read_text()))
    for i, j in np.ndindex(2, 2):
        data = (tmp_path / "c" / str(i) / str(j)).read_bytes()
        expected = values[8 * i : 8 * i + 8, 6 * j : 6 * j + 6]
        codec.validate(data, spec)
        assert np.array_equal(codec.decode(data, spec), expected)
        present = {pos for pos, _, _ in codec.read_index(data).present()}
        assert present == nonfill_inner(expected, (4, 3), -1)


@pytest.mark.parametrize("location", ["start", "end"])
def test_tensorstore_shards(tmp_path: Path, location: str) -> None:
    values = np.arange(10 * 7, dtype="uint16").reshape(10, 7)
    values[4:8, 0:3] = 7
    store = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(tmp_path) + "/"},
            "create": True,
            "metadata": {
                "shape": [10, 7],
                "data_type": "uint16",
                "fill_value": 7,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 6]}},
                "codecs": [sharding_json([4, 3], [LE, GZIP], location=location)],
            },
        }
    ).result()
    store[...] = values
    codec, spec = codec_for(json.loads((tmp_path / "zarr.json").read_text()))
    assert codec.index_location == location
    padded = np.full((16, 12), 7, dtype="uint16")
    padded[:10, :7] = values
    for i, j in np.ndindex(2, 2):
        data = (tmp_path / "c" / str(i) / str(j)).read_bytes()
        expected = padded[8 * i : 8 * i + 8, 6 * j : 6 * j + 6]
        codec.validate(data, spec)
        assert np.array_equal(codec.decode(data, spec), expected)
        present = {pos for pos, _, _ in codec.read_index(data).present()}
        assert present == nonfill_inner(expected, (4, 3), 7)


@pytest.mark.parametrize("location", ["start", "end"])
def test_our_shards_read_by_tensorstore_and_zarr_python(tmp_path: Path, location: str) -> None:
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [8, 6],
        "data_type": "uint16",
        "fill_value": 0,
        "chunk_key_encoding": {"name": "default"},
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 6]}},
        "codecs": [sharding_json([4, 3], [LE, GZIP], location=location)],
    }
    (tmp_path / "zarr.json").write_text(json.dumps(meta))
    codec, spec = codec_for(meta)
    values = np.arange(48, dtype="uint16").reshape(8, 6)
    values[4:, 3:] = 0
    data = codec.encode(values, spec)
    assert len({pos for pos, _, _ in codec.read_index(data).present()}) == 3
    (tmp_path / "c" / "0").mkdir(parents=True)
    (tmp_path / "c" / "0" / "0").write_bytes(data)
    store = ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path) + "/"}}
    ).result()
    assert np.array_equal(store.read().result(), values)
    assert np.array_equal(zarr.open_array(str(tmp_path), mode="r")[...], values)


def test_nested_sharding_round_trip() -> None:
    inner = sharding_json([2, 2], [LE, GZIP], location="start")
    codec, spec = make((8, 8), [4, 4], codecs=[inner])
    values = np.arange(64, dtype="uint16").reshape(8, 8)
    data = codec.encode(values, spec)
    codec.validate(data, spec)
    assert np.array_equal(codec.decode(data, spec), values)


def test_all_fill_shard_is_only_an_index() -> None:
    codec, spec = make((4, 4), [2, 2])
    data = codec.encode(np.zeros((4, 4), dtype="uint16"), spec)
    assert len(data) == 4 * 16 + 4
    assert not list(codec.read_index(data).present())
    assert np.array_equal(codec.decode(data, spec), np.zeros((4, 4)))


def test_string_shards_round_trip() -> None:
    data_type = parse_data_type("string")
    spec = ArraySpec((4,), data_type, "")
    codec = CodecChain.parse([sharding_json([2], [{"name": "vlen-utf8"}])], spec).array_bytes
    values = np.array(["", "", "a", "bé"], dtype=object)
    data = codec.encode(values, spec)
    assert [pos for pos, _, _ in codec.read_index(data).present()] == [(1,)]  # type: ignore[attr-defined]
    assert codec.decode(data, spec).tolist() == values.tolist()


# --------------------------------------------------------------------------- broken shards


def with_table(codec: ShardingCodec, shard: bytes, edit: Any) -> bytes:
    """``shard`` with its index rewritten by ``edit(table)`` (a valid crc32c kept)."""
    table = codec.read_index(shard)
    pairs = np.stack([table.offsets, table.nbytes], axis=-1).reshape((*codec.grid, 2))
    edit(pairs)
    index = codec.index.encode(pairs)
    size = codec.index_nbytes
    if codec.index_location == "start":
        return index + shard[size:]
    return shard[:-size] + index


def good(
    location: str = "end", codecs: list[Any] | None = None
) -> tuple[ShardingCodec, ArraySpec, bytes]:
    codec, spec = make((4, 4), [2, 2], codecs=codecs or [LE, GZIP], location=location)
    values = np.arange(1, 17, dtype="uint16").reshape(4, 4)
    return codec, spec, codec.encode(values, spec)


def _set(pos: tuple[int, ...], offset: int, nbytes: int) -> Any:
    def edit(pairs: np.ndarray[Any, Any]) -> None:
        pairs[pos] = (offset, nbytes)

    return edit


@pytest.mark.parametrize("location", ["start", "end"])
@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("past-end", "extends past the end"),
        ("huge-offset", "extends past the end"),
        ("too-long", "extends past the end"),
        ("into-index", "overlaps the shard index"),
        ("half-empty-offset", "only one of offset/nbytes"),
        ("half-empty-nbytes", "only one of offset/nbytes"),
    ],
)
def test_bad_shard_index_refused(location: str, case: str, words: str) -> None:
    codec, spec, shard = good(location)
    length, size = len(shard), codec.index_nbytes
    edits = {
        "past-end": _set((0, 1), length, 1),
        "huge-offset": _set((0, 1), EMPTY - 1, 10),
        "too-long": _set((1, 0), 0 if location == "end" else size, length + 1),
        "into-index": _set((1, 1), length - size - 2 if location == "end" else 0, 4),
        "half-empty-offset": _set((0, 0), EMPTY, 10),
        "half-empty-nbytes": _set((0, 0), 10, EMPTY),
    }
    broken = with_table(codec, shard, edits[case])
    error = refused("shard-index", codec.validate, broken, spec)
    assert words in error.message
    refused("shard-index", codec.decode, broken, spec)


@pytest.mark.parametrize("location", ["start", "end"])
def test_index_checksum_mismatch_refused(location: str) -> None:
    codec, spec, shard = good(location)
    at = 3 if location == "start" else len(shard) - 10
    broken = shard[:at] + bytes([shard[at] ^ 0x40]) + shard[at + 1 :]
    error = refused("checksum", codec.validate, broken, spec)
    assert "shard index" in error.message


def test_shard_shorter_than_index_refused() -> None:
    codec, spec, shard = good()
    error = refused("shard-index", codec.validate, shard[-codec.index_nbytes + 1 :], spec)
    assert "shorter than its 68-byte index" in error.message


def test_corrupt_inner_chunk_named() -> None:
    codec, spec, shard = good()
    _, offset, nbytes = next(p for p in codec.read_index(shard).present() if p[0] == (0, 1))
    broken = shard[:offset] + b"\x00\x00" + shard[offset + 2 :]  # no gzip magic
    error = refused("undecodable", codec.validate, broken, spec)
    assert error.message.startswith("inner chunk (0, 1): gzip")
    refused("undecodable", codec.decode, broken, spec)
    assert codec.read_index(broken).nbytes.tolist() == codec.read_index(shard).nbytes.tolist()
    assert nbytes > 2


def test_short_inner_chunk_refused() -> None:
    codec, spec, shard = good(codecs=[LE])
    broken = with_table(codec, shard, lambda pairs: pairs.__setitem__((1, 1, 1), 6))
    error = refused("decoded-size", codec.validate, broken, spec)
    assert "inner chunk (1, 1)" in error.message


def test_inner_gzip_bomb_refused() -> None:
    import gzip

    codec, spec, _ = good(codecs=[LE, GZIP])
    bomb = gzip.compress(bytes(1_000_000))
    table = np.full((2, 2, 2), EMPTY, dtype="uint64")
    table[0, 0] = (0, len(bomb))
    data = bomb + codec.index.encode(table)
    refused("decoded-size", codec.validate, data, spec)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (sharding_json([3, 2]), "evenly divide"),
        (sharding_json([2]), "dimensions"),
        (sharding_json([0, 2]), "positive integers"),
        (sharding_json([2, 2], index=[LE, GZIP]), "fixed encoded size"),
        (sharding_json([2, 2], location="middle"), "index_location"),
        (
            {"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2], "codecs": [LE]}},
            "index_codecs",
        ),
        (
            {
                "name": "sharding_indexed",
                "configuration": {**sharding_json([2, 2])["configuration"], "extra": 1},
            },
            "unknown",
        ),
        (sharding_json([2, 2], [{"name": "bytes"}]), "endian"),
    ],
)
def test_sharding_config_refused(config: dict[str, Any], words: str) -> None:
    with pytest.raises(CodecError) as info:
        CodecChain.parse([config], shard_spec((4, 4)))
    assert info.value.rule == "codec-config"
    assert words in info.value.message


def test_unknown_inner_codec_refused() -> None:
    with pytest.raises(CodecError) as info:
        CodecChain.parse([sharding_json([2, 2], [LE, {"name": "lz4"}])], shard_spec((4, 4)))
    assert info.value.rule == "unknown-codec"
    assert "'lz4'" in info.value.message


# --------------------------------------------------------------------------- fuzz


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300), location=st.sampled_from(["start", "end"]))
def test_arbitrary_bytes_only_raise_codec_error(data: bytes, location: str) -> None:
    codec, spec = make((4, 4), [2, 2], codecs=[LE, GZIP], location=location)
    try:
        codec.validate(data, spec)
    except CodecError:
        return
    assert codec.decode(data, spec).shape == (4, 4)


PAIR = st.tuples(
    st.sampled_from([0, 1, 8, 40, 68, 100, EMPTY - 1, EMPTY]) | st.integers(0, 200),
    st.sampled_from([0, 8, 20, EMPTY]) | st.integers(0, 200),
)


@settings(max_examples=150, deadline=None)
@given(pairs=st.lists(PAIR, min_size=4, max_size=4), location=st.sampled_from(["start", "end"]))
def test_arbitrary_index_only_raises_codec_error(
    pairs: list[tuple[int, int]], location: str
) -> None:
    codec, spec, shard = good(location, codecs=[LE])
    broken = with_table(
        codec,
        shard,
        lambda table: table.__setitem__(
            slice(None), np.array(pairs, dtype="uint64").reshape(2, 2, 2)
        ),
    )
    try:
        codec.validate(broken, spec)
    except CodecError:
        return
    assert codec.decode(broken, spec).shape == (4, 4)
