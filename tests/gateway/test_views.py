"""Views (``--as zarr3|zarr2|npy``) at the gateway: real writers write the store, the view is
copied out file by file (as ``cp -r`` of a mount would), and real readers read the copy.

Writers: TensorStore (N5 with every compression it has, sharded Zarr v3), z5py (N5 with
every compression it has, lz4 and clipped end blocks included), zarr-python (Zarr v2 with F
order, filters and zlib; Zarr v3). Readers: zarr-python 3 and TensorStore's zarr/zarr3
drivers, ``np.load(mmap_mode="r")``. Expected values are what TensorStore's own driver for
the source format reads, N5 transposed. Counting stores prove that sizes and listings come
from metadata and listings alone, and that reads fetch only what they touch.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import z5py
import zarr
import zstandard

from n5fs.cli.config import parse_config
from n5fs.cli.main import main
from n5fs.errors import InvalidSource, ReadOnly, errno_of
from n5fs.fuse_front.options import parse_options
from n5fs.gateway import EntryKind, Gateway, GatewayConfig
from n5fs.kvstore import open_store
from n5fs.kvstore.base import ByteRange
from n5fs.testing.doubles import CountingStore
from n5fs.views import open_view
from n5fs.views.base import View
from n5fs.views.npy import c_boxes
from n5fs.views.stored import GZIP, ZLIB, ZSTD, blosc_frame
from tests.writers import ramp, tensorstore_n5, tensorstore_zarr3

#: TensorStore's N5 compressions: name -> compression object
TS_COMPRESSIONS: dict[str, dict[str, Any]] = {
    "raw": {"type": "raw"},
    "gzip": {"type": "gzip", "level": 5},
    "zlib": {"type": "gzip", "useZlib": True},
    "bzip2": {"type": "bzip2", "blockSize": 3},
    "xz": {"type": "xz", "preset": 1},
    "blosc": {"type": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2},
    "zstd": {"type": "zstd", "level": 3},
}
#: z5py's N5 compressions: name -> (compression, options)
Z5_COMPRESSIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "raw": ("raw", {}),
    "gzip": ("gzip", {}),
    "bzip2": ("bzip2", {}),
    "xz": ("xz", {}),
    "lz4": ("lz4", {}),
    "blosc": ("blosc", {}),
    "zstd": ("zstd", {}),
}
#: rank -> (shape, block, dtype), numpy order; no shape is a multiple of its block
SHAPES: dict[int, tuple[tuple[int, ...], tuple[int, ...], str]] = {
    1: ((13,), (4,), "int8"),
    2: ((7, 5), (3, 2), "uint16"),
    3: ((9, 10, 7), (4, 4, 3), "float64"),
    4: ((3, 4, 5, 2), (2, 3, 2, 2), "int64"),
}
SPARSE = "n5/ts/sparse"


def values_for(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    """Distinct, never-zero values (z5 skips blocks that hold only zeros)."""
    n = np.arange(1, int(np.prod(shape)) + 1).reshape(shape)
    if dtype == "int8":
        return ((n % 120) + 1).astype(dtype)
    if dtype.startswith("float"):
        return (n * 0.5 - 1000.25).astype(dtype)
    return (n * 37 + 1).astype(dtype)


def n5_names() -> list[str]:
    ts_names = [f"n5/ts/{c}/{r}d" for c in TS_COMPRESSIONS for r in SHAPES]
    z5_names = [f"n5/z5/{c}/{r}d" for c in Z5_COMPRESSIONS for r in SHAPES]
    return [*ts_names, *z5_names, SPARSE]


def write_sources(root: Path) -> None:
    """Every N5 dataset of :func:`n5_names`, plus Zarr arrays of both versions."""
    for comp, config in TS_COMPRESSIONS.items():
        for rank, (shape, block, dtype) in SHAPES.items():
            tensorstore_n5(
                root / f"n5/ts/{comp}/{rank}d", values_for(shape, dtype), list(block), config
            )
    sparse = ts.open(
        {
            "driver": "n5",
            "kvstore": {"driver": "file", "path": str(root / SPARSE)},
            "metadata": {
                "dimensions": [40, 30],
                "blockSize": [8, 8],
                "dataType": "uint32",
                "compression": {"type": "gzip"},
            },
        },
        create=True,
    ).result()
    sparse[8:16, 16:24].write(np.full((8, 8), 7, dtype="uint32")).result()
    sparse[35:40, 25:30].write(np.full((5, 5), 9, dtype="uint32")).result()
    f = z5py.File(str(root / "n5/z5"), mode="w")
    f.attrs["title"] = "written by z5py"
    for comp, (compression, options) in Z5_COMPRESSIONS.items():
        for rank, (shape, block, dtype) in SHAPES.items():
            ds = f.create_dataset(
                f"{comp}/{rank}d",
                shape=shape,
                chunks=block,
                dtype=dtype,
                compression=compression,
                **options,
            )
            ds[...] = values_for(shape, dtype)
            ds.attrs["resolution"] = [4] * rank
    write_zarr_sources(root)


def write_zarr_sources(root: Path) -> None:
    tensorstore_zarr3(root / "v3/sharded", ramp((21, 18)), [4, 3], shard=[8, 6])
    sparse = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(root / "v3/sparse_sharded")},
            "metadata": {
                "shape": [16, 16],
                "data_type": "int16",
                "fill_value": -1,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [4, 4],
                            "codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "zstd", "configuration": {"level": 1}},
                            ],
                            "index_codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "crc32c"},
                            ],
                        },
                    }
                ],
            },
        },
        create=True,
    ).result()
    sparse[0:4, 4:8].write(np.full((4, 4), 5, dtype="int16")).result()
    sparse[12:16, 12:16].write(np.full((4, 4), 6, dtype="int16")).result()
    tensorstore_zarr3(root / "v3/plain", ramp((11, 9), "float32"), [4, 4])
    g2 = zarr.open_group(str(root / "v2"), mode="w", zarr_format=2)
    g2.attrs["about"] = "zarr-python v2"
    a = g2.create_array(
        "c_order",
        shape=(10, 7),
        chunks=(4, 3),
        dtype="<i4",
        compressors=numcodecs.GZip(level=3),
        fill_value=-3,
    )
    a[...] = ramp((10, 7), "int32")
    a = g2.create_array(
        "f_order",
        shape=(9, 6),
        chunks=(4, 4),
        dtype=">f8",
        order="F",
        compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1),
    )
    a[...] = ramp((9, 6), "float64")
    a = g2.create_array(
        "delta_zlib",
        shape=(12,),
        chunks=(5,),
        dtype="uint16",
        filters=[numcodecs.Delta(dtype="uint16")],
        compressors=numcodecs.Zlib(level=1),
    )
    a[...] = ramp((12,), "uint16")
    a = g2.create_array("strings", shape=(3,), chunks=(2,), dtype=str)
    a[...] = np.array(["a", "bc", "def"])
    g3 = zarr.open_group(str(root / "v3/group"), mode="w", zarr_format=3)
    g3.attrs["about"] = "zarr-python v3"
    a = g3.create_array(
        "crc",
        shape=(6, 5),
        chunks=(4, 4),
        dtype="uint8",
        compressors=zarr.codecs.ZstdCodec(level=1, checksum=True),
    )
    a[...] = ramp((6, 5), "uint8")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("views") / "src"
    write_sources(root)
    return root


def expected(root: Path, path: str) -> np.ndarray[Any, Any]:
    """What a view shows: the source format's own reading, N5 transposed (N5 lists the
    fastest axis first)."""
    if path.startswith("n5/z5/"):
        try:
            values = native(root, path)
        except ValueError:  # TensorStore reads neither N5 lz4 nor z5's blosc ("nthreads")
            return np.asarray(z5py.File(str(root / "n5/z5"), mode="r")[path[6:]][...])
        return values.T
    values = native(root, path)
    return values.T if path.startswith("n5/") else values


def native(root: Path, path: str) -> np.ndarray[Any, Any]:
    """What the source's own reader reads: TensorStore's n5 driver, zarr-python for Zarr
    (TensorStore reads no v2 filters)."""
    if not path.startswith("n5/"):
        return np.asarray(zarr.open_array(str(root / path), mode="r")[...])
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(root / path)}}
    return np.asarray(ts.open(spec).result().read().result())


def gets(store: CountingStore) -> list[tuple[str, ByteRange | None]]:
    """Every ``get`` (key, range) so far; probes through ``get_many`` are not among them."""
    return [(call.key, call.byte_range) for call in store.calls_of("get")]


def view_of(root: Path, fmt: str) -> tuple[View, CountingStore]:
    store = CountingStore(open_store(str(root)))
    return open_view(Gateway(store, GatewayConfig(read_only=True)), fmt), store


def walk(view: View, path: str = "/") -> dict[str, Any]:
    """Every file of the view: path -> Attr, by readdir alone (as ``ls -lR``)."""
    out: dict[str, Any] = {}
    for name, attr in view.readdir(path):
        child = f"{path.rstrip('/')}/{name}"
        if attr.kind is EntryKind.DIR:
            out.update(walk(view, child))
        else:
            out[child] = attr
    return out


def copy_out(view: View, dest: Path) -> dict[str, Any]:
    """``cp -r`` of the view: every file read whole; its size must be the one listed."""
    shutil.rmtree(dest, ignore_errors=True)
    files = walk(view)
    for path, attr in files.items():
        data = view.read_file(path)
        assert len(data) == attr.size == view.stat(path).size, path
        target = dest / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return files


@pytest.fixture(scope="module", params=["zarr3", "zarr2"])
def zarr_copy(
    request: pytest.FixtureRequest, source: Path, tmp_path_factory: pytest.TempPathFactory
):
    view, _ = view_of(source, request.param)
    dest = tmp_path_factory.mktemp(f"copy-{request.param}")
    copy_out(view, dest)
    return request.param, dest


# == N5 as Zarr ===================================================================================


def test_every_n5_dataset_reads_through_the_zarr_views(source: Path, zarr_copy) -> None:
    fmt, copy = zarr_copy
    driver = "zarr3" if fmt == "zarr3" else "zarr"
    for name in n5_names():
        want = expected(source, name)
        by_zarr = zarr.open_array(str(copy / name), mode="r", zarr_format=int(fmt[-1]))
        np.testing.assert_array_equal(by_zarr[...], want, err_msg=f"zarr-python {name}")
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(copy / name)}}
        by_ts = ts.open(spec).result()
        np.testing.assert_array_equal(by_ts.read().result(), want, err_msg=f"TS {name}")


def test_z5py_values_are_the_views_values(source: Path, zarr_copy) -> None:
    """z5py's numpy order is the view's: no transposition between them."""
    fmt, copy = zarr_copy
    for comp in Z5_COMPRESSIONS:
        for rank, (shape, _, dtype) in SHAPES.items():
            name = f"n5/z5/{comp}/{rank}d"
            got = zarr.open_array(str(copy / name), mode="r", zarr_format=int(fmt[-1]))
            np.testing.assert_array_equal(got[...], values_for(shape, dtype))


def test_metadata_attributes_and_codecs(source: Path, zarr_copy) -> None:
    fmt, copy = zarr_copy
    if fmt == "zarr3":
        meta = json.loads((copy / "n5/z5/gzip/3d/zarr.json").read_text())
        assert meta["shape"] == [9, 10, 7]
        assert meta["data_type"] == "float64"
        assert meta["codecs"][0] == {"name": "bytes", "configuration": {"endian": "big"}}
        assert meta["codecs"][1]["name"] == "gzip"
        assert meta["attributes"] == {"resolution": [4, 4, 4]}
        group = json.loads((copy / "n5/z5/zarr.json").read_text())
        assert group == {
            "zarr_format": 3,
            "node_type": "group",
            "attributes": {"title": "written by z5py"},
        }
        assert json.loads((copy / "n5/ts/bzip2/2d/zarr.json").read_text())["codecs"][1:] == []
    else:
        meta = json.loads((copy / "n5/ts/zlib/2d/.zarray").read_text())
        assert meta["compressor"] == {"id": "zlib", "level": 6}
        assert meta["dtype"] == ">u2"
        assert meta["shape"] == [5, 7]
        assert json.loads((copy / "n5/z5/gzip/3d/.zattrs").read_text()) == {"resolution": [4] * 3}
    assert not list(copy.rglob("attributes.json"))  # N5 metadata is replaced, never shown


def test_sparse_dataset_shows_only_its_blocks(source: Path, zarr_copy) -> None:
    _, copy = zarr_copy
    chunks = sorted(p.name for p in (copy / SPARSE).iterdir() if not p.name.startswith((".", "z")))
    assert chunks == ["2.1", "3.4"]  # N5 blocks 1/2 and 4/3, reversed


def test_sizes_and_listings_read_no_chunk(source: Path) -> None:
    """Listing the whole view and stat-ing every file costs listings and metadata probes:
    not one chunk is read (a sharded array seen as v2: each shard's index, once)."""
    for fmt in ("zarr3", "zarr2", "npy"):
        view, store = view_of(source, fmt)
        files = walk(view)
        for path in files:
            view.stat(path)
        assert files
        indexes = [(k, r) for k, r in gets(store) if "sharded/" in k and r is not None]
        assert gets(store) == indexes, (fmt, gets(store)[:5])
        assert all(r.length == 4 * 16 + 4 for _, r in indexes)  # 2 x 2 entries + crc32c
        shards = [p for p in source.glob("v3/*sharded/c/*/*") if p.is_file()]
        assert len(indexes) == len({k for k, _ in indexes})
        assert len(indexes) == (len(shards) if fmt == "zarr2" else 0)
        assert len(shards) == 11


def test_a_view_chunk_costs_one_get(source: Path) -> None:
    view, store = view_of(source, "zarr3")
    for name, chunk in (
        ("n5/ts/gzip/3d", "1.2.0"),
        ("n5/z5/lz4/3d", "2.2.1"),
        ("n5/ts/zstd/2d", "1.2"),
    ):
        store.clear()
        data = view.read_file(f"/{name}/{chunk}")
        source_key = f"{name}/{'/'.join(reversed(chunk.split('.')))}"
        assert gets(store) == [(source_key, None)]
        assert data
        store.clear()
        assert view.read_file(f"/{name}/{chunk}") == data
        assert gets(store) == []  # the second open is served from the byte cache


def test_kept_payloads_are_the_stored_bytes(source: Path) -> None:
    """An interior block of a codec both formats share is the N5 block minus its header."""
    view, _ = view_of(source, "zarr3")
    stored = (source / "n5/ts/gzip/3d/0/0/0").read_bytes()
    assert view.read_file("/n5/ts/gzip/3d/0.0.0") == stored[4 + 4 * 3 :]


# == Zarr v3 <-> Zarr v2 ==========================================================================


def test_sharded_v3_reads_as_zarr2_inner_chunks(source: Path, zarr_copy) -> None:
    fmt, copy = zarr_copy
    if fmt != "zarr2":
        assert (copy / "v3/sharded/zarr.json").read_bytes() == (
            source / "v3/sharded/zarr.json"
        ).read_bytes()
        return
    for name in ("v3/sharded", "v3/sparse_sharded"):
        got = zarr.open_array(str(copy / name), mode="r", zarr_format=2)
        np.testing.assert_array_equal(got[...], native(source, name))
        meta = json.loads((copy / name / ".zarray").read_text())
        assert meta["chunks"] == ([4, 3] if name == "v3/sharded" else [4, 4])
    present = sorted(p.name for p in (copy / "v3/sparse_sharded").iterdir() if p.name[0] != ".")
    assert present == ["0.1", "3.3"]  # absent inner chunks are absent
    assert json.loads((copy / "v3/sparse_sharded/.zarray").read_text())["fill_value"] == -1


#: (inner chunk shape, transpose order, where the transpose goes, codecs after sharding) of
#: sharded arrays zarr-python 3 writes with a transposition, each of shape TRANSPOSED_SHAPE in
#: shards of TRANSPOSED_SHARD; an inner chunk shape is in the transposed shard's axes when the
#: transpose precedes sharding_indexed
TRANSPOSED_SHAPE, TRANSPOSED_SHARD = (8, 8, 24), (4, 8, 12)
TRANSPOSED: dict[str, tuple[tuple[int, ...], tuple[int, ...], str, bool]] = {
    "before": ((2, 4, 1), (2, 0, 1), "before", False),
    "before_reversed": ((4, 4, 2), (2, 1, 0), "before", False),
    "before_then_zstd": ((2, 4, 1), (2, 0, 1), "before", True),
    "inside": ((2, 4, 6), (1, 2, 0), "inside", False),
    "inside_reversed": ((2, 4, 6), (2, 1, 0), "inside", False),
}


def _write_transposed_shards(root: Path) -> None:
    values = ramp(TRANSPOSED_SHAPE, "int16") - 100
    for name, (inner, order, where, compressed) in TRANSPOSED.items():
        transpose = zarr.codecs.TransposeCodec(order=order)
        if where == "before":
            serializer = zarr.codecs.ShardingCodec(
                chunk_shape=inner, codecs=[zarr.codecs.BytesCodec(), zarr.codecs.GzipCodec()]
            )
            layout: dict[str, Any] = {"chunks": TRANSPOSED_SHARD, "serializer": serializer}
        else:
            layout = {"chunks": inner, "shards": TRANSPOSED_SHARD}
        array = zarr.create_array(
            store=str(root / name),
            shape=TRANSPOSED_SHAPE,
            dtype="int16",
            fill_value=-1,
            filters=[transpose],
            compressors=zarr.codecs.ZstdCodec(level=1) if compressed else None,
            **layout,
        )
        array[...] = values
    sparse = zarr.create_array(
        store=str(root / "before_sparse"),
        shape=TRANSPOSED_SHAPE,
        dtype="int16",
        fill_value=-1,
        chunks=TRANSPOSED_SHARD,
        serializer=zarr.codecs.ShardingCodec(chunk_shape=(2, 4, 1)),
        filters=[zarr.codecs.TransposeCodec(order=(2, 0, 1))],
        compressors=None,
    )
    sparse[0:4, 0:1, 0:2] = 5  # one inner chunk: (4, 1, 2) in the array's axes
    sparse[4:8, 7:8, 22:24] = 6


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")
def test_transposed_shards_read_as_zarr2(tmp_path: Path, capsys) -> None:
    """Sharded arrays with a transpose before sharding_indexed or inside it, as zarr-python 3
    writes them, read through the Zarr v2 view by zarr-python's v2 reader as zarr-python 3
    reads them natively: each inner chunk a v2 chunk in the array's axes (C order where the
    transposition is no reversal, decoded; F order, stored bytes, where it is), each whole
    shard a chunk where a codec after sharding_indexed wraps the shard."""
    root = tmp_path / "src"
    _write_transposed_shards(root)
    view, _ = view_of(root, "zarr2")
    copy = tmp_path / "copy"
    copy_out(view, copy)
    shown = {
        "before": ([4, 1, 2], "C", None),
        "before_reversed": ([2, 4, 4], "F", {"id": "gzip", "level": 5}),
        "before_then_zstd": ([4, 8, 12], "C", None),
        "inside": ([2, 4, 6], "C", None),
        "inside_reversed": ([2, 4, 6], "F", None),
        "before_sparse": ([4, 1, 2], "C", None),
    }
    for name, (chunks, order, compressor) in shown.items():
        want = np.asarray(zarr.open_array(str(root / name), mode="r")[...])
        got = zarr.open(str(copy / name), mode="r", zarr_format=2)
        assert isinstance(got, zarr.Array)
        np.testing.assert_array_equal(got[...], want, err_msg=name)
        meta = json.loads((copy / name / ".zarray").read_text())
        assert (meta["chunks"], meta["order"], meta["compressor"]) == (chunks, order, compressor)
        assert meta["shape"] == list(TRANSPOSED_SHAPE)
    values = ramp(TRANSPOSED_SHAPE, "int16") - 100
    np.testing.assert_array_equal(zarr.open_array(str(copy / "before"), mode="r")[...], values)
    present = sorted(p.name for p in (copy / "before_sparse").iterdir() if p.name[0] != ".")
    assert present == ["0.0.0", "1.7.11"]  # absent inner chunks are absent
    # one inner chunk read in a fresh view: two ranged GETs of its shard, index and chunk
    fresh, store = view_of(root, "zarr2")
    assert fresh.read_file("/before/1.7.11") == (copy / "before/1.7.11").read_bytes()
    gets = store.calls_of("get")
    assert [call.keys for call in gets] == [("before/c/1/0/1",)] * 2
    assert all(call.byte_range is not None for call in gets)
    assert main(["detect", str(root), "--as", "zarr2", "--json"]) == 0
    nodes = {n["path"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert nodes["before"]["chunks"] == [4, 1, 2]
    assert "transposed before sharding_indexed" in nodes["before"]["codecs"]
    assert "transcoded" in nodes["before"]["codecs"]
    assert nodes["before_reversed"]["codecs"] == "gzip"
    assert "every shard is decoded" in nodes["before_then_zstd"]["codecs"]
    assert all(n["kind"] == "array" for n in nodes.values() if n["path"])


def test_zarr_arrays_convert_between_versions(source: Path, zarr_copy) -> None:
    fmt, copy = zarr_copy
    other = (
        ["v2/c_order", "v2/f_order", "v2/delta_zlib"]
        if fmt == "zarr3"
        else ["v3/plain", "v3/group/crc"]
    )
    driver = "zarr3" if fmt == "zarr3" else "zarr"
    for name in other:
        want = native(source, name)
        got = zarr.open_array(str(copy / name), mode="r", zarr_format=int(fmt[-1]))
        np.testing.assert_array_equal(got[...], want, err_msg=name)
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(copy / name)}}
        np.testing.assert_array_equal(ts.open(spec).result().read().result(), want)
    if fmt == "zarr3":
        meta = json.loads((copy / "v2/f_order/zarr.json").read_text())
        assert meta["codecs"][0] == {"name": "transpose", "configuration": {"order": [1, 0]}}
        assert meta["fill_value"] == 0.0
        assert json.loads((copy / "v2/c_order/zarr.json").read_text())["fill_value"] == -3
        assert not (copy / "v2/strings").exists()  # left out: no fixed-size values
        assert json.loads((copy / "v2/zarr.json").read_text())["attributes"] == {
            "about": "zarr-python v2"
        }


def test_identity_chunks_are_served_natively(source: Path) -> None:
    """A v2 chunk seen as v3 keeps its key and bytes: the gateway serves the stored file."""
    view, _ = view_of(source, "zarr3")
    entry = view.tree.entry("v2/c_order/1.1")
    assert entry is not None
    assert entry.native
    assert view.read_file("/v2/c_order/1.1") == (source / "v2/c_order/1.1").read_bytes()


# == npy ==========================================================================================


def test_npy_files_load_with_mmap(source: Path, tmp_path: Path) -> None:
    view, _ = view_of(source, "npy")
    copy_out(view, tmp_path)
    names = [*n5_names(), "v3/sharded", "v3/sparse_sharded", "v3/plain", "v2/c_order", "v2/f_order"]
    for name in names:
        loaded = np.load(tmp_path / f"{name}.npy", mmap_mode="r")
        np.testing.assert_array_equal(loaded, expected(source, name), err_msg=name)
    attrs = json.loads((tmp_path / "n5/z5/gzip/2d.json").read_text())
    assert attrs == {"resolution": [4, 4]}
    assert not (tmp_path / "v2/strings.npy").exists()
    assert not (tmp_path / "n5/z5/attributes.json").exists()


def test_npy_reads_fetch_only_the_chunks_they_touch(tmp_path: Path) -> None:
    root = tmp_path / "src"
    values = ramp((64, 48), "uint16")
    tensorstore_n5(root / "a", values, [8, 8], {"type": "gzip"})
    view, store = view_of(root, "npy")
    fh = view.open("/a.npy", os.O_RDONLY)
    header = view.read(fh, 128, 0)
    offset = header.index(b"\n") + 1  # numpy pads the header with spaces to its newline
    store.clear()
    # the view is 48 x 64 (reversed); rows 17..22, off by a byte, lie in view chunk row 2
    start = 17 * 64 * 2 + 1
    data = view.read(fh, 5 * 64 * 2 + 3, offset + start)
    assert data == values.T.astype(">u2").tobytes()[start : start + 5 * 64 * 2 + 3]
    fetched = sorted(key for key, _ in gets(store))
    assert fetched == sorted(f"a/{x}/2" for x in range(8))  # N5 blocks (x, 2): one chunk row
    view.release(fh)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)])
