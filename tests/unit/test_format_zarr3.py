"""Zarr v3 format: real stores from zarr-python and TensorStore, metadata rules, key grammar."""

from __future__ import annotations

import copy
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
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.core.dtype import VariableLengthBytes

from n5fs.errors import Rejected
from n5fs.formats import zarr3
from n5fs.formats.base import KeyKind
from n5fs.formats.consolidation import consolidate, consolidated_is_current
from n5fs.formats.zarr3 import Zarr3ArrayNode, Zarr3Format, Zarr3GroupNode

F = Zarr3Format()
LE = {"name": "bytes", "configuration": {"endian": "little"}}
GZIP = {"name": "gzip", "configuration": {"level": 5}}


def parse(doc: Any) -> Any:
    return F.parse_metadata("zarr.json", json.dumps(doc).encode(), path="a/zarr.json")


def array_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [10, 7],
        "data_type": "int16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 3]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [LE, GZIP],
        "attributes": {"x": 1},
    }
    doc.update(changes)
    return doc


def rejected(rule: str, doc: Any, raw: bytes | None = None) -> Rejected:
    data = json.dumps(doc).encode() if raw is None else raw
    with pytest.raises(Rejected) as info:
        F.parse_metadata("zarr.json", data, path="a/zarr.json")
    assert info.value.rule == rule, info.value
    assert (info.value.fmt, info.value.path) == ("zarr3", "a/zarr.json")
    return info.value


