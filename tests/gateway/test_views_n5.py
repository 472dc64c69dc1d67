"""``--as n5`` at the gateway level: Zarr arrays written by zarr-python and TensorStore, read
as N5 by TensorStore's n5 driver and z5py from a copy of the view.

Each array is copied out of the view by listings and whole-file reads (each file's bytes must
have the size ``stat`` claimed), and the N5 readers must read the Zarr values transposed (N5
lists the fastest axis first). Kept blocks are the stored bytes behind an N5 header; end
blocks are clipped; little-endian arrays are transcoded; what N5 cannot express is left out
and ``detect --as n5`` says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import z5py
import zarr

from n5fs.cli.main import main
from n5fs.codecs.n5_header import decode_header
from n5fs.views import parse_view
from tests.gateway.test_views import copy_out, gets, view_of, walk
from tests.writers import ramp, tensorstore_zarr3

BIG = zarr.codecs.BytesCodec(endian="big")


def values_for(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    """Distinct, never-zero values."""
    n = np.arange(1, int(np.prod(shape)) + 1).reshape(shape)
    if np.dtype(dtype).kind == "f":
        return (n * 0.5 - 100.25).astype(dtype)
    return (n * 7 % 251 + 1).astype(dtype)


def ts_sharded_big(path: Path) -> None:
    """TensorStore zarr3, big-endian blosc inner chunks, 3-D, odd shape, sparse shards."""
    store = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "shape": [9, 10, 7],
                "data_type": "uint32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [6, 4, 4]}},
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [3, 2, 4],
                            "codecs": [
                                {"name": "bytes", "configuration": {"endian": "big"}},
                                {
                                    "name": "blosc",
                                    "configuration": {
                                        "cname": "lz4",
                                        "clevel": 5,
                                        "shuffle": "shuffle",
                                        "typesize": 4,
                                        "blocksize": 0,
                                    },
                                },
                            ],
                        },
                    }
                ],
            },
        },
        create=True,
    ).result()
    store[0:6, 0:8, :].write(values_for((6, 8, 7), "uint32")).result()
    store[6:9, 8:10, 4:7].write(values_for((3, 2, 3), "uint32")).result()


def ts_zarr2_big(path: Path) -> None:
    """TensorStore's zarr (v2) driver: big-endian, zstd."""
    store = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "shape": [11, 5],
                "chunks": [4, 3],
                "dtype": ">i2",
                "compressor": {"id": "zstd", "level": 3},
            },
        },
        create=True,
    ).result()
    store.write(values_for((11, 5), "int16")).result()


def write_sources(root: Path) -> None:
    g3 = zarr.open_group(str(root / "v3"), mode="w", zarr_format=3)
    g3.attrs["about"] = "zarr-python v3"
    a = g3.create_array(
        "big_gzip", shape=(9, 10, 7), chunks=(4, 4, 3), dtype=">f8", serializer=BIG,
        compressors=zarr.codecs.GzipCodec(level=4),
    )  # fmt: skip
    a[...] = values_for((9, 10, 7), "float64")
    a.attrs["dimensions"] = "kept aside: an N5 dataset key"
    a.attrs["resolution"] = [1, 2, 3]
    a = g3.create_array(
        "little_zstd", shape=(13,), chunks=(4,), dtype="<u2",
        compressors=zarr.codecs.ZstdCodec(level=1),
    )  # fmt: skip
    a[...] = values_for((13,), "uint16")
    a = g3.create_array("sparse", shape=(40, 30), chunks=(8, 8), dtype=">i4", serializer=BIG)
    a[8:16, 16:24] = 7
    a[35:40, 25:30] = 9
    g3.create_array("crc_big", shape=(6, 5), chunks=(4, 4), dtype=">u4", serializer=BIG,
                    compressors=zarr.codecs.ZstdCodec(level=1, checksum=True))[...] = ramp(
        (6, 5), "uint32")  # fmt: skip
    sharded = g3.create_array(
        "sharded_zp", shape=(10, 9), chunks=(3, 4), shards=(6, 8), dtype="int8",
        compressors=zarr.codecs.GzipCodec(level=1),
    )  # fmt: skip
    sharded[...] = values_for((10, 9), "int8")
    for name, dtype in (("flags", "bool"), ("cplx", "complex64"), ("half", "float16")):
        g3.create_array(name, shape=(4,), chunks=(2,), dtype=dtype)[...] = np.ones(4, dtype)
    g3.create_array("minus", shape=(4,), chunks=(2,), dtype="int32", fill_value=-1)
    g2 = zarr.open_group(str(root / "v2"), mode="w", zarr_format=2)
    a = g2.create_array("zlib_big", shape=(10, 7), chunks=(4, 3), dtype=">u4",
                        compressors=numcodecs.Zlib(level=3))  # fmt: skip
    a[...] = values_for((10, 7), "uint32")
    a = g2.create_array("blosc_big", shape=(17,), chunks=(5,), dtype=">i8",
                        compressors=numcodecs.Blosc(cname="zstd", clevel=3, shuffle=2))  # fmt: skip
    a[...] = values_for((17,), "int64")
    a = g2.create_array("f_order", shape=(9, 6), chunks=(4, 4), dtype=">f4", order="F",
                        compressors=numcodecs.GZip(level=1))  # fmt: skip
    a[...] = values_for((9, 6), "float32")
    a = g2.create_array("delta", shape=(12,), chunks=(5,), dtype=">u2",
                        filters=[numcodecs.Delta(dtype=">u2")])  # fmt: skip
    a[...] = values_for((12,), "uint16")
    g2.create_array("strings", shape=(3,), chunks=(2,), dtype=str)[...] = np.array(["a", "bc", "d"])
    record = np.dtype([("a", "<i4"), ("b", "<f4")])
    g2.create_array("record", shape=(3,), chunks=(2,), dtype=record)
    tensorstore_zarr3(root / "ts/sharded", ramp((21, 18)), [4, 3], shard=[8, 6])
    ts_sharded_big(root / "ts/sharded_big")
    ts_zarr2_big(root / "ts/zarr2_big")