def test_c_boxes_cover_every_range_contiguously(shape: tuple[int, ...]) -> None:
    total = int(np.prod(shape))
    flat = np.arange(total).reshape(shape)
    for first, stop in itertools.combinations(range(total + 1), 2):
        covered = []
        for start, (lo, hi) in c_boxes(shape, first, stop):
            box = flat[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))].ravel()
            assert box[0] == start
            assert list(box) == list(range(start, start + box.size))
            covered += list(box)
        assert covered == list(range(first, stop))
        assert len(list(c_boxes(shape, first, stop))) <= 2 * len(shape) - 1


# == frames of known size =========================================================================


@pytest.mark.parametrize("size", [1, 4096, 65_535, 65_536, 200_000])
def test_stored_frames_decode_and_have_the_stated_size(size: int) -> None:
    data = os.urandom(size)
    decoders = {
        GZIP: lambda b: numcodecs.GZip().decode(b),
        ZLIB: zlib.decompress,
        ZSTD: zstandard.ZstdDecompressor().decompress,
        blosc_frame(8): lambda b: numcodecs.Blosc().decode(b),
    }
    for frame, decode in decoders.items():
        encoded = frame.encode(data)
        assert len(encoded) == frame.size(size), frame.name
        assert bytes(decode(encoded)) == data, frame.name


