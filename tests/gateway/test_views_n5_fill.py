"""``--as n5`` of Zarr arrays whose fill value is not 0, and of shards read whole.

N5 has no fill value: its readers read 0 where no block is stored. Arrays zarr-python 3 wrote
(v2 and v3 formats) with NaN, +-inf and -1 fill values, partly written (absent chunks, absent
shards, absent inner chunks of stored shards), are copied out of the view by listings and
whole-file reads and read by TensorStore's n5 driver and z5py: they must read what
zarr-python reads natively (NaN equal to NaN), because the view shows a *fill block* wherever
nothing is stored. Fill blocks come from metadata (listings read no chunk), are made once
per block shape, and are what removal treats as absent.

A sharded array with a bytes codec after ``sharding_indexed`` (zarr-python's
``serializer=ShardingCodec(...)`` adds zstd there) wraps each shard whole: ``--as n5`` shows
one block per shard and ``--as npy`` decodes shards whole; an N5 writer's whole-shard blocks
land as shards encoded with the array's full chain.
"""

from __future__ import annotations

import io
import json
import warnings
import zlib
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import z5py
import zarr
from zarr.codecs import ShardingCodec

from n5fs.cli.main import main
from n5fs.codecs.n5_header import decode_header
from n5fs.errors import KeyNotFound
from tests.gateway.test_views import copy_out, gets, view_of, walk
from tests.gateway.test_views_n5_write import (
    n5_view,
    replay,
    tensorstore_n5_files,
    validate_clean,
)
from tests.gateway.test_views_remove import remove_tree

BIG = zarr.codecs.BytesCodec(endian="big")


def _quiet() -> Any:
    """zarr-python warns that a codec after sharding_indexed disables partial reads."""
    return warnings.catch_warnings(action="ignore")


