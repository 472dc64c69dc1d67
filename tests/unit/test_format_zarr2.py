"""Zarr v2 format rules against arrays written by zarr-python 3 and TensorStore."""

from __future__ import annotations

import contextlib
import json
import math
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.dtype import VariableLengthBytes

from n5fs.errors import Rejected
from n5fs.formats.base import KeyKind
from n5fs.formats.zarr2 import (
    ZARRAY_KEYS,
    Zarr2ArrayNode,
    Zarr2AttrsNode,
    Zarr2ConsolidatedNode,
    Zarr2Format,
    Zarr2GroupNode,
)

FMT = Zarr2Format()
STRUCT = np.dtype([("x", "<i4"), ("y", "<f8")])


def _zarr_write(path: Path, values: np.ndarray[Any, Any], **kwargs: Any) -> None:
    with warnings.catch_warnings():  # the writer's own warnings (v2 dtypes) are not ours
        warnings.simplefilter("ignore")
        arr = zarr.create_array(
            store=str(path),
            zarr_format=2,
            shape=values.shape,
            dtype=kwargs.pop("dtype", values.dtype),
            **kwargs,
        )
        arr[...] = values


def _zarr_read(path: Path) -> np.ndarray[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(zarr.open_array(str(path), mode="r")[...])


def _ramp(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    return (np.arange(1, math.prod(shape) + 1) % 251).astype(dtype).reshape(shape)


def _strings(n: int) -> np.ndarray[Any, Any]:
    return np.array([f"s{i}é" * (i % 3) for i in range(n)], dtype=object)


CASES: dict[str, tuple[Callable[[], np.ndarray[Any, Any]], dict[str, Any]]] = {
    "delta-zlib-F": (
        lambda: _ramp((5, 7), "<u2"),
        {
            "chunks": (2, 3),
            "order": "F",
            "filters": [numcodecs.Delta(dtype="<u2")],
            "compressors": numcodecs.Zlib(level=3),
        },
    ),
    "structured": (
        lambda: np.array([(i, i / 2) for i in range(5)], dtype=STRUCT),
        {"chunks": (2,), "fill_value": np.zeros((), STRUCT)[()]},
    ),
    "bytes-S": (
        lambda: np.array([b"a", b"bb", b"ccc", b"dddd", b"e"]),
        {"chunks": (2,), "fill_value": b"ab"},
    ),
    "unicode-U": (
        lambda: np.array(["a", "bé", "c", "dd", "e"], dtype="<U3"),
        {"chunks": (2,), "fill_value": "xy"},
    ),
    "nan-fill-slash": (
        lambda: _ramp((5, 3), "<f4") / 7,
        {
            "chunks": (2, 2),
            "fill_value": np.nan,
            "chunk_key_encoding": {"name": "v2", "separator": "/"},
        },
    ),
    "datetime64": (
        lambda: np.arange(5).astype("<M8[D]").astype("<M8[ns]"),
        {"chunks": (2,), "fill_value": np.datetime64("NaT")},
    ),
    "timedelta64": (lambda: np.arange(1, 6).astype("<m8[s]"), {"chunks": (3,)}),
    "zero-d": (lambda: np.array(3.5), {"chunks": (), "fill_value": -np.inf}),
    "vlen-utf8": (lambda: _strings(5), {"chunks": (2,), "dtype": str}),
    "vlen-bytes": (
        lambda: np.array([b"a", b"", b"\xff\x00", b"dd"], dtype=object),
        {"chunks": (3,), "dtype": VariableLengthBytes()},
    ),
    "blosc-3d-edges": (
        lambda: _ramp((5, 6, 7), "|u1"),
        {"chunks": (2, 4, 3), "compressors": numcodecs.Blosc(cname="zstd")},
    ),
    "gzip": (lambda: _ramp((9,), "<i4") - 4, {"chunks": (4,), "compressors": numcodecs.GZip()}),
    "bz2": (lambda: _ramp((9,), "<i8"), {"chunks": (4,), "compressors": numcodecs.BZ2()}),
    "lzma": (lambda: _ramp((9,), "<f8"), {"chunks": (4,), "compressors": numcodecs.LZMA()}),
    "lz4": (lambda: _ramp((9,), "<u4"), {"chunks": (4,), "compressors": numcodecs.LZ4()}),
    "bool": (lambda: _ramp((9,), "<u1") % 2 == 0, {"chunks": (4,), "fill_value": True}),
    "complex": (lambda: _ramp((5,), "<f8") * (1 + 2j), {"chunks": (2,)}),
    "big-endian-raw": (lambda: _ramp((5,), ">i8"), {"chunks": (2,), "compressors": None}),
    "shuffle-F-slash-3d": (
        lambda: _ramp((3, 4, 5), "<f8") / 3,
        {
            "chunks": (2, 3, 2),
            "order": "F",
            "filters": [numcodecs.Shuffle(elementsize=8)],
            "chunk_key_encoding": {"name": "v2", "separator": "/"},
        },
    ),
}


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _region(node: Zarr2ArrayNode, position: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(
        slice(p * c, min((p + 1) * c, s))
        for p, c, s in zip(position, node.chunks, node.shape, strict=True)
    )


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    nan = a.dtype.kind in "fc" and a.dtype == b.dtype
    return bool(np.array_equal(a, b, equal_nan=nan))


def _array_node(root: Path) -> Zarr2ArrayNode:
    node = FMT.parse_metadata(".zarray", (root / ".zarray").read_bytes(), path=".zarray")
    assert isinstance(node, Zarr2ArrayNode)
    return node


def _check_every_key(root: Path, values: np.ndarray[Any, Any]) -> Zarr2ArrayNode:
    """Every key the writer stored classifies right; every chunk validates and decodes."""
    node = _array_node(root)
    chunks = 0
    for key, data in _files(root).items():
        found = node.classify(key)
        if key in (".zarray", ".zattrs"):
            assert found.kind is KeyKind.METADATA
            continue
        assert found.kind is KeyKind.CHUNK, key
        assert found.position is not None
        assert found.in_grid
        assert node.chunk_key(found.position) == key
        node.validate_chunk(found.position, data, path=key)
        decoded = node.decode_chunk(found.position, data)
        assert decoded.shape == node.chunks
        region = _region(node, found.position)
        inside = decoded[tuple(slice(0, r.stop - r.start) for r in region)]
        assert _same(inside, values[region]), key
        chunks += 1
    assert chunks == math.prod(node.grid)
    return node


@pytest.mark.parametrize("case", sorted(CASES))
def test_zarr_python_array_validates_and_decodes(tmp_path: Path, case: str) -> None:
    make, kwargs = CASES[case]
    values = make()
    _zarr_write(tmp_path / "a", values, **kwargs)
    node = _check_every_key(tmp_path / "a", values)
    assert node.shape == values.shape


@pytest.mark.parametrize("case", sorted(CASES))
def test_encoded_chunks_read_back_by_zarr_python(tmp_path: Path, case: str) -> None:
    """encode_chunk writes what zarr-python reads; edge chunks are padded like v2 stores them."""
    make, kwargs = CASES[case]
    values = make()
    root = tmp_path / "a"
    _zarr_write(root, values, **kwargs)
    node = _array_node(root)
    for key in list(_files(root)):
        found = node.classify(key)
        if found.kind is KeyKind.CHUNK:
            assert found.position is not None
            region = _region(node, found.position)
            data = node.encode_chunk(found.position, values[region])
            node.validate_chunk(found.position, data)
            (root / key).write_bytes(data)
    assert _same(_zarr_read(root), values)


def _tensorstore_write(path: Path, values: np.ndarray[Any, Any], metadata: dict[str, Any]) -> None:
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(path)},
        "metadata": {"shape": list(values.shape), "dtype": values.dtype.str, **metadata},
    }
    store = ts.open(spec, create=True).result()
    store[...] = values


@pytest.mark.parametrize(
    "metadata",
    [
        {"chunks": [2, 3]},  # TensorStore defaults: blosc, fill null, "."
        {
            "chunks": [2, 3],
            "order": "F",
            "dimension_separator": "/",
            "fill_value": "NaN",
            "compressor": {"id": "zlib", "level": 3},
        },
        {"chunks": [4, 4], "compressor": {"id": "zstd", "level": 1}},
    ],
)
def test_tensorstore_array_validates_and_decodes(tmp_path: Path, metadata: dict[str, Any]) -> None:
    values = _ramp((5, 7), "<f4" if "fill_value" in metadata else "<u2")
    _tensorstore_write(tmp_path / "t", values, metadata)
    _check_every_key(tmp_path / "t", values)


# --- classify --------------------------------------------------------------------------------


def _node(**changes: Any) -> Zarr2ArrayNode:
    doc = {
        "zarr_format": 2,
        "shape": [10, 10],
        "chunks": [4, 4],
        "dtype": "<u2",
        "compressor": {"id": "zlib", "level": 1},
        "fill_value": 0,
        "order": "C",
        "filters": None,
        **changes,
    }
    node = FMT.parse_metadata(".zarray", json.dumps(doc).encode())
    assert isinstance(node, Zarr2ArrayNode)
    return node


@pytest.mark.parametrize(
    ("separator", "shape", "chunks", "key", "kind", "position", "in_grid"),
    [
        (".", [10, 10], [4, 4], "0.0", KeyKind.CHUNK, (0, 0), True),
        (".", [10, 10], [4, 4], "2.1", KeyKind.CHUNK, (2, 1), True),
        (".", [10, 10], [4, 4], "3.0", KeyKind.CHUNK, (3, 0), False),
        (".", [10, 10], [4, 4], "0/0", KeyKind.INVALID, None, True),
        (".", [10, 10], [4, 4], "0.0.0", KeyKind.INVALID, None, True),
        (".", [10, 10], [4, 4], "01.0", KeyKind.INVALID, None, True),
        (".", [10, 10], [4, 4], "-1.0", KeyKind.INVALID, None, True),
        (".", [10, 10], [4, 4], "0.0.partial", KeyKind.OTHER, None, True),
        (".", [10, 10], [4, 4], ".0.0.XyZ123", KeyKind.OTHER, None, True),
        (".", [10, 10], [4, 4], "٣.0", KeyKind.OTHER, None, True),  # non-ASCII digit
        (".", [10, 10], [4, 4], "+1.0", KeyKind.INVALID, None, True),
        (".", [10, 10], [4, 4], "1", KeyKind.INVALID, None, True),
        (".", [10, 10], [4, 4], "c.0.0", KeyKind.INVALID, None, True),  # a v3 key
        (".", [10, 10], [4, 4], "0/0.__lock", KeyKind.OTHER, None, True),
        (".", [10, 10], [4, 4], "notes.txt", KeyKind.OTHER, None, True),
        (".", [10, 10], [4, 4], ".zarray", KeyKind.METADATA, None, True),
        (".", [10, 10], [4, 4], ".zattrs", KeyKind.METADATA, None, True),
        ("/", [10, 10], [4, 4], "1/2", KeyKind.CHUNK, (1, 2), True),
        ("/", [10, 10], [4, 4], "1.2", KeyKind.INVALID, None, True),
        ("/", [10, 10], [4, 4], "1/2/0", KeyKind.INVALID, None, True),
        ("/", [10], [4], "5", KeyKind.CHUNK, (5,), False),
        (".", [], [], "0", KeyKind.CHUNK, (), True),
        (".", [], [], "1", KeyKind.INVALID, None, True),
        (".", [], [], "0.0", KeyKind.INVALID, None, True),
        (".", [0, 5], [2, 2], "0.0", KeyKind.CHUNK, (0, 0), False),
    ],
)
def test_classify(
    separator: str,
    shape: list[int],
    chunks: list[int],
    key: str,
    kind: KeyKind,
    position: tuple[int, ...] | None,
    in_grid: bool,
) -> None:
    node = _node(shape=shape, chunks=chunks, dimension_separator=separator)
    found = node.classify(key)
    assert (found.kind, found.position, found.in_grid) == (kind, position, in_grid)
    if kind is KeyKind.INVALID:
        assert found.rule == "chunk-key"
        assert repr(key) in found.message


@pytest.mark.parametrize(
    ("separator", "chunks", "key", "grammar"),
    [
        (
            ".",
            [4, 4],
            "0/0",
            "2 unsigned integers without leading zeros joined by '.' (e.g. '0.0')",
        ),
        ("/", [4, 4, 4], "1.2.3", "joined by '/' (e.g. '0/0/0')"),
        (".", [4], "01", "1 unsigned integer without leading zeros (e.g. '0')"),
        (".", [], "1", "just '0' (the array has no dimensions)"),
    ],
)
def test_bad_chunk_key_names_the_grammar(
    separator: str, chunks: list[int], key: str, grammar: str
) -> None:
    node = _node(shape=[8] * len(chunks), chunks=chunks, dimension_separator=separator)
    assert grammar in node.classify(key).message


def test_chunk_key_is_the_inverse_of_classify() -> None:
    assert _node().chunk_key((2, 1)) == "2.1"
    assert _node(dimension_separator="/").chunk_key((2, 1)) == "2/1"
    assert _node(shape=[], chunks=[]).chunk_key(()) == "0"


# --- invalid metadata --------------------------------------------------------------------------

_DROP = object()
BASE = {
    "zarr_format": 2,
    "shape": [10],
    "chunks": [4],
    "dtype": "<u2",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}
INVALID_ZARRAY: list[tuple[dict[str, Any], str]] = [
    *[({key: _DROP}, "missing-key") for key in ZARRAY_KEYS],
    ({"zarr_format": 3}, "zarr-format"),
    ({"zarr_format": "2"}, "zarr-format"),
    ({"zarr_format": True}, "zarr-format"),
    ({"shape": [-1]}, "shape"),
    ({"shape": [1.5]}, "shape"),
    ({"shape": "10"}, "shape"),
    ({"shape": [True]}, "shape"),
    ({"chunks": [0]}, "chunks"),
    ({"chunks": None}, "chunks"),
    ({"chunks": [4, 4]}, "shape-chunks-length"),
    ({"chunks": []}, "shape-chunks-length"),
    *[
        ({"dtype": d}, "dtype")
        for d in (
            "<u3",
            "u2",
            "|u2",
            "|U3",
            "<M8",
            "<i4[ns]",
            "<U0",
            "|O4",
            "<f16",
            "<c4",
            "<b2",
            "",
            "<u2 ",
            42,
            None,
            [],
            [["a"]],
            [["a", "<i4"], ["a", "<i4"]],
            [["a", "|O"]],
            [["", "<i4"]],
            [["a", "<i4", [0.5]]],
            [[1, "<i4"]],
            "|S99999999999",
        )
    ],
    *[
        ({"dtype": d, "fill_value": f}, "fill-value")
        for d, f in (
            ("<i4", "NaN"),
            ("<i4", 1.5),
            ("|u1", 300),
            ("|u1", -1),
            ("<f4", "abc"),
            ("<f4", 1e39),
            ("<f2", 70000),
            ("<f8", True),
            ("<f8", 10**400),
            ("<c8", [1]),
            ("<c8", 1.0),
            ("|S4", "!!!"),
            ("|S4", "aGVsbG8="),
            ("<U3", "toolong"),
            ("<U3", 3),
            ("|V3", 3),
            ("|V4", "AAAA"),
            ("<M8[ns]", "x"),
            ("<M8[ns]", 2**63),
            ("|b1", 2),
            ("|b1", "true"),
            ([["x", "<i4"]], "AAAAAAAA"),
        )
    ],
    ({"order": "A"}, "order"),
    ({"order": None}, "order"),
    ({"dimension_separator": "-"}, "dimension-separator"),
    ({"compressor": {"id": "nope"}}, "unknown-codec"),
    ({"compressor": "zlib"}, "codec-config"),
    ({"compressor": {"id": "zlib", "bogus": 1}}, "codec-config"),
    ({"filters": {"id": "delta", "dtype": "<u2"}}, "codec-config"),
    ({"filters": [{"id": "nope"}]}, "unknown-codec"),
    ({"dtype": "|O"}, "object-codec"),
    ({"dtype": "|O", "filters": [{"id": "vlen-utf8"}], "fill_value": {"a": 1}}, "fill-value"),
]


@pytest.mark.parametrize(
    ("changes", "rule"),
    INVALID_ZARRAY,
    ids=[f"{r}:{json.dumps(c, default=str)[:40]}" for c, r in INVALID_ZARRAY],
)
def test_invalid_zarray_refused_with_its_rule(changes: dict[str, Any], rule: str) -> None:
    doc = {k: v for k, v in {**BASE, **changes}.items() if v is not _DROP}
    with pytest.raises(Rejected) as info:
        FMT.parse_metadata(".zarray", json.dumps(doc).encode(), path="arr/.zarray")
    assert (info.value.rule, info.value.fmt, info.value.path) == (rule, "zarr2", "arr/.zarray")


@pytest.mark.parametrize(
    ("name", "data", "rule"),
    [
        (".zarray", b"{", "json"),
        (".zarray", b"\xff\xfe\x00", "json"),
        (".zarray", b'{"zarr_format": 2, "zarr_format": 2}', "json"),
        (".zarray", b"[]", "json-object"),
        (".zgroup", b'{"zarr_format": 2, "extra": 1}', "zgroup"),
        (".zgroup", b'{"zarr_format": 3}', "zgroup"),
        (".zgroup", b'{"zarr_format": 2, "consolidated_metadata": {}}', "zgroup"),
        (".zgroup", b"{}", "zgroup"),
        (".zgroup", b"2", "json-object"),
        (".zattrs", b'["a"]', "json-object"),
        (".zmetadata", b'{"metadata": {}}', "consolidated"),
        (".zmetadata", b'{"zarr_consolidated_format": 2, "metadata": {}}', "consolidated"),
        (".zmetadata", b'{"zarr_consolidated_format": 1, "metadata": []}', "consolidated"),
        ("README", b"{}", "unknown-metadata"),
    ],
)
def test_invalid_metadata_documents(name: str, data: bytes, rule: str) -> None:
    with pytest.raises(Rejected) as info:
        FMT.parse_metadata(name, data, path=name)
    assert info.value.rule == rule


def _zmetadata(entries: dict[str, Any]) -> bytes:
    return json.dumps({"zarr_consolidated_format": 1, "metadata": entries}).encode()


@pytest.mark.parametrize(
    ("entries", "rule"),
    [
        ({"../.zarray": BASE}, "consolidated"),
        ({"a//.zgroup": {"zarr_format": 2}}, "consolidated"),
        ({"a/data": {}}, "consolidated"),
        ({"a/.zarray": {**BASE, "dtype": "<u3"}}, "dtype"),
        ({"a/.zattrs": []}, "json-object"),
        ({"a/.zarray": BASE, "a/.zgroup": {"zarr_format": 2}}, "consolidated"),
        ({"a/.zarray": BASE, "a/b/.zgroup": {"zarr_format": 2}}, "consolidated"),
        ({".zarray": BASE, "x/y/.zattrs": {}}, "consolidated"),
        ({"a/.zgroup": {"zarr_format": 2, "other": 1}}, "zgroup"),
    ],
)
def test_invalid_consolidated_entries(entries: dict[str, Any], rule: str) -> None:
    with pytest.raises(Rejected) as info:
        FMT.parse_metadata(".zmetadata", _zmetadata(entries), path=".zmetadata")
    assert (info.value.rule, info.value.path) == (rule, ".zmetadata")


def test_consolidated_metadata_written_by_zarr_python(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = zarr.open_group(str(tmp_path), mode="w", zarr_format=2)
        root.attrs["title"] = "t"
        root.create_array("a", shape=(4,), chunks=(2,), dtype="u1")
        root.create_group("s").create_array(
            "b", shape=(2, 2), chunks=(1, 1), dtype="f4", fill_value=float("nan")
        )
        zarr.consolidate_metadata(str(tmp_path))
    node = FMT.parse_metadata(".zmetadata", (tmp_path / ".zmetadata").read_bytes())
    assert isinstance(node, Zarr2ConsolidatedNode)
    on_disk = {
        k for k in _files(tmp_path) if k.rpartition("/")[2] in (".zarray", ".zgroup", ".zattrs")
    }
    assert set(node.entries) == on_disk
    assert isinstance(node.entries["s/b/.zarray"], Zarr2ArrayNode)
    assert isinstance(node.entries["s/.zgroup"], Zarr2GroupNode)
    assert node.entries[".zattrs"].attributes == {"title": "t"}


# --- chunks ------------------------------------------------------------------------------------

VALUES = _ramp((4, 4), "<u2")


@pytest.mark.parametrize(
    ("position", "data", "rule"),
    [
        ((0, 0), zlib.compress(VALUES.tobytes()[:-2]), "decoded-size"),
        ((0, 0), zlib.compress(VALUES.tobytes() + b"\0\0"), "decoded-size"),
        ((0, 0), zlib.compress(VALUES.tobytes())[:-6], "undecodable"),
        ((0, 0), b"not zlib at all", "undecodable"),
        ((0, 0), b"", "undecodable"),
        ((0, 0), zlib.compress(bytes(64 << 20)), "decoded-size"),
        ((3, 0), zlib.compress(VALUES.tobytes()), "out-of-grid"),
        ((0, -1), zlib.compress(VALUES.tobytes()), "out-of-grid"),
        ((0,), zlib.compress(VALUES.tobytes()), "out-of-grid"),
    ],
)
def test_invalid_chunks_refused(position: tuple[int, ...], data: bytes, rule: str) -> None:
    node = _node()
    node.validate_chunk((2, 2), zlib.compress(VALUES.tobytes()))  # the good one passes
    with pytest.raises(Rejected) as info:
        node.validate_chunk(position, data, path="arr/0.0")
    assert (info.value.rule, info.value.fmt, info.value.path) == (rule, "zarr2", "arr/0.0")


def test_structural_changes_are_refused_while_chunks_exist() -> None:
    old = _node()
    FMT.check_change(old, _node(shape=[100, 3]), chunks_exist=True)  # resize
    FMT.check_change(old, _node(fill_value=7), chunks_exist=True)
    FMT.check_change(old, _node(dtype="<u4"), chunks_exist=False)
    for changes in (
        {"dtype": "<u4"},
        {"chunks": [2, 2]},
        {"order": "F"},
        {"compressor": {"id": "zlib", "level": 9}},
        {"dimension_separator": "/"},
        {"filters": [{"id": "delta", "dtype": "<u2"}]},
    ):
        with pytest.raises(Rejected) as info:
            FMT.check_change(old, _node(**changes), chunks_exist=True)
        assert info.value.rule == "structural-change"
        assert next(iter(changes)) in str(info.value)


def test_missing_dimension_separator_means_dot() -> None:
    assert _node().structural() == _node(dimension_separator=".").structural()
    assert _node(dimension_separator=None).classify("1.1").position == (1, 1)


def test_probes_and_node_from_probes() -> None:
    zarray = json.dumps({**BASE, "dtype": "<f4"}).encode()
    assert FMT.matches({".zarray": zarray})
    assert FMT.matches({".zgroup": b'{"zarr_format": 2}'})
    assert not FMT.matches({".zattrs": b"{}"})
    # Presence decides: broken metadata makes an invalid Zarr v2 node, never a plain folder.
    for broken in ({".zgroup": b'{"zarr_format": 3}'}, {".zarray": b"\xff not json"}):
        assert FMT.matches(broken)
        with pytest.raises(Rejected):
            FMT.node_from_probes(broken)
    with pytest.raises(Rejected) as info:
        FMT.check_folder(frozenset({".zarray", ".zgroup", ".zattrs"}), path="a/")
    assert (info.value.path, info.value.rule) == ("a/", "array-and-group")
    FMT.check_folder(frozenset({".zarray", ".zattrs"}), path="a/")
    node = FMT.node_from_probes({".zarray": zarray, ".zattrs": b'{"units": "m"}'})
    assert isinstance(node, Zarr2ArrayNode)
    assert node.attributes == {"units": "m"}
    group = FMT.node_from_probes({".zgroup": b'{"zarr_format": 2}'})
    assert isinstance(group, Zarr2GroupNode)
    assert group.attributes == {}
    with pytest.raises(Rejected) as info:
        FMT.node_from_probes({".zgroup": b'{"zarr_format": 2, "x": 1}'}, path="a/b/")
    assert (info.value.path, info.value.rule) == ("a/b/.zgroup", "zgroup")
    with pytest.raises(Rejected) as info:
        FMT.node_from_probes({".zgroup": b'{"zarr_format": 2}', ".zattrs": b"[]"})
    assert (info.value.path, info.value.rule) == (".zattrs", "json-object")
    attrs = FMT.parse_metadata(".zattrs", b'{"a": NaN}')
    assert isinstance(attrs, Zarr2AttrsNode)
    assert math.isnan(attrs.attributes["a"])


# --- robustness: anything in, only Rejected out ---------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_PLAUSIBLE = {
    "zarr_format": st.sampled_from([2, 3, "2"]) | _JSON,
    "shape": st.lists(st.integers(-2, 2**40), max_size=3) | _JSON,
    "chunks": st.lists(st.integers(-1, 2**40), max_size=3) | _JSON,
    "dtype": st.sampled_from(
        [
            "<u2",
            "|O",
            "<M8[ns]",
            "|S3",
            "<U2",
            "|V2",
            "<c16",
            "|b1",
            [["a", "<i4"]],
            [["a", "<f8", [2]]],
        ]
    )
    | _JSON,
    "compressor": st.sampled_from(
        [None, {"id": "zlib"}, {"id": "blosc", "clevel": 99}, {"id": "lzma", "format": 3}]
    )
    | _JSON,
    "fill_value": st.sampled_from(["NaN", "AAAA", 0, -1, 2**70, "NaT", [1, "NaN"]]) | _JSON,
    "order": st.sampled_from(["C", "F"]) | _JSON,
    "filters": st.sampled_from(
        [
            None,
            [{"id": "vlen-utf8"}],
            [{"id": "pickle"}],
            [{"id": "pickle", "protocol": "x"}],
            [{"id": "delta", "dtype": "<u2"}],
            [{"id": "categorize", "labels": ["a"], "dtype": "|O", "astype": "zz"}],
        ]
    )
    | _JSON,
    "dimension_separator": st.sampled_from([".", "/"]) | _JSON,
}


def _only_rejected(call: Callable[[], object]) -> None:
    with contextlib.suppress(Rejected):
        call()


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(FMT.metadata_names)), data=st.binary(max_size=200))
def test_arbitrary_bytes_as_metadata(name: str, data: bytes) -> None:
    _only_rejected(lambda: FMT.parse_metadata(name, data))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(FMT.metadata_names)), doc=_JSON)