# == read-only, options, detect --as =============================================================


def test_every_change_is_refused_with_erofs(source: Path) -> None:
    view, _ = view_of(source, "zarr3")
    calls = [
        lambda: view.open("/n5/ts/gzip/2d/zarr.json", os.O_RDWR),
        lambda: view.open("/v2/c_order/1.1", os.O_WRONLY | os.O_TRUNC),
        lambda: view.create("/new", os.O_WRONLY),
        lambda: view.unlink("/n5/ts/gzip/2d/0.0"),
        lambda: view.mkdir("/d"),
        lambda: view.rmdir("/n5"),
        lambda: view.rename("/n5", "/m"),
        lambda: view.truncate("/v2/c_order/1.1", 0),
        lambda: view.symlink("x", "/l"),
        lambda: view.link("/v2/c_order/1.1", "/l"),
        lambda: view.utimens("/n5", 0.0),
    ]
    for call in calls:
        with pytest.raises(ReadOnly) as caught:
            call()
        assert errno_of(caught.value) == errno.EROFS
    assert view.read_only


def test_as_option_config_and_flag() -> None:
    assert parse_options(["ro,as=zarr3"]).view == "zarr3"
    assert parse_options([]).view == "native"
    with pytest.raises(InvalidSource, match="hdf5"):
        parse_options(["as=hdf5"])
    config = parse_config({"as": "npy", "source": "/data"})
    assert config.view == "npy"
    assert "as=npy" in config.option_groups()