def same(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> bool:
    if got.dtype.kind in "fc":
        return bool(np.array_equal(got, expected, equal_nan=True))
    return got.tolist() == expected.tolist()


def expected_chunk(
    values: np.ndarray[Any, Any], node: Zarr3ArrayNode, pos: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    full = np.full(node.chunks, node.fill_value, dtype=node.dtype)
    region = tuple(
        slice(p * c, min((p + 1) * c, s))
        for p, c, s in zip(pos, node.chunks, node.shape, strict=True)
    )
    part = values[region]
    full[tuple(slice(0, n) for n in part.shape)] = part
    return full


def check_store(root: Path, values: np.ndarray[Any, Any]) -> Zarr3ArrayNode:
    """Every key classifies, every chunk validates and decodes to what the writer wrote."""
    node = F.parse_metadata("zarr.json", (root / "zarr.json").read_bytes(), path="zarr.json")
    assert isinstance(node, Zarr3ArrayNode)
    chunks = 0
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix()
        found = node.classify(rel)
        if rel == "zarr.json":
            assert found.kind is KeyKind.METADATA
            continue
        assert found.kind is KeyKind.CHUNK, rel
        assert found.in_grid, rel
        assert found.position is not None
        assert node.chunk_key(found.position) == rel
        data = file.read_bytes()
        node.validate_chunk(found.position, data, path=rel)
        assert same(
            node.decode_chunk(found.position, data), expected_chunk(values, node, found.position)
        ), rel
        chunks += 1
    assert chunks > 0
    return node


def zarr_write(root: Path, values: np.ndarray[Any, Any], fill: Any, **kwargs: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs.setdefault("dtype", values.dtype)
        array = zarr.create_array(
            store=str(root), shape=values.shape, fill_value=fill, zarr_format=3, **kwargs
        )
        array[...] = values


# --------------------------------------------------------------------------- zarr-python

GRID = np.arange(10 * 7).reshape(10, 7)
ZARR_CASES: list[tuple[str, np.ndarray[Any, Any], Any, dict[str, Any]]] = [
    ("default-slash", GRID.astype("int16"), -1, {"chunks": (4, 3)}),
    (
        "default-dot",
        GRID.astype("int16"),
        0,
        {"chunks": (4, 3), "chunk_key_encoding": {"name": "default", "separator": "."}},
    ),
    (
        "v2-dot",
        GRID.astype("uint32"),
        5,
        {"chunks": (4, 3), "chunk_key_encoding": {"name": "v2", "separator": "."}},
    ),
    (
        "v2-slash",
        GRID.astype("int8"),
        0,
        {"chunks": (4, 3), "chunk_key_encoding": {"name": "v2", "separator": "/"}},
    ),
    ("0d-default", np.array(3.5), 0.0, {"chunks": ()}),
    (
        "0d-v2",
        np.array(-2, dtype="int64"),
        0,
        {"chunks": (), "chunk_key_encoding": {"name": "v2", "separator": "."}},
    ),
    ("bool", GRID % 3 == 0, False, {"chunks": (4, 3)}),
    ("float16-nan", (GRID / 7).astype("float16"), float("nan"), {"chunks": (5, 5)}),
    ("complex", (GRID + 1j * GRID).astype("complex64"), 1 + 2j, {"chunks": (4, 3)}),
    (
        "uint64-big-transpose",
        GRID.astype("uint64") * 2**40,
        0,
        {
            "chunks": (4, 3),
            "serializer": BytesCodec(endian="big"),
            "filters": [TransposeCodec(order=(1, 0))],
        },
    ),
    (
        "gzip-crc32c",
        GRID.astype("float64"),
        0.0,
        {"chunks": (4, 3), "compressors": [GzipCodec(level=2), Crc32cCodec()]},
    ),
    (
        "blosc",
        GRID.astype("int32"),
        0,
        {"chunks": (4, 3), "compressors": [BloscCodec(cname="lz4", shuffle="shuffle")]},
    ),
    (
        "vlen-string",
        np.array([f"s{i}" * (i % 4) for i in range(9)], dtype=object),
        "",
        {"chunks": (4,), "dtype": "str"},
    ),
    (
        "vlen-bytes",
        np.array([b"a", b"", b"xyz\x00", b"q", b"r"], dtype=object),
        b"",
        {"chunks": (2,), "dtype": VariableLengthBytes()},
    ),
    ("fixed-utf32", np.array(["ab", "ü", "xyz", ""], dtype="<U3"), "", {"chunks": (3,)}),
    ("null-terminated-bytes", np.array([b"ab", b"", b"xyz"], dtype="S3"), b"", {"chunks": (2,)}),
    (
        "datetime",
        np.array(["2024-01-01", "NaT", "1970-01-02"], dtype="M8[D]"),
        np.datetime64("NaT"),
        {"chunks": (2,)},
    ),
    (
        "sharded",
        GRID.astype("int16"),
        -1,
        {
            "chunks": (2, 3),
            "shards": (4, 6),
            "compressors": [ZstdCodec(level=1, checksum=True)],
            "filters": [TransposeCodec(order=(1, 0))],
            "serializer": BytesCodec(endian="big"),
        },
    ),
    (
        "sharded-crc32c",
        GRID.astype("float32"),
        float("nan"),
        {"chunks": (2, 2), "shards": (4, 4), "compressors": [GzipCodec(level=1), Crc32cCodec()]},
    ),
]


@pytest.mark.parametrize(
    ("name", "values", "fill", "kwargs"), ZARR_CASES, ids=[c[0] for c in ZARR_CASES]
)
def test_zarr_python_store(
    tmp_path: Path, name: str, values: np.ndarray[Any, Any], fill: Any, kwargs: dict[str, Any]
) -> None:
    zarr_write(tmp_path, values, fill, **kwargs)
    node = check_store(tmp_path, values)
    assert node.shape == values.shape
    assert same(np.array([node.fill_value]), np.array([fill], dtype=node.dtype))


def test_zarr_python_reads_our_edge_chunk(tmp_path: Path) -> None:
    zarr_write(
        tmp_path,
        GRID.astype("int16"),
        -1,
        chunks=(4, 3),
        compressors=[ZstdCodec(level=1, checksum=True)],
    )
    node = check_store(tmp_path, GRID.astype("int16"))
    edge = np.array([[100, 101]], dtype="int16")  # chunk (2, 2) holds only row 8..9, col 6
    data = node.encode_chunk((2, 2), np.array([[100], [101]], dtype="int16"))
    (tmp_path / "c" / "2" / "2").write_bytes(data)
    assert zarr.open_array(str(tmp_path), mode="r")[8:10, 6].tolist() == edge[0].tolist()
    padded = node.decode_chunk((2, 2), data)
    assert padded[:, 1:].tolist() == [[-1, -1]] * 4


# --------------------------------------------------------------------------- TensorStore

TS_CASES: list[dict[str, Any]] = [
    {"data_type": "uint16", "codecs": [LE, GZIP]},
    {
        "data_type": "float32",
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "/"}},
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "big"}},
            {
                "name": "blosc",
                "configuration": {
                    "cname": "zstd",
                    "clevel": 3,
                    "shuffle": "bitshuffle",
                    "typesize": 4,
                    "blocksize": 0,
                },
            },
        ],
    },
    {
        "data_type": "int64",
        "codecs": [
            {"name": "transpose", "configuration": {"order": [1, 0]}},
            LE,
            {"name": "zstd", "configuration": {"level": 2}},
            {"name": "crc32c"},
        ],
    },
    {
        "data_type": "bool",
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
    },
    {
        "data_type": "uint8",
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [2, 3],
                    "codecs": [{"name": "bytes"}, GZIP],
                    "index_codecs": [LE, {"name": "crc32c"}],
                    "index_location": "start",
                },
            }
        ],
    },
]


