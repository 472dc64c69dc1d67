"""Views through real mounts (``n5fs mount --as``): real readers read what real writers wrote.

One mount per view, every dataset read inside it: zarr-python 3 and TensorStore's zarr3 and
zarr drivers read every N5 dataset TensorStore and z5py wrote (every compression, 1-D to 4-D,
odd shapes, a sparse one) and get what the source format's own reader gets, transposed;
zarr-python (zarr_format=2) reads sharded v3 arrays through ``--as zarr2``; ``np.load(...,
mmap_mode="r")`` reads N5, v2 and v3 arrays through ``--as npy``, and a slice of a large one
decodes only the chunks its pages touch (the view's own counters, ``/.n5fs/view.json``);
TensorStore's n5 driver and z5py read Zarr v2/v3 arrays (sharded too) through ``--as n5``.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.gateway.test_views import expected, n5_names, write_sources
from tests.gateway.test_views_n5 import LEFT_OUT, SHOWN, zarr_values
from tests.gateway.test_views_n5 import write_sources as write_zarr_for_n5
from tests.gateway.test_views_n5_fill import FILLED, native
from tests.gateway.test_views_n5_fill import write_sources as write_filled
from tests.mounting import Mounter, real_mount
from tests.writers import ramp, tensorstore_n5

pytestmark = real_mount(300)

#: a dataset large enough that the kernel's read-ahead cannot reach most of its chunks
BIG = "big"
BIG_SHAPE, BIG_BLOCK = (2048, 2048), [128, 128]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mount-views") / "src"
    write_sources(root)
    tensorstore_n5(root / BIG, ramp(BIG_SHAPE), BIG_BLOCK, {"type": "gzip", "level": 1})
    return root


def view_stats(mp: Path) -> dict[str, Any]:
    return json.loads((mp / ".n5fs" / "view.json").read_text())


def assert_read_only(mp: Path, existing: str) -> None:
    for attempt in (
        lambda: (mp / "new-file").write_bytes(b"x"),
        lambda: (mp / existing).write_bytes(b"x"),
        lambda: (mp / "new-dir").mkdir(),
    ):
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS


def test_zarr3_view_reads_every_n5_dataset(mounter: Mounter, source: Path) -> None:
    mp = mounter.foreground(str(source), "--as", "zarr3")
    for name in n5_names():
        want = expected(source, name)
        got = zarr.open_array(str(mp / name), mode="r", zarr_format=3)
        np.testing.assert_array_equal(got[...], want, err_msg=f"zarr-python {name}")
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(mp / name)}}
        np.testing.assert_array_equal(ts.open(spec).result().read().result(), want, err_msg=name)
    for name in ("v2/c_order", "v2/f_order", "v2/delta_zlib"):
        got = zarr.open_array(str(mp / name), mode="r", zarr_format=3)
        np.testing.assert_array_equal(got[...], expected(source, name), err_msg=name)
    group = zarr.open_group(str(mp / "n5/z5"), mode="r", zarr_format=3)
    assert group.attrs["title"] == "written by z5py"
    assert_read_only(mp, "n5/ts/gzip/2d/zarr.json")


def test_zarr2_view_reads_n5_and_sharded_v3(mounter: Mounter, source: Path) -> None:
    mp = mounter.foreground(str(source), "-o", "as=zarr2")
    for name in n5_names():
        want = expected(source, name)
        got = zarr.open_array(str(mp / name), mode="r", zarr_format=2)
        np.testing.assert_array_equal(got[...], want, err_msg=f"zarr-python {name}")
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(mp / name)}}
        np.testing.assert_array_equal(ts.open(spec).result().read().result(), want, err_msg=name)
    for name in ("v3/sharded", "v3/sparse_sharded", "v3/plain", "v3/group/crc"):
        got = zarr.open_array(str(mp / name), mode="r", zarr_format=2)
        np.testing.assert_array_equal(got[...], expected(source, name), err_msg=name)
    inner = sorted(p.name for p in (mp / "v3/sparse_sharded").iterdir())
    assert inner == [".zarray", "0.1", "3.3"]


def test_npy_view_loads_with_mmap_and_reads_only_touched_chunks(
    mounter: Mounter, source: Path
) -> None:
    mp = mounter.foreground(str(source), "--as", "npy")
    for name in [*n5_names(), "v2/c_order", "v2/f_order", "v3/plain", "v3/sharded"]:
        loaded = np.load(mp / f"{name}.npy", mmap_mode="r")
        np.testing.assert_array_equal(loaded, expected(source, name), err_msg=name)
    before = view_stats(mp)
    big = np.load(mp / f"{BIG}.npy", mmap_mode="r")  # 2048 x 2048 in 16 x 16 chunks of 128
    assert big.shape == BIG_SHAPE
    rows = np.array(big[1100:1104])
    np.testing.assert_array_equal(rows, ramp(BIG_SHAPE).T[1100:1104])
    after = view_stats(mp)
    decoded = after["decoded"] - before["decoded"]
    # chunk row 8 (16 chunks), plus what the kernel's read-ahead around the pages touched
    # and after the header reached (2 MiB here: 4 rows); never the other 12 rows of chunks
    assert 16 <= decoded <= 6 * 16, after
    assert after["source_reads"] - before["source_reads"] == decoded
    attrs = json.loads((mp / "n5/z5/gzip/3d.json").read_text())
    assert attrs == {"resolution": [4, 4, 4]}
    assert_read_only(mp, f"{BIG}.npy")


def test_n5_view_reads_zarr_arrays_with_tensorstore_and_z5py(
    mounter: Mounter, tmp_path: Path
) -> None:
    import z5py

    root = tmp_path / "zarr-src"
    write_zarr_for_n5(root)
    mp = mounter.foreground(str(root), "--as", "n5", "--read-only")
    f = z5py.File(str(mp), mode="r", use_zarr_format=False)
    for name in SHOWN:
        want = zarr_values(root, name)
        np.testing.assert_array_equal(f[name][...], want, err_msg=f"z5py {name}")
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mp / name)}}
        got = ts.open(spec).result().read().result()
        np.testing.assert_array_equal(got, want.T, err_msg=f"TensorStore {name}")
    assert json.loads((mp / "attributes.json").read_text())["n5"] == "4.0.0"
    assert not any((mp / name).exists() for name in LEFT_OUT)
    assert sorted(p.name for p in (mp / "v3/sparse").iterdir()) == ["2", "3", "attributes.json"]
    assert_read_only(mp, "v3/big_gzip/attributes.json")


def test_n5_view_reads_fill_values_and_whole_shards(mounter: Mounter, tmp_path: Path) -> None:
    """Zarr arrays whose fill value is not 0 (NaN, +-inf, -1; v2 and v3; chunks, shards and
    inner chunks absent) read through ``--as n5`` by z5py and TensorStore's n5 driver as
    zarr-python reads them natively: absent chunks are fill blocks. Shards wrapped by a zstd
    after ``sharding_indexed`` read through ``--as n5`` and ``--as npy`` (mmap)."""
    import z5py

    root = tmp_path / "zarr-src"
    write_filled(root)
    mp = mounter.foreground(str(root), "--as", "n5", "--read-only")
    f = z5py.File(str(mp), mode="r", use_zarr_format=False)
    for name in FILLED:
        want = native(root, name)
        np.testing.assert_array_equal(f[name][...], want, err_msg=f"z5py {name}")
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mp / name)}}
        got = ts.open(spec).result().read().result()
        np.testing.assert_array_equal(got, want.T, err_msg=f"TensorStore {name}")
    assert sorted(p.name for p in (mp / "v3/nan_le/2").iterdir()) == ["0", "1", "2"]
    assert view_stats(mp)["fill_blocks"] > 0
    npy = mounter.foreground(str(root), "--as", "npy", "--read-only", name="npy")
    for name in ("v3/whole_shard", "v3/whole_shard_zero"):
        got = np.load(npy / f"{name}.npy", mmap_mode="r")
        np.testing.assert_array_equal(np.asarray(got), native(root, name), err_msg=name)


def test_n5_writers_update_a_zarr_array_with_a_nan_fill(mounter: Mounter, tmp_path: Path) -> None:
    """TensorStore's n5 driver updates part of a NaN-filled Zarr v3 array through ``--as n5``:
    it reads the fill block where no chunk is, so the rest of the block stays NaN; z5py sets
    an attribute (rewriting attributes.json whole) and the fill value stays; a whole block of
    zeros, which N5 writers remove rather than write, reads back as the fill value, unless
    TensorStore is told to store it; real ``rm -r`` removes the array."""
    import subprocess

    import z5py

    from n5fs.cli.main import main

    root = tmp_path / "zarr-group"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    array = group.create_array("a", shape=(6, 8), chunks=(3, 4), dtype="<f4", fill_value=np.nan)
    array[0:3, 0:4] = 1.5
    want = array[...]
    mp = mounter.foreground(str(root), "--as", "n5")
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mp / "a")}}
    n5 = ts.open(spec).result()  # N5 order: x, y
    n5[5:7, 4:5] = 9.0  # part of the absent block 1/1: the rest of it stays NaN
    want[4:5, 5:7] = 9.0
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], want)
    z5py.File(str(mp), mode="a", use_zarr_format=False)["a"].attrs["unit"] = "nm"
    assert json.loads((root / "a" / "zarr.json").read_text())["fill_value"] == "NaN"
    n5[0:4, 0:3] = 0.0  # block 0/0 whole: removed by TensorStore, the fill value again
    want[0:3, 0:4] = np.nan
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], want)
    kept = ts.open({**spec, "store_data_equal_to_fill_value": True}).result()
    kept[0:4, 0:3] = 0.0
    want[0:3, 0:4] = 0.0
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], want)
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), want.T)
    assert main(["validate", str(root)]) == 0
    done = subprocess.run(["rm", "-r", str(mp / "a")], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (root / "a").exists()


def test_zarr_python_writes_through_zarr3_land_as_n5(mounter: Mounter, tmp_path: Path) -> None:
    """zarr-python 3 creates and fills an array in an N5 container mounted ``--as zarr3``;
    TensorStore's n5 driver reads it back transposed from the backing store, which ``n5fs
    validate`` finds clean; a codec N5 lacks is refused (EINVAL) with a rejection entry."""
    from n5fs.cli.main import main

    root = tmp_path / "container"
    tensorstore_n5(root / "old", ramp((4, 6)), [2, 3])
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    mp = mounter.foreground(str(root), "--as", "zarr3")
    values = (np.arange(9 * 7 * 5).reshape(9, 7, 5) + 1).astype("<i4")
    group = zarr.open_group(str(mp), mode="a")
    array = group.create_array(
        "new", shape=values.shape, chunks=(4, 3, 2), dtype="<i4", attributes={"unit": "nm"}
    )
    array[...] = values
    array[0, 0, :] = 0  # a partial update of a chunk written before: read, changed, rewritten
    values[0, 0, :] = 0
    np.testing.assert_array_equal(zarr.open_array(str(mp / "new"), mode="r")[...], values)
    with pytest.raises(OSError) as caught:
        group.create_array(
            "crc", shape=(4,), chunks=(2,), dtype="<i4", compressors=zarr.codecs.Crc32cCodec()
        )
    assert caught.value.errno == errno.EINVAL
    lines = (mp / ".n5fs" / "rejections").read_text().splitlines()
    refused = [json.loads(line) for line in lines]
    assert any(r["path"].startswith("/crc/") and r["rule"] == "codec" for r in refused), refused

    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(root / "new")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), values.T)
    assert json.loads((root / "new" / "attributes.json").read_text())["unit"] == "nm"
    assert not (root / "crc" / "attributes.json").exists()
    assert main(["validate", str(root)]) == 0


def test_tensorstore_n5_writes_through_n5_land_as_zarr3(mounter: Mounter, tmp_path: Path) -> None:
    """TensorStore's n5 driver (file kvstore at the mountpoint) creates, fills and partly
    updates a dataset in a Zarr v3 group mounted ``--as n5``; zarr-python and TensorStore's
    zarr3 driver read it back transposed from the backing store, which ``n5fs validate``
    finds clean; a compression Zarr lacks here is refused (EINVAL) with a rejection entry."""
    from n5fs.cli.main import main

    root = tmp_path / "zarr-group"
    zarr.open_group(str(root), mode="w", zarr_format=3).attrs["kind"] = "root"
    mp = mounter.foreground(str(root), "--as", "n5")
    values = (np.arange(7 * 5 * 3).reshape(7, 5, 3) + 1).astype("uint16")
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mp / "vol")}}
    metadata = {"dimensions": [7, 5, 3], "blockSize": [3, 2, 2], "dataType": "uint16"}
    array = ts.open({**spec, "metadata": metadata, "create": True}).result()
    array[...] = values
    array[0, 0, :] = 0  # a partial update: the block is read through the view and rewritten
    values[0, 0, :] = 0
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), values)
    bad = {**metadata, "compression": {"type": "xz"}}
    bad_spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mp / "xz")}}
    with pytest.raises(ValueError, match="Invalid argument"):
        ts.open({**bad_spec, "metadata": bad, "create": True}).result()
    lines = (mp / ".n5fs" / "rejections").read_text().splitlines()
    refused = [json.loads(line) for line in lines]
    assert any(r["path"].startswith("/xz/") and r["rule"] == "compression" for r in refused)

    native = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "vol")}}
    np.testing.assert_array_equal(ts.open(native).result().read().result(), values.T)
    np.testing.assert_array_equal(zarr.open_array(str(root / "vol"), mode="r")[...], values.T)
    assert not list(root.rglob("*.__lock"))
    assert not (root / "xz" / "zarr.json").exists()
    assert main(["validate", str(root)]) == 0


@pytest.mark.parametrize(("source", "fmt"), [("n5", "zarr3"), ("n5", "zarr2"), ("zarr3", "n5")])
def test_rm_r_through_a_view_removes_the_native_trees(
    mounter: Mounter, tmp_path: Path, source: str, fmt: str
) -> None:
    """Real ``rm -r`` of an array, then of its group, through a writable view: the N5 dataset
    (Zarr array) and group it stands for leave the backing store, whatever order ``rm`` takes
    the names in (``.zarray`` comes before the chunks in ``zarr2``), and the store validates."""
    import subprocess

    from n5fs.cli.main import main
    from tests.gateway.test_views_remove import make_store

    root = make_store(tmp_path, source)
    mp = mounter.foreground(str(root), "--as", fmt)
    for tree in (mp / "g" / "arr", mp / "g"):
        done = subprocess.run(["rm", "-r", str(tree)], check=False, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        if tree.name == "arr":
            assert not (root / "g" / "arr").exists()
            assert "arr" not in [p.name for p in (mp / "g").iterdir()]
            assert (mp / "g" / "keep").is_dir()
    assert not (root / "g").exists()
    assert not (mp / "g").exists()
    assert main(["validate", str(root)]) == 0


def test_zarr_python_creates_arrays_in_an_n5_root_without_attributes(
    mounter: Mounter, tmp_path: Path
) -> None:
    """An N5 root without ``attributes.json`` (legal) takes a zarr-python 3 writer through
    ``--as zarr3``: the root gets ``"n5": "4.0.0"`` as the first document lands, the array
    lands as an N5 dataset TensorStore reads natively, and zarr-python's own delete (a
    ``shutil.rmtree`` of the array folder) removes it from the store again."""
    from n5fs.cli.main import main

    root = tmp_path / "container"
    tensorstore_n5(root / "old", ramp((4, 6)), [2, 3])
    assert not (root / "attributes.json").exists()
    mp = mounter.foreground(str(root), "--as", "zarr3")
    values = (np.arange(5 * 7).reshape(5, 7) + 1).astype("<i4")
    group = zarr.open_group(str(mp), mode="a")
    group.create_array("new", shape=values.shape, chunks=(2, 3), dtype="<i4")[...] = values
    group.create_group("sub").create_array("b", shape=(3,), chunks=(2,), dtype="<f8")[...] = 1.5
    assert json.loads((root / "attributes.json").read_text())["n5"] == "4.0.0"
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(root / "new")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), values.T)
    np.testing.assert_array_equal(zarr.open_array(str(mp / "old"), mode="r")[...], ramp((4, 6)).T)
    assert main(["validate", str(root)]) == 0
    del group["sub"]
    assert not (root / "sub").exists()
    assert sorted(zarr.open_group(str(mp), mode="r").keys()) == ["new", "old"]


def test_zarr_python_resaves_metadata_of_an_n5_gzip_dataset(
    mounter: Mounter, tmp_path: Path
) -> None:
    """zarr-python 3 sets an attribute and resizes to the same shape on an N5 gzip dataset
    TensorStore wrote (``"level": -1``, shown as 6) through ``--as zarr3``: both rewrite the
    view's own ``zarr.json``, which changes no compression; the chunks stay and read back."""
    from n5fs.cli.main import main

    root = tmp_path / "container"
    tensorstore_n5(root / "a", ramp((5, 6)), [2, 4])
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    stored = json.loads((root / "a" / "attributes.json").read_text())["compression"]
    assert stored["level"] == -1
    mp = mounter.foreground(str(root), "--as", "zarr3")
    array = zarr.open_array(str(mp / "a"), mode="r+")
    array.attrs["x"] = 1
    array.resize(array.shape)
    attrs = json.loads((root / "a" / "attributes.json").read_text())
    assert attrs["compression"] == stored
    assert attrs["x"] == 1
    again = zarr.open_array(str(mp / "a"), mode="r")
    assert again.attrs["x"] == 1
    np.testing.assert_array_equal(again[...], ramp((5, 6)).T)
    assert main(["validate", str(root)]) == 0


