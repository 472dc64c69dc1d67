"""The FormatContract against every format n5fs ships.

Each class lists array documents of its format (dtypes, compressors, 0-D..3-D, edge chunks)
and one RuleCase per metadata rule: a document that parses and a small change of it that is
refused with that rule. A helper adding a rule to a format adds its RuleCase here.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any, ClassVar

import google_crc32c
import numcodecs
import zstandard

from n5fs.codecs.n5_header import encode_header
from n5fs.formats.base import ArrayNode
from n5fs.testing.format_contract import FormatContract, RuleCase, doc, extent

#: how far a bomb inflates: megabytes from a few KiB, far past every chunk here
BOMB_BYTES = 1 << 23
DROP = object()


def changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``base`` with members set, or removed where the value is DROP."""
    out = json.loads(json.dumps(base))
    for key, value in changes.items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def case(rule: str, name: str, base: dict[str, Any], file: str = "", **changes: Any) -> RuleCase:
    return RuleCase(rule, doc(base), doc(changed(base, **changes)), name, file)


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


# --------------------------------------------------------------------------- zarr v3

LE = {"name": "bytes", "configuration": {"endian": "little"}}
BE = {"name": "bytes", "configuration": {"endian": "big"}}
GZIP = {"name": "gzip", "configuration": {"level": 5}}


def z3(
    shape: list[int],
    chunks: list[int],
    data_type: Any,
    codecs: list[Any],
    fill: Any = 0,
    **more: Any,
) -> dict[str, Any]:
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": {"a": 1},
        **more,
    }


def v2_keys(separator: str) -> dict[str, Any]:
    return {"name": "v2", "configuration": {"separator": separator}}


Z3 = z3([10, 7], [4, 3], "int16", [LE, GZIP], -1)
Z3_GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}
SHARDING = {
    "name": "sharding_indexed",
    "configuration": {
        "chunk_shape": [2, 3],
        "codecs": [LE, GZIP],
        "index_codecs": [LE, {"name": "crc32c"}],
        "index_location": "end",
    },
}