def test_arbitrary_json_as_metadata(name: str, doc: Any) -> None:
    _only_rejected(lambda: FMT.parse_metadata(name, json.dumps(doc).encode()))


@settings(max_examples=500, deadline=None)
@given(doc=st.fixed_dictionaries({}, optional=_PLAUSIBLE))
def test_plausible_zarray_documents(doc: dict[str, Any]) -> None:
    _only_rejected(lambda: FMT.parse_metadata(".zarray", json.dumps(doc).encode()))
    wrapped = {"zarr_consolidated_format": 1, "metadata": {"a/.zarray": doc}}
    _only_rejected(lambda: FMT.parse_metadata(".zmetadata", json.dumps(wrapped).encode()))


CHUNK_NODES: list[dict[str, Any]] = [
    {"compressor": {"id": cid}} for cid in ("zlib", "gzip", "bz2", "lzma", "blosc", "zstd", "lz4")
] + [
    {"compressor": None},
    {"compressor": {"id": "zlib"}, "filters": [{"id": "delta", "dtype": "<u2"}]},
    {"compressor": None, "filters": [{"id": "fletcher32"}]},
    {"dtype": "|O", "filters": [{"id": "pickle"}], "compressor": None},
    {"dtype": "|O", "filters": [{"id": "vlen-utf8"}], "compressor": None},
    {"dtype": "|O", "filters": [{"id": "vlen-bytes"}], "compressor": {"id": "zlib"}},
    {"dtype": "|O", "filters": [{"id": "json2"}], "compressor": None},
    {"dtype": "|O", "filters": [{"id": "vlen-array", "dtype": "<i4"}], "compressor": None},
    {
        "dtype": "|O",
        "filters": [{"id": "categorize", "labels": ["a", "b"], "dtype": "|O", "astype": "|u1"}],
        "compressor": None,
    },
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(CHUNK_NODES) - 1), data=st.binary(max_size=300))
def test_arbitrary_bytes_as_chunks(which: int, data: bytes) -> None:
    node = _node(shape=[4], chunks=[2], **CHUNK_NODES[which])
    _only_rejected(lambda: node.validate_chunk((1,), data))
    _only_rejected(lambda: node.decode_chunk((1,), data))


# --- claims -----------------------------------------------------------------------------------


def _never() -> bytes:
    raise AssertionError("a Zarr v2 name is enough: content must not be read")


@pytest.mark.parametrize("name", [".zarray", ".zgroup", ".zattrs", ".zmetadata"])
@pytest.mark.parametrize("context", [None, "zarr2", "hdmf-zarr", "n5", "zarr3"])
def test_zarr2_claims_its_names_in_any_context(name: str, context: str | None) -> None:
    assert FMT.claims(name, context, _never)


@pytest.mark.parametrize("name", ["zarr.json", "attributes.json", ".zarray.tmp", "0.0", "zarray"])
def test_zarr2_claims_nothing_else(name: str) -> None:
    assert not FMT.claims(name, "zarr2", _never)