SHOWN = [
    "v3/big_gzip",
    "v3/little_zstd",
    "v3/sparse",
    "v3/crc_big",
    "v3/sharded_zp",
    "v2/zlib_big",
    "v2/blosc_big",
    "v2/f_order",
    "v2/delta",
    "ts/sharded",
    "ts/sharded_big",
    "ts/zarr2_big",
    "v3/minus",  # fill -1, no chunk stored: every block a fill block
]
LEFT_OUT = {
    "v3/flags": "data type",
    "v3/cplx": "data type",
    "v3/half": "data type",
    "v2/strings": "",
    "v2/record": "data type",
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("n5view") / "src"
    write_sources(root)
    return root


@pytest.fixture(scope="module")
def copy(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    view, _ = view_of(source, "n5")
    dest = tmp_path_factory.mktemp("n5copy")
    copy_out(view, dest)
    return dest


def zarr_values(root: Path, path: str) -> np.ndarray[Any, Any]:
    if path.startswith("ts/sharded"):
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / path)}}
        return np.asarray(ts.open(spec).result().read().result())
    return np.asarray(zarr.open_array(str(root / path), mode="r")[...])


@pytest.mark.parametrize("path", SHOWN)
def test_tensorstore_n5_reads_every_zarr_array_transposed(
    source: Path, copy: Path, path: str
) -> None:
    want = zarr_values(source, path).T
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(copy / path)}}
    got = ts.open(spec).result().read().result()
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype.newbyteorder("=")


@pytest.mark.parametrize("path", SHOWN)
def test_z5py_reads_every_zarr_array_transposed(source: Path, copy: Path, path: str) -> None:
    f = z5py.File(str(copy), mode="r", use_zarr_format=False)
    got = f[path][...]
    np.testing.assert_array_equal(got, zarr_values(source, path))  # z5py: C order of N5 dims
    # reversed, i.e. the Zarr array's own axes


def test_root_groups_and_attributes(copy: Path) -> None:
    root = json.loads((copy / "attributes.json").read_text())
    assert root["n5"] == "4.0.0"
    assert json.loads((copy / "v3/attributes.json").read_text()) == {"about": "zarr-python v3"}
    doc = json.loads((copy / "v3/big_gzip/attributes.json").read_text())
    assert (doc["dimensions"], doc["blockSize"]) == ([7, 10, 9], [3, 4, 4])
    assert (doc["dataType"], doc["resolution"]) == ("float64", [3, 2, 1])  # N5's axis order
    assert doc["zarr_attributes"] == {"dimensions": "kept aside: an N5 dataset key"}
    assert doc["compression"] == {"type": "gzip", "level": 4, "useZlib": False}
    zlib_doc = json.loads((copy / "v2/zlib_big/attributes.json").read_text())
    assert zlib_doc["compression"] == {"type": "gzip", "level": 3, "useZlib": True}
    assert json.loads((copy / "v3/little_zstd/attributes.json").read_text())["compression"] == {
        "type": "raw"
    }
    for name in ("zarr.json", ".zarray", ".zgroup", ".zattrs", "c"):
        assert not list(copy.rglob(name)), name
    for path in LEFT_OUT:
        assert not (copy / path).exists(), path