def test_detect_as_prints_the_view(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detect", str(source), "--as", "zarr3", "--json"]) == 0
    nodes = {n["path"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    gzip3 = nodes["n5/ts/gzip/3d"]
    assert (gzip3["format"], gzip3["shape"], gzip3["chunks"]) == ("zarr3", [7, 10, 9], [3, 4, 4])
    assert "transcoded" in nodes["n5/ts/xz/2d"]["codecs"]
    assert nodes["v2/strings"]["kind"] == "left out"
    assert main(["detect", str(source), "--as", "npy"]) == 0
    text = capsys.readouterr().out
    assert "n5/ts/raw/2d.npy" in text
    assert "left out" in text


# == edges: implicit N5 groups, 0-d arrays, varlength blocks ======================================


def test_implicit_n5_groups_and_0d_arrays(tmp_path: Path) -> None:
    root = tmp_path / "src"
    z5py.File(str(root / "n5"), mode="w").attrs["note"] = "root"
    deep = values_for((5, 3), "uint16")  # TensorStore writes no group attributes above it
    tensorstore_n5(root / "n5/deep/inner/ds", deep, [2, 2], {"type": "raw"})
    zarr.create_array(str(root / "v2s"), shape=(), dtype="float32", zarr_format=2)[...] = 3.25
    zarr.create_array(str(root / "v3s"), shape=(), dtype="int16", zarr_format=3)[...] = 7
    for fmt in ("zarr3", "zarr2"):
        view, _ = view_of(root, fmt)
        copy = tmp_path / fmt
        copy_out(view, copy)
        version = int(fmt[-1])
        assert (
            zarr.open_group(str(copy / "n5"), mode="r", zarr_format=version).attrs["note"] == "root"
        )
        inner = zarr.open_group(str(copy / "n5/deep/inner"), mode="r", zarr_format=version)
        np.testing.assert_array_equal(inner["ds"][...], deep.T)
        scalar = "v2s" if fmt == "zarr3" else "v3s"
        got = zarr.open_array(str(copy / scalar), mode="r", zarr_format=version)[...]
        assert got == (3.25 if scalar == "v2s" else 7)
    view, _ = view_of(root, "npy")
    assert view.read_file("/v3s.npy")[-2:] == np.int16(7).tobytes()
    assert {name for name, _ in view.readdir("/n5/deep/inner")} == {"ds.npy", "ds.json"}


def test_a_varlength_n5_block_is_served_decoded_around_the_page_cache(tmp_path: Path) -> None:
    """N5 Java writes varlength mode for blocks whose count differs from their dims; one
    whose count fills them is valid, and its header is 4 bytes longer than the listed size
    assumed: the view serves it decoded and tells the kernel to read around its pages."""
    from n5fs.codecs.n5_header import encode_header
    from n5fs.gateway.read.reader import PageCache

    root = tmp_path / "src"
    values = values_for((3, 4), "uint16")  # TensorStore: N5 dimensions [3, 4]; the view 4 x 3
    tensorstore_n5(root / "ds", values, [2, 2], {"type": "gzip"})
    block = values[0:2, 0:2].astype(">u2").tobytes(order="F")  # N5 payload: first axis fastest
    gz = zlib.compressobj(6, zlib.DEFLATED, 31)
    (root / "ds/0/0").write_bytes(
        encode_header([2, 2], num_elements=4) + gz.compress(block) + gz.flush()
    )
    view, _ = view_of(root, "zarr3")
    fh = view.open("/ds/0.0", os.O_RDONLY)
    assert view.page_cache(fh) is PageCache.BYPASS
    data = view.read(fh, 1 << 20, 0)
    view.release(fh)
    assert bytes(numcodecs.GZip().decode(data)) == values.T[0:2, 0:2].astype(">u2").tobytes()
    npy, _ = view_of(root, "npy")
    tail = npy.read_file("/ds.npy")[-values.nbytes :]
    assert np.frombuffer(tail, ">u2").reshape(4, 3).tolist() == values.T.tolist()


def test_parallel_reads_of_one_chunk_decode_it_once(tmp_path: Path) -> None:
    """The kernel reads a file in parallel pieces: four readers of one chunk, whose GET is
    slow, share one GET and one decode."""
    import threading
    import time

    root = tmp_path / "src"
    tensorstore_n5(root / "ds", ramp((64, 64)), [64, 64], {"type": "gzip"})

    store = CountingStore(open_store(str(root)))
    store.hook("get", lambda call: time.sleep(0.2))  # a slow GET
    view = open_view(Gateway(store, GatewayConfig(read_only=True)), "npy")
    handles = [view.open("/ds.npy", os.O_RDONLY) for _ in range(4)]
    start = threading.Barrier(4)
    pieces: list[bytes] = []

    def read(fh: int) -> None:
        start.wait()
        pieces.append(view.read(fh, 4096, 2048))

    threads = [threading.Thread(target=read, args=(fh,)) for fh in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(pieces)) == 1
    assert gets(store) == [("ds/0/0", None)]
    assert view.stats()["decoded"] == 1