@pytest.mark.parametrize("metadata", TS_CASES)
def test_tensorstore_store(tmp_path: Path, metadata: dict[str, Any]) -> None:
    dtype = metadata["data_type"]
    values = (GRID % 5 == 0) if dtype == "bool" else GRID.astype(dtype)
    store = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(tmp_path) + "/"},
            "create": True,
            "metadata": {
                "shape": [10, 7],
                "fill_value": False if dtype == "bool" else 3,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
                **metadata,
            },
        }
    ).result()
    store[...] = values
    check_store(tmp_path, values)


# --------------------------------------------------------------------------- metadata rules


def _mutated(path: str, value: Any) -> dict[str, Any]:
    doc = array_doc()
    *parents, last = path.split(".")
    target = doc
    for part in parents:
        target = target[part]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return doc


DELETE = object()
BAD_ARRAYS: list[tuple[str, Any, str]] = [
    ("zarr_format", DELETE, "zarr-format"),
    ("zarr_format", 2, "zarr-format"),
    ("zarr_format", "3", "zarr-format"),
    ("zarr_format", True, "zarr-format"),
    ("node_type", "dataset", "node-type"),
    ("shape", DELETE, "missing-key"),
    ("codecs", DELETE, "missing-key"),
    ("fill_value", DELETE, "missing-key"),
    ("chunk_key_encoding", DELETE, "missing-key"),
    ("shape", [1] * 33, "shape"),
    ("shape", [-1, 7], "shape"),
    ("shape", [10.5, 7], "shape"),
    ("shape", "10", "shape"),
    ("chunk_grid.configuration.chunk_shape", [0, 3], "chunk-shape"),
    ("chunk_grid.configuration.chunk_shape", [4], "chunk-shape"),
    ("chunk_grid.name", "rectilinear", "chunk-grid"),
    ("chunk_grid.must_understand", False, "chunk-grid"),
    ("chunk_grid.configuration.extra", 1, "chunk-grid"),
    ("chunk_key_encoding.name", "v3", "chunk-key-encoding"),
    ("chunk_key_encoding.configuration.separator", "-", "chunk-key-encoding"),
    ("chunk_key_encoding.must_understand", False, "chunk-key-encoding"),
    ("data_type", "float128", "data-type"),
    ("fill_value", 1.5, "fill-value"),
    ("fill_value", 40000, "fill-value"),
    ("fill_value", None, "fill-value"),
    ("fill_value", True, "fill-value"),
    ("fill_value", "NaN", "fill-value"),
    ("codecs", [LE, {"name": "lz4"}], "unknown-codec"),
    ("codecs", [LE, LE], "codec-order"),
    ("codecs", [], "codec-order"),
    ("codecs", [LE, {"name": "gzip", "configuration": {"level": 99}}], "codec-config"),
    ("foo", 1, "must-understand"),
    ("foo", {"must_understand": True}, "must-understand"),
    ("foo", {"x": 1}, "must-understand"),
    ("storage_transformers", [{"name": "x"}], "storage-transformer"),
    ("storage_transformers", "x", "storage-transformer"),
    ("dimension_names", ["x"], "dimension-names"),
    ("dimension_names", [1, 2], "dimension-names"),
    ("attributes", [], "attributes"),
]


@pytest.mark.parametrize(("path", "value", "rule"), BAD_ARRAYS)
def test_bad_array_metadata_refused(path: str, value: Any, rule: str) -> None:
    rejected(rule, _mutated(path, value))


@pytest.mark.parametrize(
    ("data_type", "fill"),
    [
        ("bool", 1),
        ("uint8", -1),
        ("uint8", 256),
        ("float32", 1e300),
        ("float32", "0x7fc0000"),
        ("float64", "0x7fc00000"),
        ("float32", "nan"),
        ("complex64", [1]),
        ("complex64", ["NaN", "x"]),
        ("string", 5),
        ("r16", [1, 256]),
        ("r16", "AAA="),
        (
            {"name": "numpy.datetime64", "configuration": {"unit": "D", "scale_factor": 1}},
            "yesterday",
        ),
        ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}}, "abcd"),
        ({"name": "null_terminated_bytes", "configuration": {"length_bytes": 2}}, "not base64!"),
        ({"name": "raw_bytes", "configuration": {"length_bytes": 4}}, "AAA="),
    ],
)
def test_fill_value_must_fit_data_type(data_type: Any, fill: Any) -> None:
    codecs = [{"name": "vlen-utf8"}] if data_type == "string" else [LE]
    rejected("fill-value", array_doc(data_type=data_type, fill_value=fill, codecs=codecs))


