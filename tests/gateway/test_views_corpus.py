"""Every array of the test corpora through every view reads what the source's own reader reads.

One corpus holds every array the view tests write with real writers (their builders, each in
a folder of its own: :data:`BUILDERS`) and the kinds only the unit tests write (here,
:func:`write_extra`): N5 by TensorStore and z5py with every compression they have, sparse;
Zarr v2 by zarr-python and TensorStore with every compressor, filters, C and F order, both
key separators, non-zero fills (NaN, +-inf, -1, -0.0), partly written; Zarr v3 by
zarr-python and TensorStore with every chunk key encoding, transposed, checksummed, sharded
(index at start and end, transposed before and inside ``sharding_indexed``, a codec after
it, absent shards and inner chunks), non-zero fills, 0-d arrays; and arrays of types no
view can show everywhere (bool, float16, complex, datetime, strings, records).

Each view (``--as zarr3|zarr2|n5|npy``) is copied out of the gateway file by file, as
``cp -r`` of a mount would, and every array it shows is read from the copy by each real
reader of that format: zarr-python 3 and TensorStore (zarr3; zarr), TensorStore and z5py
(n5), ``np.load(mmap_mode="r")`` (npy). Each must read the values the source's own reader
reads (zarr-python for Zarr, TensorStore's n5 driver or z5py for N5), NaN equal to NaN and
the sign of -0.0 kept, in that reader's axis order (N5 and Zarr list axes reversed). A test
is one (view, reader, array): a failure names all three.

What a view leaves out is what ``n5fs detect --as FMT --json`` says it leaves out, exactly
the arrays and reasons of :data:`LEFT_OUT` (types the format has not, 0-d arrays in N5): a
new hole fails. A file of a view that cannot be read whole, or not at the size listed, fails
the tests of its array. A reader that cannot read an array whatever the view does
(TensorStore reads no Zarr v2 filters, no N5 lz4) is listed in :data:`READER_LIMITS` with
what it says, and must say it of the source too. Known holes of the views are
:data:`HOLES`, strict xfails: fixing one makes its tests fail until it is taken out.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import z5py
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

from n5fs.cli.main import main
from n5fs.views.base import View
from tests.gateway import test_views, test_views_n5, test_views_n5_attributes, test_views_n5_fill
from tests.gateway.test_views import view_of, walk
from tests.writers import tensorstore_n5

VIEWS = ("zarr3", "zarr2", "n5", "npy")


@contextmanager
def _quiet() -> Iterator[None]:
    """Writers' and readers' own warnings (v2 dtypes, codecs after sharding) are not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# == the corpus ===================================================================================