def values_for(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    """Distinct values, never 0 and never the fill values used here."""
    n = np.arange(1, int(np.prod(shape)) + 1).reshape(shape)
    if np.dtype(dtype).kind == "f":
        return (n * 0.5 + 0.25).astype(dtype)
    return (n % 97 + 1).astype(dtype)


def whole_shard_array(group: Any, name: str, fill: Any, dtype: str = "<i4") -> Any:
    """zarr-python's sharded array with a zstd codec after sharding_indexed."""
    with _quiet():
        return group.create_array(
            name, shape=(10, 9), chunks=(4, 6), dtype=dtype, fill_value=fill,
            serializer=ShardingCodec(chunk_shape=(2, 3)),
        )  # fmt: skip


def write_sources(root: Path) -> None:
    g3 = zarr.open_group(str(root / "v3"), mode="w", zarr_format=3)
    a = g3.create_array("nan_le", shape=(10, 7), chunks=(4, 3), dtype="<f8", fill_value=np.nan)
    a[0:4, 0:3] = values_for((4, 3), "f8")
    a[8:10, 5:7] = values_for((2, 2), "f8")  # the end block, partly: NaN around it
    a = g3.create_array(
        "inf_gzip_big", shape=(9, 10, 7), chunks=(4, 4, 3), dtype=">f4", serializer=BIG,
        compressors=zarr.codecs.GzipCodec(level=3), fill_value=np.inf,
    )  # fmt: skip
    a[0:4, 4:8, :] = values_for((4, 4, 7), "f4")
    a = g3.create_array(
        "minus_zstd_big", shape=(11, 6), chunks=(3, 4), dtype=">i4", serializer=BIG,
        compressors=zarr.codecs.ZstdCodec(level=1), fill_value=-1,
    )  # fmt: skip
    a[3:6, :] = values_for((3, 6), "i4")
    a = g3.create_array(
        "sharded_nan", shape=(10, 9), chunks=(2, 3), shards=(4, 6), dtype="<f4",
        fill_value=np.nan, compressors=zarr.codecs.GzipCodec(level=1),
    )  # fmt: skip
    a[0:2, 0:3] = values_for((2, 3), "f4")  # one inner chunk of shard (0, 0)
    a[9:10, 6:9] = values_for((1, 3), "f4")  # part of an end shard's inner chunk
    a = g3.create_array(
        "sharded_big_minus", shape=(8, 12), chunks=(2, 4), shards=(4, 8), dtype=">i2",
        serializer=BIG, compressors=zarr.codecs.BloscCodec(cname="lz4", clevel=3),
        fill_value=-1,
    )  # fmt: skip
    a[0:2, 4:12] = values_for((2, 8), "i2")
    a = whole_shard_array(g3, "whole_shard", -1)
    a[0:5, 0:4] = values_for((5, 4), "i4")
    a = whole_shard_array(g3, "whole_shard_zero", 0, "<u2")
    a[...] = values_for((10, 9), "u2")
    g3.create_array("neg_zero", shape=(4,), chunks=(2,), dtype="<f8", fill_value=-0.0)
    g2 = zarr.open_group(str(root / "v2"), mode="w", zarr_format=2)
    a = g2.create_array(
        "nan_zlib_big", shape=(10, 7), chunks=(4, 3), dtype=">f8", fill_value=np.nan,
        compressors=numcodecs.Zlib(level=2),
    )  # fmt: skip
    a[4:8, 3:6] = values_for((4, 3), "f8")
    a = g2.create_array("minus_le", shape=(13,), chunks=(5,), dtype="<i4", fill_value=-1)
    a[5:10] = values_for((5,), "i4")
    a = g2.create_array(
        "ninf_blosc_big", shape=(6, 5), chunks=(4, 4), dtype=">f4", fill_value=-np.inf,
        compressors=numcodecs.Blosc(cname="zstd", clevel=3, shuffle=1),
    )  # fmt: skip
    a[0:4, 0:4] = values_for((4, 4), "f4")


FILLED = [
    "v3/nan_le",
    "v3/inf_gzip_big",
    "v3/minus_zstd_big",
    "v3/sharded_nan",
    "v3/sharded_big_minus",
    "v3/whole_shard",
    "v3/whole_shard_zero",
    "v3/neg_zero",
    "v2/nan_zlib_big",
    "v2/minus_le",
    "v2/ninf_blosc_big",
]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("n5fill") / "src"
    write_sources(root)
    return root


@pytest.fixture(scope="module")
def copy(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    view, _ = view_of(source, "n5")
    dest = tmp_path_factory.mktemp("n5fillcopy")
    copy_out(view, dest)
    return dest


def native(root: Path, path: str) -> np.ndarray[Any, Any]:
    with _quiet():
        return np.asarray(zarr.open_array(str(root / path), mode="r")[...])


@pytest.mark.parametrize("path", FILLED)
def test_tensorstore_n5_reads_the_fill_values_zarr_python_reads(
    source: Path, copy: Path, path: str
) -> None:
    want = native(source, path)
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(copy / path)}}
    got = np.asarray(ts.open(spec).result().read().result())
    np.testing.assert_array_equal(got, want.T)  # NaN equals NaN here
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want.T))  # -0.0 too