@pytest.mark.parametrize(
    ("data_type", "fill", "bits"),
    [
        ("float32", "0x7fc00000", "0000c07f"),
        ("float32", "Infinity", "0000807f"),
        ("float64", "-Infinity", "000000000000f0ff"),
        ("float16", 1.5, "003e"),
        ("int16", 2.0, "0200"),
        ("uint64", 2**64 - 1, "ff" * 8),
        ("complex64", ["NaN", "0x3f800000"], "0000c07f0000803f"),
        (
            {"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}},
            "NaT",
            "0000000000000080",
        ),
        ("r16", [1, 255], "01ff"),
    ],
)
def test_fill_value_forms(data_type: Any, fill: Any, bits: str) -> None:
    node = parse(array_doc(data_type=data_type, fill_value=fill))
    assert np.array(node.fill_value, dtype=node.dtype).tobytes().hex() == bits


@pytest.mark.parametrize(
    "raw", [b"{", b"\xff\xfe", b"[]", b'{"zarr_format": NaN}', b"[" * 100_000, b'"zarr.json"']
)
def test_undecodable_json_refused(raw: bytes) -> None:
    # nesting too deep for any parser is refused as such, before it is found unterminated
    rejected("json-depth" if raw.startswith(b"[[") else "json", None, raw)


def test_accepted_variations() -> None:
    ts_style = array_doc(chunk_key_encoding={"name": "default"}, codecs=[LE, {"name": "crc32c"}])
    del ts_style["attributes"]
    node = parse(ts_style)
    assert node.key_encoding.to_json() == {"name": "default", "configuration": {"separator": "/"}}
    assert parse(array_doc(chunk_key_encoding="v2")).chunk_key((1, 2)) == "1.2"
    assert parse(array_doc(dimension_names=["y", None])).dimension_names == ("y", None)
    assert parse(array_doc(foo={"must_understand": False, "x": 1})).attributes == {"x": 1}
    listed = parse(array_doc(storage_transformers=[{"name": "x", "must_understand": False}]))
    assert listed.structural()["storage_transformers"] == [{"name": "x", "must_understand": False}]
    assert parse(array_doc(shape=[0, 7])).grid == (0, 3)


@pytest.mark.parametrize(
    ("doc", "rule"),
    [
        ({"zarr_format": 3, "node_type": "group", "shape": [1]}, "must-understand"),
        ({"zarr_format": 3, "node_type": "group", "attributes": []}, "attributes"),
        ({"zarr_format": 3}, "node-type"),
        (
            {
                "zarr_format": 3,
                "node_type": "group",
                "consolidated_metadata": {"kind": "external", "metadata": {}},
            },
            "consolidated-metadata",
        ),
        (
            {
                "zarr_format": 3,
                "node_type": "group",
                "consolidated_metadata": {
                    "kind": "inline",
                    "metadata": {"a/b": {"zarr_format": 3, "node_type": "group"}},
                },
            },
            "consolidated-metadata",
        ),
        (
            {
                "zarr_format": 3,
                "node_type": "group",
                "consolidated_metadata": {
                    "kind": "inline",
                    "metadata": {"../a": {"zarr_format": 3, "node_type": "group"}},
                },
            },
            "consolidated-metadata",
        ),
        (
            {
                "zarr_format": 3,
                "node_type": "group",
                "consolidated_metadata": {
                    "kind": "inline",
                    "metadata": {"a": array_doc(fill_value="x")},
                },
            },
            "fill-value",
        ),
        (
            {
                "zarr_format": 3,
                "node_type": "group",
                "consolidated_metadata": {
                    "kind": "inline",
                    "metadata": {"a": {"zarr_format": 2, "shape": [1]}},
                },
            },
            "zarr-format",
        ),
    ],
)
def test_bad_group_metadata_refused(doc: dict[str, Any], rule: str) -> None:
    error = rejected(rule, doc)
    if rule == "fill-value":
        assert "consolidated_metadata entry 'a'" in error.message


def test_only_zarr_json_is_metadata() -> None:
    with pytest.raises(Rejected) as info:
        F.parse_metadata(".zarray", b"{}", path="x/.zarray")
    assert info.value.rule == "metadata-name"
    assert F.matches({"zarr.json": b"garbage"})
    assert not F.matches({".zarray": b"{}"})
    assert isinstance(
        F.node_from_probes({"zarr.json": json.dumps(array_doc()).encode()}), Zarr3ArrayNode
    )


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("a/b", "'/'"),
        (".", "only of periods"),
        ("..", "only of periods"),
        ("...", "only of periods"),
        ("__zarr", "reserved"),
        ("__", "reserved"),
        ("zarr.json", "metadata name"),
    ],
)
def test_node_names_the_spec_forbids(name: str, problem: str) -> None:
    found = F.node_name_problem(name)
    assert found is not None
    assert problem in found