def values_for(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    """Values that vary within every chunk, never 0 (z5py stores no block of zeros)."""
    n = np.arange(1, int(np.prod(shape)) + 1).reshape(shape)
    kind = np.dtype(dtype).kind
    if kind == "f":
        return (n * 0.75 - 40.125).astype(dtype)  # negatives, never -0.0
    if kind == "u":
        return (n * 13 % 239 + 1).astype(dtype)
    return (n * 13 % 119 + 1).astype(dtype)


def specials(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    """Float values with NaN, +-inf, -0.0 and +0.0 stored among them."""
    values = values_for(shape, dtype).ravel()
    values[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    return values.reshape(shape)


def _v2(group: Any, name: str, shape: tuple[int, ...], dtype: str, **kwargs: Any) -> Any:
    return group.create_array(name, shape=shape, dtype=dtype, **kwargs)


def write_extra(root: Path) -> None:
    """The kinds only the unit tests write (tests/unit: formats, codecs, sharding, z5py),
    and NaN, +-inf, -0.0 stored among the values and as fill values."""
    g2 = zarr.open_group(str(root / "v2"), mode="w", zarr_format=2)
    slash = {"chunk_key_encoding": {"name": "v2", "separator": "/"}}
    a = _v2(g2, "i4_zlib", (9, 7), "<i4", chunks=(4, 3), compressors=numcodecs.Zlib(level=3))
    a[...] = values_for((9, 7), "i4")
    a = _v2(g2, "f8_nan_delta_blosc", (11, 6), "<f8", chunks=(4, 4), fill_value=np.nan,
            filters=[numcodecs.Delta(dtype="<f8")],
            compressors=numcodecs.Blosc(cname="lz4", clevel=3, shuffle=1))  # fmt: skip
    a[0:4, 0:4] = values_for((4, 4), "f8")
    a[8:11, 4:6] = values_for((3, 2), "f8")  # part of the end chunk
    a = _v2(g2, "f8_F_slash_zstd", (7, 5, 3), ">f8", chunks=(3, 2, 2), order="F",
            compressors=numcodecs.Zstd(level=1), **slash)  # fmt: skip
    a[...] = specials((7, 5, 3), "f8")
    a = _v2(g2, "u4_lz4", (9,), "<u4", chunks=(4,), compressors=numcodecs.LZ4())
    a[...] = values_for((9,), "u4")
    a = _v2(g2, "i8_bz2", (9,), "<i8", chunks=(4,), compressors=numcodecs.BZ2())
    a[...] = values_for((9,), "i8") - 60
    a = _v2(g2, "f8_lzma", (9,), "<f8", chunks=(4,), compressors=numcodecs.LZMA())
    a[...] = values_for((9,), "f8")
    a = _v2(g2, "f8_shuffle_F_slash", (3, 4, 5), "<f8", chunks=(2, 3, 2), order="F",
            filters=[numcodecs.Shuffle(elementsize=8)], **slash)  # fmt: skip
    a[...] = values_for((3, 4, 5), "f8")
    a = _v2(g2, "f4_nan_slash", (5, 3), "<f4", chunks=(2, 2), fill_value=np.nan, **slash)
    a[0:2, :] = values_for((2, 3), "f4")
    a = _v2(g2, "i8_big_raw", (5,), ">i8", chunks=(2,), compressors=None)
    a[...] = values_for((5,), "i8")
    a = _v2(g2, "f4_inf_fill", (6, 5), ">f4", chunks=(4, 2), fill_value=np.inf,
            compressors=numcodecs.GZip(level=1))  # fmt: skip
    a[4:6, 0:2] = values_for((2, 2), "f4")
    a = _v2(g2, "f8_neg_zero_fill", (6,), "<f8", chunks=(4,), fill_value=-0.0)
    a[0:2] = values_for((2,), "f8")
    a = _v2(g2, "u1_blosc_3d", (5, 6, 7), "|u1", chunks=(2, 4, 3),
            compressors=numcodecs.Blosc(cname="zstd"))  # fmt: skip
    a[...] = values_for((5, 6, 7), "u1")
    a = _v2(g2, "i2_minus_F", (7, 4), "<i2", chunks=(3, 3), order="F", fill_value=-1)
    a[3:6, :] = values_for((3, 4), "i2")
    _v2(g2, "scalar_f8", (), "<f8", chunks=(), fill_value=-np.inf)[...] = 3.5
    _v2(g2, "bool", (9,), "|b1", chunks=(4,), fill_value=True)[...] = np.arange(9) % 2 == 0
    _v2(g2, "complex", (5,), "<c16", chunks=(2,))[...] = np.arange(5) * (1 + 2j)
    _v2(g2, "datetime", (5,), "<M8[ns]", chunks=(2,), fill_value=np.datetime64("NaT"))[...] = (
        np.arange(5).astype("<M8[D]").astype("<M8[ns]")
    )
    _v2(g2, "bytes_S3", (4,), "|S3", chunks=(2,))[...] = np.array([b"a", b"bb", b"ccc", b""])
    _v2(g2, "unicode_U3", (4,), "<U3", chunks=(2,))[...] = np.array(["a", "bé", "c", "dd"])
    tensorstore_zarr2(root / "ts2")
    write_extra_v3(root / "v3")
    tensorstore_zarr3_extra(root / "ts3")
    write_extra_n5(root / "n5")


def tensorstore_zarr2(root: Path) -> None:
    """TensorStore's zarr (v2) driver: its defaults (blosc, fill null), F order with "/" keys
    and a NaN fill, zstd; a little-endian 3-D array."""
    arrays: dict[str, tuple[tuple[int, ...], str, dict[str, Any], tuple[slice, ...] | None]] = {
        "u2_defaults": ((5, 7), "<u2", {"chunks": [2, 3]}, None),
        "f4_F_slash_nan_zlib": (
            (5, 7),
            "<f4",
            {
                "chunks": [2, 3],
                "order": "F",
                "dimension_separator": "/",
                "fill_value": "NaN",
                "compressor": {"id": "zlib", "level": 3},
            },
            (slice(0, 2), slice(3, 7)),
        ),
        "i4_zstd_partial": (
            (9, 8),
            "<i4",
            {"chunks": [4, 4], "compressor": {"id": "zstd", "level": 1}, "fill_value": -7},
            (slice(4, 9), slice(0, 4)),
        ),
    }
    for name, (shape, dtype, metadata, region) in arrays.items():
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": str(root / name)},
            "metadata": {"shape": list(shape), "dtype": dtype, **metadata},
        }
        store = ts.open(spec, create=True).result()
        values = values_for(shape, dtype)
        if region is None:
            store.write(values).result()
        else:
            store[region].write(values[region]).result()


def write_extra_v3(root: Path) -> None:
    """zarr-python 3, Zarr v3: every chunk key encoding, transposes, checksums, blosc
    shuffles, shards with a transpose inside and checksummed, NaN/inf/-1 fills."""
    g3 = zarr.open_group(str(root), mode="w", zarr_format=3)
    grid = (10, 7)

    def array(name: str, dtype: str, fill: Any = 0, **kwargs: Any) -> Any:
        kwargs.setdefault("chunks", (4, 3))
        return g3.create_array(name, shape=grid, dtype=dtype, fill_value=fill, **kwargs)

    array("default_f4_nan", "<f4", np.nan)[0:4, 0:3] = values_for((4, 3), "f4")
    dot = {"name": "default", "separator": "."}
    array("i2_default_dot", "<i2", -1, chunk_key_encoding=dot)[...] = values_for(grid, "i2")
    v2_dot = {"name": "v2", "separator": "."}
    array("u4_v2_dot", "<u4", 5, chunk_key_encoding=v2_dot)[...] = values_for(grid, "u4")
    v2_slash = {"name": "v2", "separator": "/"}
    array("i1_v2_slash", "i1", chunk_key_encoding=v2_slash)[...] = values_for(grid, "i1")
    big_t = {"serializer": BytesCodec(endian="big"), "filters": [TransposeCodec(order=(1, 0))]}
    array("u8_big_transpose", "uint64", **big_t)[...] = values_for(grid, "u8") * 2**40
    crc = [GzipCodec(level=2), Crc32cCodec()]
    array("f8_gzip_crc32c", "<f8", compressors=crc)[...] = specials(grid, "f8")
    lz4 = BloscCodec(cname="lz4", shuffle="shuffle")
    array("i4_blosc_lz4_shuffle", "<i4", compressors=[lz4])[...] = values_for(grid, "i4")
    bit = BloscCodec(cname="lz4", shuffle="bitshuffle")
    array("f4_blosc_bitshuffle", "<f4", compressors=[bit])[...] = values_for(grid, "f4")
    noshuffle = BloscCodec(cname="zstd", shuffle="noshuffle")
    array("u1_blosc_noshuffle", "u1", compressors=[noshuffle])[...] = values_for(grid, "u1")
    transposed = array("f4_transpose_nan", "<f4", np.nan, filters=[TransposeCodec(order=(1, 0))])
    transposed[4:10, 0:3] = specials((6, 3), "f4")
    g3.create_array(
        "i2_transpose_3d", shape=(5, 4, 6), chunks=(2, 3, 4), dtype="<i2", fill_value=-5,
        filters=[TransposeCodec(order=(1, 2, 0))],
    )[0:4, :, 2:6] = values_for((4, 4, 4), "i2")  # fmt: skip
    array("f4_inf_fill", ">f4", np.inf, serializer=BytesCodec(endian="big"))[4:8, 3:6] = 1.5
    array(
        "sharded_i2_transpose_big_zstd",
        "<i2",
        -1,
        chunks=(2, 3),
        shards=(4, 6),
        compressors=[ZstdCodec(level=1, checksum=True)],
        **big_t,
    )[...] = values_for(grid, "i2")
    nan_shards = array(
        "sharded_f4_nan_crc32c", "<f4", np.nan, chunks=(2, 2), shards=(4, 4), compressors=crc
    )
    nan_shards[0:2, 0:2] = values_for((2, 2), "f4")  # one inner chunk of one shard
    nan_shards[8:10, 4:7] = specials((2, 3), "f4")
    with _quiet():
        after = array(
            "sharded_crc32c_after",
            "<u2",
            9,
            chunks=(4, 6),
            serializer=ShardingCodec(chunk_shape=(2, 3)),
            compressors=[Crc32cCodec()],
        )
    after[0:4, 0:6] = values_for((4, 6), "u2")
    g3.create_array("scalar_i8", shape=(), dtype="<i8", fill_value=0)[...] = -2
    v2_scalar = g3.create_array(
        "scalar_v2_key", shape=(), dtype="<f8", fill_value=0.0, chunk_key_encoding=v2_dot
    )
    v2_scalar[...] = 2.5
    array("neg_zero_fill", "<f8", -0.0)[0:4, 0:3] = values_for((4, 3), "f8")
    array("f2_nan", "<f2", np.nan, chunks=(5, 5))[...] = values_for(grid, "f2")
    array("datetime", "<M8[s]", np.datetime64("NaT"))[...] = np.datetime64("2024-01-02")


def tensorstore_zarr3_extra(root: Path) -> None:
    """TensorStore zarr3: shards with their index at the start and at the end, a transpose
    inside sharding_indexed, a non-zero fill, partly written; a plain array with a crc32c."""

    def sharded(location: str, inner: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [4, 3],
                "codecs": inner,
                "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
                "index_location": location,
            },
        }

    le = {"name": "bytes", "configuration": {"endian": "little"}}
    gzip = {"name": "gzip", "configuration": {"level": 1}}
    transpose = {"name": "transpose", "configuration": {"order": [1, 0]}}
    arrays: dict[str, tuple[str, Any, list[dict[str, Any]], list[int]]] = {
        "sharded_start_u2_fill7": ("uint16", 7, [sharded("start", [le, gzip])], [8, 6]),
        "sharded_end_u2_fill7": ("uint16", 7, [sharded("end", [le, gzip])], [8, 6]),
        "sharded_end_transpose_f4": (
            "float32",
            "NaN",
            [sharded("end", [transpose, le, gzip])],
            [8, 6],
        ),
        "i4_crc32c_minus": ("int32", -1, [le, {"name": "crc32c"}], [4, 3]),
    }
    shape = (10, 7)
    for name, (dtype, fill, codecs, grid) in arrays.items():
        store = ts.open(
            {
                "driver": "zarr3",
                "kvstore": {"driver": "file", "path": str(root / name)},
                "metadata": {
                    "shape": list(shape),
                    "data_type": dtype,
                    "fill_value": fill,
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
                    "codecs": codecs,
                },
            },
            create=True,
        ).result()
        values = values_for(shape, dtype)
        store[0:4, 0:6].write(values[0:4, 0:6]).result()  # two units of shard (0, 0)
        store[8:10, 6:7].write(values[8:10, 6:7]).result()  # an end shard's corner


def write_extra_n5(root: Path) -> None:
    """N5 of the types the view tests leave out: float32 with NaN, +-inf, -0.0 stored (by
    TensorStore), z5py's uint32, int32, uint8, uint64, float32; a sparse z5py lz4 dataset."""
    tensorstore_n5(root / "ts/f4_specials", specials((6, 5), "f4"), [4, 2], {"type": "gzip"})
    tensorstore_n5(root / "ts/u1_partial_end", values_for((7, 3), "u1"), [4, 4], {"type": "zstd"})
    f = z5py.File(str(root / "z5"), mode="w")
    for dtype, compression in (
        ("uint32", "gzip"),
        ("int32", "zstd"),
        ("uint8", "raw"),
        ("uint64", "blosc"),
        ("float32", "lz4"),
    ):
        ds = f.create_dataset(dtype, shape=(7, 5), chunks=(3, 2), dtype=dtype,
                              compression=compression)  # fmt: skip
        ds[...] = values_for((7, 5), dtype)
    sparse = f.create_dataset(
        "sparse_lz4", shape=(9, 10), chunks=(3, 4), dtype="uint32", compression="lz4"
    )
    sparse[0:3, 4:8] = values_for((3, 4), "uint32")
    sparse[6:9, 8:10] = values_for((3, 2), "uint32")


#: every array :func:`write_extra` writes
EXTRA = [
    *(
        f"v2/{name}"
        for name in (
            "i4_zlib", "f8_nan_delta_blosc", "f8_F_slash_zstd", "u4_lz4", "i8_bz2", "f8_lzma",
            "f8_shuffle_F_slash", "f4_nan_slash", "i8_big_raw", "f4_inf_fill",
            "f8_neg_zero_fill", "u1_blosc_3d", "i2_minus_F", "scalar_f8", "bool", "complex",
            "datetime", "bytes_S3", "unicode_U3",
        )
    ),
    "ts2/u2_defaults",
    "ts2/f4_F_slash_nan_zlib",
    "ts2/i4_zstd_partial",
    *(
        f"v3/{name}"
        for name in (
            "default_f4_nan", "i2_default_dot", "u4_v2_dot", "i1_v2_slash", "u8_big_transpose",
            "f8_gzip_crc32c", "i4_blosc_lz4_shuffle", "f4_blosc_bitshuffle",
            "u1_blosc_noshuffle", "f4_transpose_nan", "i2_transpose_3d", "f4_inf_fill",
            "sharded_i2_transpose_big_zstd", "sharded_f4_nan_crc32c", "sharded_crc32c_after", "scalar_i8", "scalar_v2_key",
            "neg_zero_fill", "f2_nan", "datetime",
        )
    ),
    "ts3/sharded_start_u2_fill7",
    "ts3/sharded_end_u2_fill7",
    "ts3/sharded_end_transpose_f4",
    "ts3/i4_crc32c_minus",
    "n5/ts/f4_specials",
    "n5/ts/u1_partial_end",
    *(f"n5/z5/{name}" for name in ("uint32", "int32", "uint8", "uint64", "float32", "sparse_lz4")),
]  # fmt: skip

#: the arrays test_views.write_sources writes
VIEWS_ARRAYS = [
    *test_views.n5_names(),
    *("v3/sharded", "v3/sparse_sharded", "v3/plain", "v3/group/crc"),
    *("v2/c_order", "v2/f_order", "v2/delta_zlib", "v2/strings"),
]
#: folder of the corpus -> (its builder, the arrays it writes)
BUILDERS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "views": (test_views.write_sources, VIEWS_ARRAYS),
    "n5view": (test_views_n5.write_sources, [*test_views_n5.SHOWN, *test_views_n5.LEFT_OUT]),
    "fill": (test_views_n5_fill.write_sources, test_views_n5_fill.FILLED),
    "transposed": (
        test_views._write_transposed_shards,
        [*test_views.TRANSPOSED, "before_sparse"],
    ),
    "attrs": (test_views_n5_attributes.write_sources, list(test_views_n5_attributes.ARRAYS)),
    "extra": (write_extra, EXTRA),
}
#: every array of the corpus
ARRAYS = sorted(f"{folder}/{name}" for folder, (_, names) in BUILDERS.items() for name in names)