def test_zarr_attributes_through_n5_and_back(mounter: Mounter, tmp_path: Path) -> None:
    """Zarr arrays whose attributes are named like N5's keys (fitting or not), mounted ``--as
    n5``: TensorStore's n5 driver opens and reads each in the mount, with the fitting units
    and names on the same axes. ``cp -r`` of the mount, mounted ``--as zarr3``, shows the
    original attributes and ``dimension_names``; the copy's files written (in place, as z5py
    writes) into a Zarr v3 store mounted ``--as n5`` land as the original arrays."""
    import shutil

    from n5fs.views.attributes import NAMESPACE
    from tests.gateway.test_views_n5_attributes import ARRAYS, values
    from tests.gateway.test_views_n5_attributes import write_sources as write_attr_sources

    root = tmp_path / "zarr-src"
    write_attr_sources(root)
    mp = mounter.foreground(str(root), "--as", "n5", "--read-only")
    for path in ARRAYS:
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mp / path)}}
        store = ts.open(spec).result()
        np.testing.assert_array_equal(store.read().result(), values(path).T, err_msg=path)
        if path == "v3/fit":
            assert store.domain.labels == ("x", "y", "z")
            assert store.dimension_units == (ts.Unit(1, "nm"), ts.Unit(2, "um"), ts.Unit(5, "s"))
    odd = json.loads((mp / "v3/odd/attributes.json").read_text())
    assert odd[NAMESPACE]["units"] == "counts"
    copy = tmp_path / "n5-copy"
    shutil.copytree(mp, copy, ignore=shutil.ignore_patterns(".n5fs"))

    shown = mounter.foreground(str(copy), "--as", "zarr3", "--read-only", name="zarr3")
    for path, (attrs, names) in ARRAYS.items():
        if path.startswith("v3"):
            array = zarr.open_array(str(shown / path), mode="r", zarr_format=3)
            assert dict(array.attrs) == attrs, path
            assert array.metadata.dimension_names == names, path  # type: ignore[union-attr]
            np.testing.assert_array_equal(array[...], values(path))

    target = tmp_path / "zarr-dest"
    zarr.open_group(str(target), mode="w", zarr_format=3)
    back = mounter.foreground(str(target), "--as", "n5", name="back")
    for path in ("v3/odd", "v3/fit"):
        (back / path).mkdir(parents=True)
        (back / path / "attributes.json").write_bytes(
            (copy / path / "attributes.json").read_bytes()
        )
        for block in sorted((copy / path).rglob("*")):
            rel = block.relative_to(copy / path)
            if block.is_dir():
                (back / path / rel).mkdir(exist_ok=True)
            elif block.name != "attributes.json":
                (back / path / rel).write_bytes(block.read_bytes())
    for path in ("v3/odd", "v3/fit"):
        array = zarr.open_array(str(target / path), mode="r")
        assert dict(array.attrs) == ARRAYS[path][0], path
        assert array.metadata.dimension_names == ARRAYS[path][1], path  # type: ignore[union-attr]
        np.testing.assert_array_equal(array[...], values(path))