@pytest.mark.parametrize(
    # the spec only recommends a-zA-Z0-9-_. and NFKC case-folded names; writers use others
    "name",
    ["a", "A", "_x", "x__", ".hidden", "a.", "..a", "c", "0", "ü-µ", "名前", "sp ace", "ZARR.JSON"],
)
def test_node_names_the_spec_allows(name: str) -> None:
    assert F.node_name_problem(name) is None


def test_zarr_python_writes_names_the_spec_forbids(tmp_path: Path) -> None:
    """zarr-python 3 does not check the MUSTs itself: n5fs is the one to refuse these."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group = zarr.open_group(str(tmp_path), mode="w", zarr_format=3)
        group.create_group("__reserved")
        group.create_array("...", shape=(2,), dtype="int8")
        group.create_group("名前")
    folders = sorted(p.parent.name for p in tmp_path.glob("*/zarr.json"))
    assert folders == ["...", "__reserved", "名前"]
    assert [F.node_name_problem(n) is None for n in folders] == [False, False, True]


# --------------------------------------------------------------------------- chunk keys


def _node(encoding: Any, shape: list[int]) -> Zarr3ArrayNode:
    chunks = [4, 3][: len(shape)]
    return parse(
        array_doc(
            shape=shape,
            chunk_key_encoding=encoding,
            codecs=[LE],
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": chunks}},
        )
    )


SLASH = {"name": "default", "configuration": {"separator": "/"}}
DOT = {"name": "default", "configuration": {"separator": "."}}
V2DOT = {"name": "v2", "configuration": {"separator": "."}}
V2SLASH = {"name": "v2", "configuration": {"separator": "/"}}


@pytest.mark.parametrize(
    ("encoding", "shape", "key", "kind", "position", "in_grid"),
    [
        (SLASH, [10, 7], "zarr.json", "metadata", None, True),
        (SLASH, [10, 7], "c/0/0", "chunk", (0, 0), True),
        (SLASH, [10, 7], "c/2/2", "chunk", (2, 2), True),
        (SLASH, [10, 7], "c/3/0", "chunk", (3, 0), False),
        (SLASH, [10, 7], "c/0", "invalid", None, True),
        (SLASH, [10, 7], "c/0/0/0", "invalid", None, True),
        (SLASH, [10, 7], "c", "invalid", None, True),
        (SLASH, [10, 7], "c/01/0", "invalid", None, True),
        (SLASH, [10, 7], "c/-1/0", "invalid", None, True),
        (SLASH, [10, 7], "c/+1/0", "invalid", None, True),
        (SLASH, [10, 7], "c/0.1", "invalid", None, True),
        (SLASH, [10, 7], "c/0/0/", "other", None, True),
        (SLASH, [10, 7], "c/" + "9" * 30 + "/0", "chunk", (10**30 - 1, 0), False),
        (SLASH, [10, 7], "c/" + "1" * 5000 + "/0", "invalid", None, True),
        (SLASH, [10, 7], "cc/0/0", "other", None, True),
        (SLASH, [10, 7], "c//0", "other", None, True),
        (SLASH, [10, 7], "c/0/0.3f2a9c.partial", "other", None, True),
        (SLASH, [10, 7], "c/0/0__lock", "other", None, True),
        (SLASH, [10, 7], "c/0/.0.Xq12ab", "other", None, True),
        (SLASH, [10, 7], "c.0.0", "invalid", None, True),
        (SLASH, [10, 7], "0.0", "invalid", None, True),
        (SLASH, [10, 7], "0/0", "invalid", None, True),
        (SLASH, [10, 7], "README.md", "other", None, True),
        (DOT, [10, 7], "c.1.2", "chunk", (1, 2), True),
        (DOT, [10, 7], "c/1/2", "invalid", None, True),
        (DOT, [10, 7], "c.1.2.0", "invalid", None, True),
        (V2DOT, [10, 7], "1.2", "chunk", (1, 2), True),
        (V2DOT, [10, 7], "c.1.2", "invalid", None, True),
        (V2DOT, [10, 7], "c", "other", None, True),
        (V2DOT, [10, 7], "1/2", "invalid", None, True),
        (V2DOT, [10, 7], "1.02", "invalid", None, True),
        (V2DOT, [10, 7], "0", "invalid", None, True),
        (V2SLASH, [10, 7], "1/2", "chunk", (1, 2), True),
        (V2SLASH, [10, 7], "1.2", "invalid", None, True),
        (SLASH, [], "c", "chunk", (), True),
        (SLASH, [], "c/0", "invalid", None, True),
        (V2DOT, [], "0", "chunk", (), True),
        (V2DOT, [], "1", "invalid", None, True),
        (V2DOT, [], "00", "invalid", None, True),
        (V2DOT, [], "c", "other", None, True),
        (V2DOT, [7], "6", "chunk", (6,), False),
        (V2DOT, [7], "1.0", "invalid", None, True),
    ],
)
def test_classify(
    encoding: Any,
    shape: list[int],
    key: str,
    kind: str,
    position: tuple[int, ...] | None,
    in_grid: bool,
) -> None:
    found = _node(encoding, shape).classify(key)
    assert (found.kind.value, found.position, found.in_grid) == (kind, position, in_grid)
    if found.kind is KeyKind.INVALID:
        assert found.rule == "chunk-key"
        assert "looks like a chunk key" in found.message


@pytest.mark.parametrize(
    ("encoding", "shape", "grammar"),
    [
        (SLASH, [10, 7], "'c' followed by 2 indices, each after '/', such as 'c/0/0'"),
        (DOT, [10], "'c' followed by 1 index, each after '.', such as 'c.0'"),
        (V2DOT, [10, 7], "2 indices joined by '.', such as '0.0'"),
        (V2SLASH, [10], "1 index, such as '0'"),
        (SLASH, [], "the single key 'c'"),
        (V2DOT, [], "the single key '0'"),
    ],
)
def test_bad_chunk_key_names_the_grammar(encoding: Any, shape: list[int], grammar: str) -> None:
    found = _node(encoding, shape).classify("00.00.00")
    assert found.kind is KeyKind.INVALID
    assert grammar in found.message


@pytest.mark.parametrize(
    ("encoding", "position", "key"),
    [
        (SLASH, (1, 2), "c/1/2"),
        (DOT, (1, 2), "c.1.2"),
        (V2DOT, (1, 2), "1.2"),
        (V2SLASH, (0, 2), "0/2"),
        (SLASH, (), "c"),
        (V2DOT, (), "0"),
        (DOT, (), "c"),
    ],
)
def test_chunk_key(encoding: Any, position: tuple[int, ...], key: str) -> None:
    node = _node(encoding, [10, 7][: len(position)])
    assert node.chunk_key(position) == key
    assert node.classify(key).position == position


# --------------------------------------------------------------------------- chunk checks


def _chunk_refused(
    node: Zarr3ArrayNode, position: tuple[int, ...], data: bytes, rule: str
) -> Rejected:
    with pytest.raises(Rejected) as info:
        node.validate_chunk(position, data, path="a/c/0/0")
    assert info.value.rule == rule, info.value
    assert (info.value.fmt, info.value.path) == ("zarr3", "a/c/0/0")
    return info.value


def test_bad_chunks_refused() -> None:
    import gzip

    import zstandard

    node = parse(array_doc())
    good = gzip.compress(bytes(24))
    node.validate_chunk((0, 0), good)
    _chunk_refused(node, (3, 0), good, "out-of-grid")
    _chunk_refused(node, (0,), good, "out-of-grid")
    _chunk_refused(node, (0, 0), gzip.compress(bytes(22)), "decoded-size")
    _chunk_refused(node, (0, 0), b"\x1f\x8b not really", "undecodable")
    _chunk_refused(node, (0, 0), gzip.compress(bytes(50_000_000)), "decoded-size")
    zstd = parse(array_doc(codecs=[LE, {"name": "zstd", "configuration": {"level": 1}}]))
    _chunk_refused(zstd, (0, 0), b"\x28\xb5\x2f\xfd\x00\x00", "undecodable")
    _chunk_refused(zstd, (0, 0), zstandard.ZstdCompressor().compress(bytes(10**7)), "decoded-size")
    raw = parse(array_doc(codecs=[LE, {"name": "crc32c"}]))
    _chunk_refused(raw, (0, 0), bytes(28), "checksum")


def test_bad_shard_refused_with_path(tmp_path: Path) -> None:
    zarr_write(tmp_path, GRID.astype("int16"), -1, chunks=(2, 3), shards=(4, 6))
    node = check_store(tmp_path, GRID.astype("int16"))
    shard = (tmp_path / "c" / "0" / "0").read_bytes()
    broken = shard[:-3] + bytes([shard[-3] ^ 1]) + shard[-2:]
    error = _chunk_refused(node, (0, 0), broken, "checksum")
    assert "shard index" in error.message


def test_oversized_chunks_are_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    node = parse(array_doc())
    monkeypatch.setattr(zarr3, "MAX_DECODE_BYTES", 16)
    _chunk_refused(node, (0, 0), bytes(24), "chunk-too-large")
    strings = parse(array_doc(data_type="string", fill_value="", codecs=[{"name": "vlen-utf8"}]))
    _chunk_refused(strings, (0, 0), b"\x0c\x00\x00\x00", "chunk-too-large")
    sharded = parse(
        array_doc(
            codecs=[
                {
                    "name": "sharding_indexed",
                    "configuration": {"chunk_shape": [2, 1], "codecs": [LE], "index_codecs": [LE]},
                }
            ]
        )
    )
    sharded.validate_chunk((0, 0), sharded.encode_chunk((0, 0), np.ones((4, 3), "int16")))


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({"attributes": {"y": 2}}, True),
        ({"shape": [100, 70]}, True),
        ({"dimension_names": ["y", "x"]}, True),
        ({"fill_value": 7}, True),
        ({"codecs": [LE, {"name": "gzip", "configuration": {"level": 6}}]}, False),
        ({"codecs": [LE]}, False),
        ({"data_type": "uint16"}, False),
        ({"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}}}, False),
        ({"chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}}, False),
        ({"chunk_key_encoding": {"name": "default"}}, True),
        ({"codecs": ["bytes", GZIP], "data_type": "uint8"}, False),
    ],
)
def test_structural_changes(change: dict[str, Any], allowed: bool) -> None:
    old, new = parse(array_doc()), parse(array_doc(**change))
    F.check_change(old, new, chunks_exist=False)
    if allowed:
        F.check_change(old, new, chunks_exist=True)
    else:
        with pytest.raises(Rejected) as info:
            F.check_change(old, new, chunks_exist=True, path="a/zarr.json")
        assert info.value.rule == "structural-change"


def test_equivalent_spellings_are_not_changes() -> None:
    one = parse(array_doc(codecs=[LE, "crc32c"], data_type="int16"))
    two = parse(
        array_doc(codecs=[LE, {"name": "crc32c", "configuration": {}}], data_type={"name": "int16"})
    )
    assert one.structural() == two.structural()


def test_fill_value_is_structural_only_when_sharded() -> None:
    sharding = [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [2, 3],
                "codecs": [LE],
                "index_codecs": [LE, {"name": "crc32c"}],
            },
        }
    ]
    nan = parse(array_doc(data_type="float32", fill_value="NaN", codecs=sharding))
    bits = parse(array_doc(data_type="float32", fill_value="0x7fc00000", codecs=sharding))
    F.check_change(nan, bits, chunks_exist=True)
    with pytest.raises(Rejected):
        F.check_change(
            nan,
            parse(array_doc(data_type="float32", fill_value=0, codecs=sharding)),
            chunks_exist=True,
        )


# --------------------------------------------------------------------------- consolidated


def _hierarchy(root: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group = zarr.open_group(str(root), mode="w", zarr_format=3, attributes={"top": 1})
        group.create_array("b", shape=(4,), chunks=(2,), dtype="int8")
        group.create_array("A", shape=(3, 3), chunks=(2, 2), dtype="float64", fill_value=np.nan)
        sub = group.create_group("sub", attributes={"s": True})
        sub.create_array("deep", shape=(5,), chunks=(5,), dtype="str")
        sub.create_group("leaf")
        zarr.consolidate_metadata(str(root))


def _children(root: Path) -> dict[str, dict[str, Any]]:
    return {
        p.parent.relative_to(root).as_posix(): json.loads(p.read_text())
        for p in root.rglob("zarr.json")
        if p.parent != root
    }


def test_consolidated_metadata_from_zarr_python(tmp_path: Path) -> None:
    _hierarchy(tmp_path)
    root_doc = json.loads((tmp_path / "zarr.json").read_text())
    node = parse(root_doc)
    assert isinstance(node, Zarr3GroupNode)
    assert node.attributes == {"top": 1}
    assert node.consolidated is not None
    kinds = {path: type(entry).__name__ for path, entry in node.consolidated.items()}
    assert kinds == {
        "A": "Zarr3ArrayNode",
        "b": "Zarr3ArrayNode",
        "sub": "Zarr3GroupNode",
        "sub/deep": "Zarr3ArrayNode",
        "sub/leaf": "Zarr3GroupNode",
    }
    for path, doc in _children(tmp_path).items():
        own = parse(doc)
        if isinstance(own, Zarr3ArrayNode):
            assert node.consolidated[path].structural() == own.structural()
    rebuilt = consolidate(root_doc, _children(tmp_path))["consolidated_metadata"]
    assert rebuilt == root_doc["consolidated_metadata"]
    assert list(rebuilt["metadata"]) == list(root_doc["consolidated_metadata"]["metadata"])
    assert consolidated_is_current(root_doc, _children(tmp_path))


def test_rebuilt_consolidated_metadata_is_read_by_zarr_python(tmp_path: Path) -> None:
    _hierarchy(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_group(str(tmp_path / "sub"), mode="r+").attrs["s"] = False
    root_doc = json.loads((tmp_path / "zarr.json").read_text())
    assert not consolidated_is_current(root_doc, _children(tmp_path))
    fresh = consolidate(root_doc, _children(tmp_path))
    assert isinstance(parse(fresh), Zarr3GroupNode)
    (tmp_path / "zarr.json").write_text(json.dumps(fresh))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group = zarr.open_consolidated(str(tmp_path), zarr_format=3)
        assert group["sub"].attrs["s"] is False
        assert group["sub/deep"].dtype.kind in "OTU"


# --------------------------------------------------------------------------- fuzz

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
SHARDED = array_doc(
    codecs=[
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [2, 3],
                "codecs": [LE, GZIP],
                "index_codecs": [LE, {"name": "crc32c"}],
            },
        }
    ]
)
GROUP = {
    "zarr_format": 3,
    "node_type": "group",
    "consolidated_metadata": {"kind": "inline", "metadata": {"a": array_doc()}},
}
SEEDS = [array_doc(), SHARDED, GROUP]
KEYS = [
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "attributes",
    "dimension_names",
    "storage_transformers",
    "consolidated_metadata",
    "other",
]


def _parses_or_rejects(raw: bytes) -> None:
    try:
        node = F.parse_metadata("zarr.json", raw)
    except Rejected:
        return
    if isinstance(node, Zarr3ArrayNode):
        assert node.chunk_key((0,) * len(node.shape)) is not None


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_rejected(raw: bytes) -> None:
    _parses_or_rejects(raw)


@settings(max_examples=150, deadline=None)
@given(doc=JSON)
def test_arbitrary_json_only_raises_rejected(doc: Any) -> None:
    _parses_or_rejects(json.dumps(doc).encode())


@settings(max_examples=300, deadline=None)
@given(
    seed=st.sampled_from(SEEDS),
    key=st.sampled_from(KEYS),
    value=JSON,
    chunk=st.binary(max_size=120),
)
def test_mutated_metadata_and_chunks_only_raise_rejected(
    seed: dict[str, Any], key: str, value: Any, chunk: bytes
) -> None:
    doc = copy.deepcopy(seed)
    doc[key] = value
    try:
        node = F.parse_metadata("zarr.json", json.dumps(doc).encode())
    except Rejected:
        return
    if isinstance(node, Zarr3ArrayNode) and all(node.grid):
        try:
            node.validate_chunk((0,) * len(node.shape), chunk)
        except Rejected:
            return


@settings(max_examples=150, deadline=None)
@given(chunk=st.binary(max_size=300), which=st.sampled_from([0, 1]))
def test_arbitrary_chunks_only_raise_rejected(chunk: bytes, which: int) -> None:
    node = parse(SEEDS[which])
    try:
        node.validate_chunk((1, 1), chunk)
    except Rejected:
        return
    assert node.decode_chunk((1, 1), chunk).shape == (4, 3)