#: view -> array -> why the view leaves it out (``n5fs detect --as VIEW --json``)
OBJECTS = "its values are Python objects (variable-length), not fixed-size numbers"
LEFT_OUT: dict[str, dict[str, str]] = {
    "zarr3": {
        "views/v2/strings": OBJECTS,
        "n5view/v2/strings": OBJECTS,
        "n5view/v2/record": "data type |V8 has no Zarr v3 type every reader reads",
        "extra/v2/datetime": "data type <M8[ns] has no Zarr v3 type every reader reads",
        "extra/v2/bytes_S3": "data type |S3 has no Zarr v3 type every reader reads",
        "extra/v2/unicode_U3": "data type <U3 has no Zarr v3 type every reader reads",
    },
    "zarr2": {"extra/v3/datetime": "data type <M8[s] has no Zarr v2 type every reader reads"},
    "n5": {
        "views/v2/strings": OBJECTS,
        "n5view/v2/strings": OBJECTS,
        "n5view/v2/record": "data type |V8 has no N5 dataType",
        "n5view/v3/flags": "data type |b1 has no N5 dataType",
        "n5view/v3/cplx": "data type <c8 has no N5 dataType",
        "n5view/v3/half": "data type <f2 has no N5 dataType",
        "extra/v2/bool": "data type |b1 has no N5 dataType",
        "extra/v2/complex": "data type <c16 has no N5 dataType",
        "extra/v2/datetime": "data type <M8[ns] has no N5 dataType",
        "extra/v2/bytes_S3": "data type |S3 has no N5 dataType",
        "extra/v2/unicode_U3": "data type <U3 has no N5 dataType",
        "extra/v3/datetime": "data type <M8[s] has no N5 dataType",
        "extra/v3/f2_nan": "data type <f2 has no N5 dataType",
        "extra/v2/scalar_f8": "N5 has no 0-d datasets",
        "extra/v3/scalar_i8": "N5 has no 0-d datasets",
        "extra/v3/scalar_v2_key": "N5 has no 0-d datasets",
    },
    "npy": {"views/v2/strings": OBJECTS, "n5view/v2/strings": OBJECTS},
}