@pytest.mark.parametrize("path", FILLED)
def test_z5py_reads_the_fill_values_zarr_python_reads(source: Path, copy: Path, path: str) -> None:
    got = z5py.File(str(copy), mode="r", use_zarr_format=False)[path][...]
    want = native(source, path)
    np.testing.assert_array_equal(got, want)  # z5py: the Zarr array's own axes
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_block_folders_list_the_grid_and_fill_blocks_are_framed(copy: Path) -> None:
    # every name of the grid, whatever is stored: 3 x 3 blocks in N5 order (x, y)
    assert sorted(p.name for p in (copy / "v3/nan_le").iterdir()) == [
        "0", "1", "2", "attributes.json"
    ]  # fmt: skip
    assert sorted(p.name for p in (copy / "v3/nan_le/2").iterdir()) == ["0", "1", "2"]
    # an end block of fill values, clipped like any end block: x 1 of 7, y 2 of 10
    end = (copy / "v3/nan_le/2/1").read_bytes()
    assert decode_header(end).dims == (1, 4)
    assert np.isnan(np.frombuffer(end[12:], ">f8")).all()
    # a kept codec: the fill block is a stored frame of it (gzip, zlib, zstd, blosc)
    for path, dtype, fill in (
        ("v3/inf_gzip_big/2/0/2", ">f4", np.inf),
        ("v2/nan_zlib_big/0/0", ">f8", np.nan),
        ("v3/minus_zstd_big/1/3", ">i4", -1),
        ("v2/ninf_blosc_big/1/1", ">f4", -np.inf),
        ("v3/sharded_big_minus/0/1", ">i2", -1),
    ):
        data = (copy / path).read_bytes()
        header = decode_header(data)
        array = "/".join(path.split("/")[:2])
        compression = json.loads((copy / array / "attributes.json").read_text())["compression"]
        got = np.frombuffer(n5_payload(compression, data[header.size :]), dtype)
        assert got.size == np.prod(header.dims), path
        np.testing.assert_array_equal(got, np.full(got.size, fill, dtype), err_msg=path)


def n5_payload(compression: dict[str, Any], data: bytes) -> bytes:
    """An N5 block's payload, decoded by the format's own libraries."""
    kind = compression["type"]
    if kind == "gzip":
        return zlib.decompress(data, 15 if compression.get("useZlib") else 31)
    if kind == "zstd":
        return bytes(numcodecs.Zstd().decode(data))
    assert kind == "blosc", compression
    return bytes(numcodecs.Blosc().decode(data))


def test_fill_blocks_come_from_metadata_and_are_made_once_per_shape(source: Path) -> None:
    view, store = view_of(source, "n5")
    files = walk(view, "/v3/nan_le")
    stored = {"/v3/nan_le/0/0", "/v3/nan_le/1/2", "/v3/nan_le/2/2"}
    assert len(files) == 1 + 9, files  # attributes.json and every block of the 3 x 3 grid
    assert all(files[p].size == view.stat(p).size for p in files)
    # listing and stat read no chunk: the grid and the fill value come from metadata
    assert not [key for key, _ in gets(store) if not key.endswith(".json")]
    for _ in range(2):
        for path in sorted(files):
            assert len(view.read_file(path)) == files[path].size
    # absent blocks (Zarr order): 3 of shape 4x3, 2 of 4x1, 1 of 2x3: one fill block each
    assert view.stats()["fill_blocks"] == 3
    reads = sorted(key for key, _ in gets(store) if not key.endswith(".json"))
    assert reads == ["v3/nan_le/c/0/0", "v3/nan_le/c/2/1", "v3/nan_le/c/2/2"]
    assert all(not view.tree.entry(p.lstrip("/")).fill for p in stored)  # type: ignore[union-attr]


def test_a_fill_0_array_lists_only_stored_blocks(source: Path) -> None:
    view, _ = view_of(source, "n5")
    entries = dict(view.tree.children("v3/whole_shard_zero"))
    assert set(entries) == {"0", "1", "attributes.json"}  # every shard stored
    assert not any(entry.fill for entry in entries.values())
    nodes = {n["path"]: n for n in view.tree.describe()}
    assert "fill_blocks" not in nodes["v3/whole_shard_zero"]