class TestZarr3(FormatContract):
    format_name = "zarr3"
    array_file = "zarr.json"
    arrays: ClassVar[dict[str, bytes]] = {
        "int16-gzip": doc(Z3),
        "float32-3d-v2keys-zstd-crc32c": doc(
            z3(
                [5, 3, 4],
                [2, 2, 3],
                "float32",
                [BE, {"name": "zstd", "configuration": {"level": 1}}, {"name": "crc32c"}],
                "NaN",
                chunk_key_encoding=v2_keys("."),
            )
        ),
        "uint8-1d-blosc-dot": doc(
            z3(
                [13],
                [5],
                "uint8",
                [
                    {"name": "bytes"},
                    {
                        "name": "blosc",
                        "configuration": {
                            "cname": "lz4",
                            "clevel": 5,
                            "shuffle": "shuffle",
                            "typesize": 1,
                            "blocksize": 0,
                        },
                    },
                ],
                chunk_key_encoding={"name": "default", "configuration": {"separator": "."}},
            )
        ),
        "bool-transpose": doc(
            z3(
                [3, 5],
                [2, 2],
                "bool",
                [{"name": "transpose", "configuration": {"order": [1, 0]}}, LE],
                False,
            )
        ),
        "uint64-v2keys-slash": doc(
            z3([7, 3], [3, 2], "uint64", [LE, GZIP], 7, chunk_key_encoding=v2_keys("/"))
        ),
        "complex64-1d": doc(z3([6], [4], "complex64", [LE], [1.0, "NaN"])),
        "string-vlen": doc(z3([5], [2], "string", [{"name": "vlen-utf8"}], "")),
        "sharded-int32": doc(z3([9, 7], [4, 6], "int32", [SHARDING], 3)),
        "scalar-float64": doc(z3([], [], "float64", [LE], 0.5)),
    }
    rule_cases: ClassVar[list[RuleCase]] = [
        RuleCase("json", doc(Z3), doc(Z3)[:-1], "truncated"),
        RuleCase(
            "json",
            doc(changed(Z3, data_type="float32", fill_value="NaN")),
            doc(changed(Z3, data_type="float32", fill_value="NaN")).replace(b'"NaN"', b"NaN"),
            "bare-nan",
        ),
        case("json-depth", "deep-attributes", Z3, attributes={"x": deep(200)}),
        case("zarr-format", "zarr-format-2", Z3, zarr_format=2),
        case("node-type", "node-type", Z3, node_type="dataset"),
        case("missing-key", "no-codecs", Z3, codecs=DROP),
        case("missing-key", "no-fill", Z3, fill_value=DROP),
        case("must-understand", "unknown-member", Z3, foo={"must_understand": True}),
        case("shape", "negative-shape", Z3, shape=[-1, 7]),
        case(
            "shape",
            "33-dims",
            changed(
                Z3,
                shape=[1] * 32,
                chunk_grid={"name": "regular", "configuration": {"chunk_shape": [1] * 32}},
            ),
            shape=[1] * 33,
        ),
        case(
            "chunk-shape",
            "chunk-shape-ndim",
            Z3,
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": [4]}},
        ),
        case(
            "chunk-grid",
            "rectilinear",
            Z3,
            chunk_grid={"name": "rectilinear", "configuration": {"chunk_shape": [4, 3]}},
        ),
        case(
            "chunk-key-encoding",
            "dash-separator",
            Z3,
            chunk_key_encoding={"name": "default", "configuration": {"separator": "-"}},
        ),
        case("data-type", "float128", Z3, data_type="float128"),
        case("fill-value", "fill-overflow", Z3, fill_value=40000),
        case("unknown-codec", "lz4", Z3, codecs=[LE, {"name": "lz4"}]),
        case("codec-order", "two-serializers", Z3, codecs=[LE, LE]),
        case(
            "codec-config",
            "gzip-level",
            Z3,
            codecs=[LE, {"name": "gzip", "configuration": {"level": 99}}],
        ),
        case("storage-transformer", "transformer", Z3, storage_transformers=[{"name": "x"}]),
        case("dimension-names", "dimension-names", Z3, dimension_names=["x"]),
        case("attributes", "attributes-list", Z3, attributes=[]),
        case(
            "consolidated-metadata",
            "consolidated-escape",
            changed(
                Z3_GROUP,
                consolidated_metadata={"kind": "inline", "metadata": {"a": Z3_GROUP}},
            ),
            consolidated_metadata={"kind": "inline", "metadata": {"../a": Z3_GROUP}},
        ),
    ]
    required_rules = frozenset(
        {
            "json",
            "zarr-format",
            "node-type",
            "missing-key",
            "must-understand",
            "shape",
            "chunk-shape",
            "chunk-grid",
            "chunk-key-encoding",
            "data-type",
            "fill-value",
            "unknown-codec",
            "codec-order",
            "codec-config",
            "storage-transformer",
            "dimension-names",
            "attributes",
            "consolidated-metadata",
        }
    )

    def bomb(self, name: str, node: ArrayNode) -> bytes | None:
        if name in ("int16-gzip", "uint64-v2keys-slash"):
            return gzip.compress(bytes(BOMB_BYTES))
        if name == "float32-3d-v2keys-zstd-crc32c":  # zstd, then crc32c over the stream
            stream = zstandard.ZstdCompressor().compress(bytes(BOMB_BYTES))
            return stream + google_crc32c.value(stream).to_bytes(4, "little")
        return None


# --------------------------------------------------------------------------- zarr v2