#: view -> the readers of its format
READERS: dict[str, tuple[str, ...]] = {
    "zarr3": ("zarr-python", "tensorstore"),
    "zarr2": ("zarr-python", "tensorstore"),
    "n5": ("tensorstore", "z5py"),
    "npy": ("numpy",),
}
#: (view, reader) -> array -> what that reader says reading it (a regular expression): each
#: is an array the view shows as stored, and the reader says so of the source itself too
_LZ4 = '"lz4" is not registered'
_Z5_BLOSC = 'extra members: "nthreads"'  # z5py's blosc compression member
_FILTERS = "filters are not supported"
_AFTER_SHARDING = "not compatible with subsequent bytes -> bytes codecs"
_OBJECTS = r'Unsupported zarr dtype: "\|O"'
READER_LIMITS: dict[tuple[str, str], dict[str, str]] = {
    ("zarr3", "tensorstore"): {
        "extra/v3/datetime": "numpy.datetime64 data type is not one of the supported",
        "extra/v3/sharded_crc32c_after": _AFTER_SHARDING,
        "fill/v3/whole_shard": _AFTER_SHARDING,
        "fill/v3/whole_shard_zero": _AFTER_SHARDING,
        "transposed/before_then_zstd": _AFTER_SHARDING,
    },
    ("zarr2", "tensorstore"): {
        "extra/v2/f8_nan_delta_blosc": _FILTERS,
        "extra/v2/f8_shuffle_F_slash": _FILTERS,
        "n5view/v2/delta": _FILTERS,
        "views/v2/delta_zlib": _FILTERS,
        "extra/v2/f8_lzma": '"lzma" is not registered',
        "extra/v2/u4_lz4": _LZ4,
        "extra/v2/bytes_S3": "Expected 3 base64-encoded bytes",  # zarr-python's fill ""
        "extra/v2/datetime": 'Unsupported zarr dtype: "<M8',
        "extra/v2/unicode_U3": 'Unsupported zarr dtype: "<U3"',
        "n5view/v2/record": 'Must specify a "field"',
        "n5view/v2/strings": _OBJECTS,
        "views/v2/strings": _OBJECTS,
    },
    ("n5", "tensorstore"): {
        **{f"views/n5/z5/lz4/{rank}d": _LZ4 for rank in test_views.SHAPES},
        **{f"views/n5/z5/blosc/{rank}d": _Z5_BLOSC for rank in test_views.SHAPES},
        "extra/n5/z5/float32": _LZ4,
        "extra/n5/z5/sparse_lz4": _LZ4,
        "extra/n5/z5/uint64": _Z5_BLOSC,
    },
}