def test_detect_as_n5_says_which_arrays_show_fill_blocks(
    source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["detect", str(source), "--as", "n5", "--json"]) == 0
    nodes = {n["path"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    for path in FILLED:
        assert nodes[path]["kind"] == "array", nodes[path]
    assert nodes["v3/nan_le"]["fill_blocks"] == {
        "fill_value": "NaN",
        "where": "every absent block",
        "grid_blocks": 9,
    }
    assert nodes["v2/ninf_blosc_big"]["fill_blocks"]["fill_value"] == "-Infinity"
    assert nodes["v3/inf_gzip_big"]["fill_blocks"]["fill_value"] == "Infinity"
    assert nodes["v3/neg_zero"]["fill_blocks"]["fill_value"] == -0.0  # its bytes are not 0
    assert nodes["v3/sharded_nan"]["fill_blocks"]["grid_blocks"] == 15  # inner chunks
    assert nodes["v3/sharded_nan"]["chunks"] == [3, 2]
    whole = nodes["v3/whole_shard"]
    assert whole["chunks"] == [6, 4]  # one block per shard
    assert "zstd after sharding_indexed" in whole["codecs"]
    assert "fill_blocks" not in nodes["v3/whole_shard_zero"]
    assert main(["detect", str(source), "--as", "n5"]) == 0
    out = capsys.readouterr().out
    assert "fill NaN (every absent block of the 9 in the grid is a fill block)" in out


@pytest.mark.parametrize("name", ["whole_shard", "whole_shard_zero"])
def test_npy_reads_shards_wrapped_by_a_codec_after_sharding(source: Path, name: str) -> None:
    view, _ = view_of(source, "npy")
    got = np.load(io.BytesIO(view.read_file(f"/v3/{name}.npy")))
    np.testing.assert_array_equal(got, native(source, f"v3/{name}"))
    assert view.stats()["shard_indexes"] == 0  # shards read whole, no index read alone


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")
def test_transposed_and_wrapped_shards_with_a_fill_value(tmp_path: Path) -> None:
    """zarr-python's sharded arrays (fill -1) with a transposition before sharding_indexed,
    a zstd after it, or a transposition inside it, one of them sparse: read as N5 by
    TensorStore and z5py as zarr-python reads them."""
    from tests.gateway.test_views import TRANSPOSED, _write_transposed_shards

    root = tmp_path / "src"
    _write_transposed_shards(root)
    view, _ = view_of(root, "n5")
    dest = tmp_path / "copy"
    copy_out(view, dest)
    f = z5py.File(str(dest), mode="r", use_zarr_format=False)
    for name in [*TRANSPOSED, "before_sparse"]:
        want = native(root, name)
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(dest / name)}}
        got = ts.open(spec).result().read().result()
        np.testing.assert_array_equal(got, want.T, err_msg=name)
        np.testing.assert_array_equal(f[name][...], want, err_msg=name)
    assert view.stats()["fill_blocks"] > 0  # before_sparse: absent shards


# -- writes through the view onto an array with a fill value --------------------------------


def fill_store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    a = group.create_array(
        "nan",
        shape=(6, 4),
        chunks=(2, 2),
        dtype=">f4",
        serializer=BIG,
        compressors=None,
        fill_value=np.nan,
    )
    a[0:2, 0:2] = 1.5
    a[4:6, 2:4] = 2.5
    return root


def test_removing_a_block_of_a_fill_array_leaves_a_fill_block(tmp_path: Path) -> None:
    root = fill_store(tmp_path)
    view = n5_view(root)
    assert (root / "nan/c/0/0").is_file()
    view.unlink("/nan/0/0")  # the native chunk goes; the block reads as the fill value
    assert not (root / "nan/c/0/0").exists()
    block = view.read_file("/nan/0/0")
    assert np.isnan(np.frombuffer(block[12:], ">f4")).all()
    assert view.tree.entry("nan/0/0").fill  # type: ignore[union-attr]
    view.unlink("/nan/1/0")  # a fill block: nothing stored, nothing to do
    with pytest.raises(KeyNotFound):
        view.unlink("/nan/2/0")  # outside the grid (x has 2 blocks)
    assert (root / "nan/c/2/1").is_file()
    np.testing.assert_array_equal(
        zarr.open_array(str(root / "nan"), mode="r")[...],
        np.where(np.arange(6)[:, None] >= 4, np.where(np.arange(4) >= 2, 2.5, np.nan), np.nan),
    )