def test_kept_blocks_are_header_and_stored_bytes(source: Path, copy: Path) -> None:
    # interior block (0,0,0) of a big-endian gzip v3 array: the stored chunk behind a header
    block = (copy / "v3/big_gzip/0/0/0").read_bytes()
    stored = (source / "v3/big_gzip/c/0/0/0").read_bytes()
    assert block[4 + 12 :] == stored
    assert decode_header(block).dims == (3, 4, 4)
    # end block: clipped to the dataset, as N5 writers write it
    end = decode_header((copy / "v3/big_gzip/2/2/2").read_bytes())
    assert end.dims == (1, 2, 1)
    # the sharded big-endian array keeps inner chunks; sparse: only stored blocks listed
    assert (copy / "ts/sharded_big/0/0/0").exists()
    assert sorted(p.name for p in (copy / "v3/sparse").iterdir()) == ["2", "3", "attributes.json"]
    assert sorted(p.name for p in (copy / "v3/sparse/2").iterdir()) == ["1"]


def test_listing_and_sizes_read_no_chunk(source: Path) -> None:
    view, store = view_of(source, "n5")
    files = walk(view)
    assert {"/v2/zlib_big/2/1", "/v3/little_zstd/3", "/v3/sparse/3/4"} <= files.keys()
    reads = [key for key, _ in gets(store) if not key.endswith((".json", ".zarray", ".zattrs"))]
    # sharded arrays read each shard's index (one ranged GET), nothing else
    assert all(key.startswith("ts/sharded") or "sharded_zp" in key for key in reads), reads
    assert all(rng is not None for key, rng in gets(store) if "shard" in key)


def test_detect_as_n5_lists_left_out_arrays(
    source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_view("N5") == "n5"
    assert main(["detect", str(source), "--as", "n5", "--json"]) == 0
    nodes = {n["path"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert nodes[""]["kind"] == "group"
    for path, reason in LEFT_OUT.items():
        assert nodes[path]["kind"] == "left out", path
        assert reason in nodes[path]["reason"], nodes[path]
    gzip3 = nodes["v3/big_gzip"]
    assert (gzip3["shape"], gzip3["chunks"], gzip3["codecs"]) == ([7, 10, 9], [3, 4, 4], "gzip")
    assert "byte-swapped" in nodes["v3/little_zstd"]["codecs"]
    assert nodes["ts/sharded_big"]["chunks"] == [4, 2, 3]
    assert nodes["v3/minus"]["fill_blocks"]["fill_value"] == -1
    assert "fill_blocks" not in gzip3  # fill 0: N5 readers read it where no block is
    assert main(["detect", str(source), "--as", "n5"]) == 0
    out = capsys.readouterr().out
    assert "left out: data type" in out
    assert "fill -1 (every absent block of the 2 in the grid is a fill block)" in out


def test_mixed_tree_native_n5_kept_and_edges(tmp_path: Path) -> None:
    """An N5 container inside a Zarr group is shown as stored; 0-d arrays and a crc32c
    chain are handled; the root group's attributes carry the N5 version."""
    from tests.writers import tensorstore_n5

    root = tmp_path / "src"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    g.attrs["title"] = "mixed"
    g.create_array("scalar", shape=(), dtype=">i4", serializer=BIG)[()] = 5
    crc = g.create_array("crc", shape=(7, 5), chunks=(4, 4), dtype=">i2", serializer=BIG,
                         compressors=zarr.codecs.Crc32cCodec())  # fmt: skip
    crc[...] = values_for((7, 5), "int16")
    n5_values = values_for((6, 9), "uint16")
    tensorstore_n5(root / "inner/ds", n5_values, [4, 4], {"type": "zstd", "level": 2})
    view, _ = view_of(root, "n5")
    dest = tmp_path / "copy"
    copy_out(view, dest)
    assert json.loads((dest / "attributes.json").read_text()) == {"title": "mixed", "n5": "4.0.0"}
    assert not (dest / "scalar").exists()

    def files(top: Path) -> list[Path]:
        return sorted(p.relative_to(top) for p in top.rglob("*"))

    assert files(dest / "inner/ds") == files(root / "inner/ds")
    for path, want in (("inner/ds", n5_values), ("crc", crc[...].T)):
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(dest / path)}}
        np.testing.assert_array_equal(ts.open(spec).result().read().result(), want, err_msg=path)
    doc = json.loads((dest / "crc/attributes.json").read_text())
    assert doc["compression"] == {"type": "raw"}
    nodes = {n["path"]: n for n in view.tree.describe()}
    assert nodes["scalar"]["reason"] == "N5 has no 0-d datasets"
    assert "crc32c" in nodes["crc"]["codecs"]
    assert nodes["inner/ds"]["codecs"].startswith("as stored")