#: (view, array) -> a hole: what each reader of the view reads wrong, and the suspected cause
#: (none known; a hole found goes here as a strict xfail until it is fixed)
HOLES: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus") / "src"
    with _quiet():
        for folder, (build, _) in BUILDERS.items():
            build(root / folder)
    return root


class Copies:
    """Each view copied out of a fresh gateway once, on first use: ``cp -r`` of the view, every
    file read whole, its size the one listed. A file that fails (an error, a size other than
    ``stat`` claimed) is recorded, not raised: the tests of its array name it."""

    def __init__(self, root: Path, dest: Path) -> None:
        self.root, self.dest = root, dest
        self._done: dict[str, Path] = {}
        #: view -> view path of a file -> what went wrong copying it
        self.failed: dict[str, dict[str, str]] = {}

    def __getitem__(self, view: str) -> Path:
        if view not in self._done:
            self.failed[view] = copy_view(view_of(self.root, view)[0], self.dest / view)
            self._done[view] = self.dest / view
        return self._done[view]

    def failures(self, view: str, path: str) -> dict[str, str]:
        """The files of array ``path`` (its folder, or its ``.npy``) that failed."""
        self[view]
        top = f"/{path}"
        return {
            file: why
            for file, why in self.failed[view].items()
            if file.startswith((f"{top}/", f"{top}.npy"))
        }