ZA = {
    "zarr_format": 2,
    "shape": [10, 7],
    "chunks": [4, 3],
    "dtype": "<i2",
    "compressor": {"id": "gzip", "level": 1},
    "fill_value": 0,
    "order": "C",
    "filters": None,
}
ZMETA = {"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}


def za(**changes: Any) -> bytes:
    return doc(changed(ZA, **changes))


V2_ARRAYS: dict[str, bytes] = {
    "i2-gzip": doc(ZA),
    "f8-big-zlib-F": za(
        shape=[5, 3, 4],
        chunks=[2, 2, 3],
        dtype=">f8",
        compressor={"id": "zlib", "level": 1},
        fill_value="NaN",
        order="F",
    ),
    "u1-1d-blosc": za(
        shape=[13],
        chunks=[5],
        dtype="|u1",
        compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    ),
    "b1-slash-raw": za(
        shape=[3, 5], chunks=[2, 2], dtype="|b1", compressor=None, dimension_separator="/"
    ),
    "i4-delta-zstd": za(
        shape=[7, 3],
        chunks=[3, 2],
        dtype="<i4",
        compressor={"id": "zstd", "level": 1},
        filters=[{"id": "delta", "dtype": "<i4"}],
        fill_value=5,
    ),
    "S3-lz4": za(shape=[6], chunks=[4], dtype="|S3", compressor={"id": "lz4"}, fill_value=""),
    "structured": za(
        shape=[5], chunks=[2], dtype=[["a", "<i4"], ["b", "<f4", [2]]], fill_value=None
    ),
    "scalar": za(shape=[], chunks=[], dtype="<f8", compressor=None, fill_value=1.5),
}
V2_CASES: list[RuleCase] = [
    RuleCase("json", doc(ZA), doc(ZA)[:-1], "truncated"),
    RuleCase("json-object", doc(ZA), b"[]", "array-document"),
    case("missing-key", "no-filters", ZA, filters=DROP),
    case("zarr-format", "zarr-format-3", ZA, zarr_format=3),
    case("shape", "negative-shape", ZA, shape=[-1, 7]),
    case("chunks", "zero-chunk", ZA, chunks=[0, 3]),
    case("shape-chunks-length", "chunks-ndim", ZA, chunks=[4]),
    case("dtype", "dtype-size", ZA, dtype="<i3"),
    case("fill-value", "fill-overflow", ZA, fill_value=40000),
    case("order", "order-x", ZA, order="X"),
    case("dimension-separator", "separator-dash", ZA, dimension_separator="-"),
    case("unknown-codec", "unknown-compressor", ZA, compressor={"id": "nope"}),
    case("codec-config", "compressor-no-id", ZA, compressor={"level": 1}),
    case("zgroup", "zgroup-extra", {"zarr_format": 2}, ".zgroup", extra=1),
    case("consolidated", "zmetadata-format", ZMETA, ".zmetadata", zarr_consolidated_format=2),
]
V2_REQUIRED = frozenset(c.rule for c in V2_CASES)


def v2_bomb(name: str) -> bytes | None:
    if name == "i2-gzip":
        return gzip.compress(bytes(BOMB_BYTES))
    if name == "f8-big-zlib-F":
        return zlib.compress(bytes(BOMB_BYTES))
    if name == "u1-1d-blosc":
        return bytes(numcodecs.Blosc(cname="lz4").encode(bytes(BOMB_BYTES)))
    return None


class TestZarr2(FormatContract):
    format_name = "zarr2"
    array_file = ".zarray"
    arrays = V2_ARRAYS
    rule_cases = V2_CASES
    required_rules = V2_REQUIRED

    def bomb(self, name: str, node: ArrayNode) -> bytes | None:
        return v2_bomb(name)


# --------------------------------------------------------------------------- hdmf-zarr

HDMF_ATTRS = {
    "namespace": "core",
    "neurodata_type": "Device",
    "zarr_link": [{"name": "x", "source": ".", "path": "/general/devices/a"}],
}
JSON_CODEC = numcodecs.JSON().get_config()


class TestHdmfZarr(FormatContract):
    format_name = "hdmf-zarr"
    array_file = ".zarray"
    arrays: ClassVar[dict[str, bytes]] = {
        **{k: V2_ARRAYS[k] for k in ("i2-gzip", "f8-big-zlib-F", "scalar")},
        "object-json": za(
            shape=[5],
            chunks=[2],
            dtype="|O",
            filters=[JSON_CODEC],
            compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
        ),
    }
    rule_cases: ClassVar[list[RuleCase]] = [
        *V2_CASES,
        case(
            "zarr-link",
            "link-name-slash",
            HDMF_ATTRS,
            ".zattrs",
            zarr_link=[{"name": "a/b", "source": ".", "path": "/x"}],
        ),
        case(
            "zarr-link",
            "link-escapes",
            HDMF_ATTRS,
            ".zattrs",
            zarr_link=[{"name": "x", "source": ".", "path": "/../x"}],
        ),
        case("zarr-dtype", "zarr-dtype-number", HDMF_ATTRS, ".zattrs", zarr_dtype=5),
        case("specloc", "specloc-root", HDMF_ATTRS, ".zattrs", **{".specloc": "/"}),
    ]
    required_rules = V2_REQUIRED | {"zarr-link", "zarr-dtype", "specloc"}

    def bomb(self, name: str, node: ArrayNode) -> bytes | None:
        return v2_bomb(name)


# --------------------------------------------------------------------------- N5

N5 = {
    "dimensions": [10, 7],
    "blockSize": [4, 3],
    "dataType": "int16",
    "compression": {"type": "gzip", "level": -1},
}


def n5(**changes: Any) -> bytes:
    return doc(changed(N5, **changes))


class TestN5(FormatContract):
    format_name = "n5"
    array_file = "attributes.json"
    arrays: ClassVar[dict[str, bytes]] = {
        "int16-gzip": doc(N5),
        "uint8-raw-3d": n5(
            dimensions=[5, 3, 4], blockSize=[2, 2, 3], dataType="uint8", compression={"type": "raw"}
        ),
        "float32-bzip2-1d": n5(
            dimensions=[13],
            blockSize=[5],
            dataType="float32",
            compression={"type": "bzip2", "blockSize": 9},
        ),
        "uint64-xz": n5(
            dimensions=[7, 3],
            blockSize=[3, 2],
            dataType="uint64",
            compression={"type": "xz", "preset": 1},
        ),
        "int32-zlib": n5(
            dimensions=[3, 5],
            blockSize=[2, 2],
            dataType="int32",
            compression={"type": "gzip", "useZlib": True, "level": 4},
        ),
        "float64-blosc": n5(
            dimensions=[6],
            blockSize=[4],
            dataType="float64",
            compression={"type": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 2},
        ),
        "int8-lz4": n5(
            dimensions=[9, 2], blockSize=[4, 2], dataType="int8", compression={"type": "lz4"}
        ),
    }
    rule_cases: ClassVar[list[RuleCase]] = [
        RuleCase("json", doc(N5), doc(N5)[:-1], "truncated"),
        RuleCase("json", doc(N5), b"[]", "array-document"),
        case("n5-version", "n5-version-5", {"n5": "4.0.0"}, n5="5.0.0"),
        case("dimensions", "negative-dimension", N5, dimensions=[-1, 7]),
        case("blockSize", "block-ndim", N5, blockSize=[4]),
        case("dataType", "float16", N5, dataType="float16"),
        case("dataset-keys", "no-compression", N5, compression=DROP),
        case("compression", "gzip-level", N5, compression={"type": "gzip", "level": 11}),
        case("unknown-compression", "jpeg", N5, compression={"type": "jpeg"}),
    ]
    required_rules = frozenset(
        {
            "json",
            "n5-version",
            "dimensions",
            "blockSize",
            "dataType",
            "dataset-keys",
            "compression",
            "unknown-compression",
        }
    )

    def bomb(self, name: str, node: ArrayNode) -> bytes | None:
        if name == "int16-gzip":
            return encode_header(extent(node, (0, 0))) + gzip.compress(bytes(BOMB_BYTES))
        return None