@pytest.mark.parametrize("documents_first", [True, False], ids=["doc-first", "doc-last"])
def test_rm_r_of_a_fill_array_removes_it(tmp_path: Path, documents_first: bool) -> None:
    root = fill_store(tmp_path)
    view = n5_view(root)
    remove_tree(view, "/nan", documents_first=documents_first)
    assert not (root / "nan").exists()
    assert view.lookup("/nan") is None


def test_a_dataset_document_rewritten_keeps_the_fill_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """z5py writes attributes.json whole (dataset keys too) to set an attribute: the array's
    fill value stays, so its absent chunks still read as it."""
    root = fill_store(tmp_path)
    view = n5_view(root)
    doc = json.loads(view.read_file("/nan/attributes.json"))
    replay(view, "nan", [("attributes.json", json.dumps({**doc, "unit": "nm"}).encode())])
    assert json.loads((root / "nan/zarr.json").read_text())["fill_value"] == "NaN"
    array = zarr.open_array(str(root / "nan"), mode="r")
    assert np.isnan(array[2, 0])
    assert array[0, 0] == 1.5
    validate_clean(root, capsys)


def test_tensorstore_blocks_land_in_a_fill_array(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fill_store(tmp_path)
    view = n5_view(root)
    metadata = json.loads(view.read_file("/nan/attributes.json"))
    values = np.full((4, 6), np.nan, dtype="float32")  # N5 order: x, y
    values[2:4, 0:2] = 7.0  # N5 block 1/0: Zarr chunk (0, 1)
    files = tensorstore_n5_files(tmp_path, metadata, values)
    blocks = [(name, data) for name, data in files if name == "1/0"]
    assert blocks, files
    replay(view, "nan", blocks)
    array = zarr.open_array(str(root / "nan"), mode="r")
    np.testing.assert_array_equal(array[0:2, 2:4], np.full((2, 2), 7.0))
    assert np.isnan(array[2:4, :]).all()
    validate_clean(root, capsys)


# -- whole shards (a codec after sharding_indexed) written through the view ---------------------


def test_whole_shard_blocks_land_encoded_with_the_full_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An N5 block of such an array is a whole shard: written through the view it is stored
    as the shard, encoded with sharding_indexed and the zstd after it (the gateway validates
    it with the array's chain); the array's document is not touched."""
    root = tmp_path / "store"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    array = whole_shard_array(group, "w", -1)
    array[8:10, 6:9] = 3  # end shard (2, 1)
    before = (root / "w/zarr.json").read_bytes()
    view = n5_view(root)
    metadata = json.loads(view.read_file("/w/attributes.json"))
    assert metadata["blockSize"] == [6, 4]
    values = np.full((9, 10), -1, dtype="int32")  # N5 order: x, y
    values[0:6, 0:4] = values_for((6, 4), "i4")  # block 0/0: shard (0, 0), whole
    values[6:9, 4:8] = values_for((3, 4), "i4")  # block 1/1: the clipped shard (1, 1)
    files = dict(tensorstore_n5_files(tmp_path, metadata, values))
    replay(view, "w", [(name, files[name]) for name in ("0/0", "1/1")])
    assert (root / "w/zarr.json").read_bytes() == before
    want = np.full((10, 9), -1, dtype="int32")
    want[0:4, 0:6] = values_for((6, 4), "i4").T
    want[4:8, 6:9] = values_for((3, 4), "i4").T
    want[8:10, 6:9] = 3
    np.testing.assert_array_equal(native(root, "w"), want)  # (TensorStore opens no such array)
    # read back through the view: the blocks as written, fill blocks where nothing is
    back = n5_view(root)
    dest = tmp_path / "copy"
    copy_out(back, dest)
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(dest / "w")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), want.T)
    validate_clean(root, capsys)