def copy_view(view: View, dest: Path) -> dict[str, str]:
    """Copy every file of ``view`` to ``dest``; the files that failed, and why."""
    failed: dict[str, str] = {}
    for path, attr in walk(view).items():
        try:
            data = view.read_file(path)
        except Exception as exc:  # noqa: BLE001 (reported by the array's tests)
            failed[path] = f"{type(exc).__name__}: {exc}"
            continue
        if not len(data) == attr.size == view.stat(path).size:
            failed[path] = f"read {len(data)} bytes, listed {attr.size}"
        target = dest / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return failed


@pytest.fixture(scope="module")
def copies(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Copies:
    return Copies(corpus, tmp_path_factory.mktemp("corpus-copies"))


class Natives:
    """Each array as the source's own reader reads it, in Zarr axis order (N5's reversed):
    zarr-python for Zarr, TensorStore's n5 driver for N5 (z5py where TensorStore reads no
    such N5: lz4, z5's blosc)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._read: dict[str, np.ndarray[Any, Any]] = {}

    def __getitem__(self, path: str) -> np.ndarray[Any, Any]:
        if path not in self._read:
            self._read[path] = self._native(path)
        return self._read[path]

    def _native(self, path: str) -> np.ndarray[Any, Any]:
        where = self.root / path
        if (where / "attributes.json").exists():
            spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(where)}}
            try:
                return np.asarray(ts.open(spec).result().read().result()).T
            except ValueError:
                parent, name = where.parent, where.name
                while not (parent / "attributes.json").exists() or _is_dataset(parent):
                    parent, name = parent.parent, f"{parent.name}/{name}"
                return np.asarray(z5py.File(str(parent), mode="r")[name][...])
        with _quiet():
            return np.asarray(zarr.open_array(str(where), mode="r")[...])


def _is_dataset(folder: Path) -> bool:
    return "dimensions" in json.loads((folder / "attributes.json").read_text())


@pytest.fixture(scope="module")
def natives(corpus: Path) -> Natives:
    return Natives(corpus)


# == readers of each view's format ================================================================


def _tensorstore(driver: str) -> Callable[[Path, str], np.ndarray[Any, Any]]:
    def read(copy: Path, path: str) -> np.ndarray[Any, Any]:
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(copy / path)}}
        return np.asarray(ts.open(spec).result().read().result())

    return read


def _zarr_python(version: int) -> Callable[[Path, str], np.ndarray[Any, Any]]:
    def read(copy: Path, path: str) -> np.ndarray[Any, Any]:
        with _quiet():
            array = zarr.open_array(str(copy / path), mode="r", zarr_format=version)  # type: ignore[arg-type]
            return np.asarray(array[...])

    return read


def _z5py(copy: Path, path: str) -> np.ndarray[Any, Any]:
    return np.asarray(z5py.File(str(copy), mode="r", use_zarr_format=False)[path][...])


def _numpy(copy: Path, path: str) -> np.ndarray[Any, Any]:
    return np.load(copy / f"{path}.npy", mmap_mode="r")


#: (view, reader) -> (read(copy, array), whether it reads N5 order: the Zarr axes reversed)
READ: dict[tuple[str, str], tuple[Callable[[Path, str], np.ndarray[Any, Any]], bool]] = {
    ("zarr3", "zarr-python"): (_zarr_python(3), False),
    ("zarr3", "tensorstore"): (_tensorstore("zarr3"), False),
    ("zarr2", "zarr-python"): (_zarr_python(2), False),
    ("zarr2", "tensorstore"): (_tensorstore("zarr"), False),
    ("n5", "tensorstore"): (_tensorstore("n5"), True),
    ("n5", "z5py"): (_z5py, False),
    ("npy", "numpy"): (_numpy, False),
}


def assert_same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    """The same shape, type (byte order aside) and values; NaN equal to NaN, -0.0 not 0.0."""
    assert got.shape == want.shape
    assert _unswapped(got.dtype) == _unswapped(want.dtype), (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)  # NaN (and NaT) equal themselves here
    if want.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _unswapped(dtype: np.dtype[Any]) -> np.dtype[Any]:
    try:
        return dtype.newbyteorder("=")
    except TypeError:  # numpy's new-style types (strings) have no byte order
        return dtype


# == the tests ====================================================================================


def cases() -> Iterator[Any]:
    for view, readers in READERS.items():
        for reader in readers:
            for path in ARRAYS:
                if path in LEFT_OUT[view]:
                    continue
                hole = HOLES.get((view, path))
                marks = [] if hole is None else [pytest.mark.xfail(strict=True, reason=hole)]
                yield pytest.param(view, reader, path, id=f"{view}-{reader}-{path}", marks=marks)


@pytest.mark.parametrize(("view", "reader", "path"), list(cases()))
def test_every_shown_array_reads_the_native_values(
    copies: Copies, natives: Natives, view: str, reader: str, path: str
) -> None:
    read, n5_order = READ[view, reader]
    copy = copies[view]
    assert copies.failures(view, path) == {}
    limit = READER_LIMITS.get((view, reader), {}).get(path)
    if limit is not None:  # the reader's own limit: it fails on the source just the same
        for where in (copy, copies.root):
            with pytest.raises(ValueError, match=limit):
                read(where, path)
        return
    want = natives[path]
    got = read(copy, path)
    assert_same(got, want.T if n5_order else want)


@pytest.mark.parametrize("view", VIEWS)
def test_detect_leaves_out_exactly_the_known_arrays(
    corpus: Path, view: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``detect --as VIEW`` names every array of the corpus, shown or left out, and leaves
    out exactly :data:`LEFT_OUT`, each for its reason."""
    assert main(["detect", str(corpus), "--as", view, "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    arrays = {
        n["path"].removesuffix(".npy"): n
        for n in nodes
        if n["kind"] in ("array", "file", "left out")
    }
    assert sorted(arrays) == ARRAYS
    left_out = {path: n["reason"] for path, n in arrays.items() if n["kind"] == "left out"}
    assert left_out == LEFT_OUT[view]


@pytest.mark.parametrize("view", VIEWS)
def test_every_file_of_the_view_reads_whole(copies: Copies, view: str) -> None:
    copies[view]
    assert copies.failed[view] == {}


@pytest.mark.parametrize("view", VIEWS)
def test_the_copy_holds_every_shown_array_and_no_left_out_one(copies: Copies, view: str) -> None:
    copy = copies[view]
    suffix = ".npy" if view == "npy" else ""
    for path in ARRAYS:
        present = (copy / f"{path}{suffix}").exists()
        assert present == (path not in LEFT_OUT[view]), path
