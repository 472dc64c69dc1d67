"""Zarr attributes through ``--as n5`` and back: N5's keys keep their meaning, none is lost.

Zarr arrays carry attributes named like N5's keys, of shapes N5's readers refuse (``"units":
"counts"``) and of shapes they read (``units`` one string per axis). Copied out of the n5
view, TensorStore's n5 driver opens and reads every array and z5py reads the attributes;
fitting per-axis conventions name the same axes as in Zarr (N5 order: reversed). The copy,
shown ``--as zarr3``/``--as zarr2``, has the original attributes and ``dimension_names``;
written back through ``--as n5`` by an N5 writer, it lands as the original Zarr array. Zarr
writers writing through ``--as zarr3`` into N5 get the same mapping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import z5py
import zarr

from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore import open_store
from n5fs.views import open_view
from n5fs.views.attributes import NAMESPACE
from tests.gateway import test_views_n5_write as n5_writes
from tests.gateway import test_views_write as zarr_writes
from tests.gateway.test_views import copy_out, view_of

SHAPE = (2, 3, 4)  # Zarr order: z, y, x
NAMES = ("z", "y", "x")
#: conventional N5 keys of shapes N5 readers refuse, N5's own keys, the namespace's name
ODD: dict[str, Any] = {
    "units": "counts",
    "resolution": "4nm",
    "axes": "zyx",
    "pixelResolution": {"dimensions": [1, 1]},
    "downsamplingFactors": 2,
    "dimensions": "mine",
    "blockSize": [9],
    "dataType": "text",
    "compression": "none",
    "n5": "no version",
    NAMESPACE: 1,
    "title": "odd",
}
#: the same conventions, fitting, in Zarr order (z, y, x)
FIT: dict[str, Any] = {
    "units": ["s", "um", "nm"],
    "resolution": [5, 2, 1],
    "pixelResolution": {"dimensions": [5, 2, 1], "unit": "um"},
    "downsamplingFactors": [1, 2, 2],
    "title": "fit",
}
V2_FIT = {**FIT, "axes": list(NAMES)}
#: every array of the source: path -> (attributes, dimension_names)
ARRAYS: dict[str, tuple[dict[str, Any], tuple[str | None, ...] | None]] = {
    "v3/odd": (ODD, NAMES),
    "v3/fit": (FIT, NAMES),
    "v3/nulls": ({"axes": ["a", "b", "c"]}, (None, "y", None)),
    "v3/unnamed": (FIT, None),
    "v2/odd": (ODD, None),
    "v2/fit": (V2_FIT, None),
}
GROUP_ATTRS = {"dimensions": [4], "blockSize": [2], "dataType": "uint8", "compression": "raw"}


def values(path: str) -> np.ndarray[Any, Any]:
    return (np.arange(np.prod(SHAPE)).reshape(SHAPE) + len(path)).astype("int16")


def write_sources(root: Path) -> None:
    for version in (3, 2):
        group = zarr.open_group(str(root / f"v{version}"), mode="w", zarr_format=version)  # type: ignore[arg-type]
        group.attrs.update({**GROUP_ATTRS, "units": "counts", "axes": ["c", "y", "x"]})
    for path, (attrs, names) in ARRAYS.items():
        group = zarr.open_group(str(root / path.split("/")[0]), mode="a")
        extra = {} if names is None else {"dimension_names": names}
        array = group.create_array(
            path.split("/")[1], shape=SHAPE, chunks=(1, 2, 3), dtype="int16", **extra
        )
        array[...] = values(path)
        array.attrs.update(attrs)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attrs") / "src"
    write_sources(root)
    return root


@pytest.fixture(scope="module")
def copy(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cp -r`` of ``--as n5``: plain N5."""
    view, _ = view_of(source, "n5")
    dest = tmp_path_factory.mktemp("attrs-n5")
    copy_out(view, dest)
    return dest


def n5_doc(root: Path, path: str) -> dict[str, Any]:
    return json.loads((root / path / "attributes.json").read_text())  # type: ignore[no-any-return]


def open_n5(root: Path, path: str) -> ts.TensorStore:
    return ts.open(
        {"driver": "n5", "kvstore": {"driver": "file", "path": str(root / path)}}
    ).result()


@pytest.mark.parametrize("path", ARRAYS)
def test_tensorstore_n5_opens_and_reads_every_array(copy: Path, path: str) -> None:
    store = open_n5(copy, path)
    np.testing.assert_array_equal(store.read().result(), values(path).T)


def test_fitting_conventions_name_the_same_axes(source: Path, copy: Path) -> None:
    """TensorStore reads N5 ``axes``, ``units`` and ``resolution`` in N5's axis order: the
    view's reversal keeps each on its axis (the zarr3 source names the same axes)."""
    n5 = open_n5(copy, "v3/fit")
    assert n5.domain.labels == ("x", "y", "z")
    assert n5.dimension_units == (ts.Unit(1, "nm"), ts.Unit(2, "um"), ts.Unit(5, "s"))
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(source / "v3/fit")}}
    assert ts.open(spec).result().domain.labels == NAMES
    doc = n5_doc(copy, "v3/fit")
    assert doc["pixelResolution"] == {"dimensions": [1, 2, 5], "unit": "um"}
    assert doc["downsamplingFactors"] == [2, 2, 1]
    assert NAMESPACE not in doc
    v2 = open_n5(copy, "v2/fit")  # v2: the `axes` attribute is N5's axes
    assert (v2.domain.labels, v2.dimension_units) == (n5.domain.labels, n5.dimension_units)
    assert open_n5(copy, "v3/nulls").domain.labels == ("", "y", "")  # null: unlabeled


def test_what_does_not_fit_is_kept_under_one_key(copy: Path) -> None:
    doc = n5_doc(copy, "v3/odd")
    assert doc[NAMESPACE] == {k: v for k, v in ODD.items() if k != "title"}
    assert doc["title"] == "odd"
    assert doc["axes"] == ["x", "y", "z"]  # from dimension_names
    assert (doc["dimensions"], doc["blockSize"], doc["dataType"]) == ([4, 3, 2], [3, 2, 1], "int16")
    assert n5_doc(copy, "v3/nulls")[NAMESPACE] == {"axes": ["a", "b", "c"]}  # v3: names are names
    for version in ("v3", "v2"):  # a group with attributes named like the dataset keys
        group = n5_doc(copy, version)
        assert group[NAMESPACE] == {**GROUP_ATTRS, "units": "counts"}
        assert group["axes"] == ["x", "y", "c"]
        assert set(group) == {NAMESPACE, "axes"}


def test_z5py_reads_the_attributes(copy: Path) -> None:
    f = z5py.File(str(copy), mode="r", use_zarr_format=False)
    odd = f["v3/odd"]
    assert odd.attrs[NAMESPACE]["units"] == "counts"
    assert odd.attrs["title"] == "odd"
    np.testing.assert_array_equal(odd[...], values("v3/odd"))
    fit = f["v3/fit"]
    assert (fit.attrs["units"], fit.attrs["resolution"]) == (["nm", "um", "s"], [1, 2, 5])
    assert isinstance(f["v2"], z5py.Group)  # still a group: no dataset keys of its own


@pytest.mark.parametrize("fmt", ["zarr3", "zarr2"])
def test_the_n5_copy_as_zarr_shows_the_original_attributes(
    copy: Path, tmp_path: Path, fmt: str
) -> None:
    view, _ = view_of(copy, fmt)
    dest = tmp_path / fmt
    copy_out(view, dest)
    for path, (attrs, names) in ARRAYS.items():
        array = zarr.open_array(str(dest / path), mode="r")
        np.testing.assert_array_equal(array[...], values(path))
        if fmt == "zarr3" and path.startswith("v3"):  # the source's own format: as it was
            doc = json.loads((dest / path / "zarr.json").read_text())
            assert doc["attributes"] == attrs, path
            assert doc.get("dimension_names") == (None if names is None else list(names)), path
        elif fmt == "zarr2" and path.startswith("v2"):
            assert json.loads((dest / path / ".zattrs").read_text()) == attrs, path
        else:  # across versions: axis names are each version's own
            shown = dict(array.attrs)
            named = fmt == "zarr3"
            assert {k: v for k, v in shown.items() if k != "axes"} == {
                k: v for k, v in attrs.items() if k != "axes"
            }, path
            if named and path == "v2/fit":
                assert array.metadata.dimension_names == NAMES  # type: ignore[union-attr]
            if not named and path == "v3/fit":
                assert shown["axes"] == list(NAMES)
    driver = {"zarr3": "zarr3", "zarr2": "zarr"}[fmt]
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(dest / "v3/fit")}}
    labels = ts.open(spec).result().domain.labels  # TensorStore's zarr (v2) driver: no names
    assert labels == (NAMES if fmt == "zarr3" else ("", "", ""))
    group = zarr.open_group(str(dest / "v3"), mode="r")
    assert dict(group.attrs) == {**GROUP_ATTRS, "units": "counts", "axes": ["c", "y", "x"]}


@pytest.mark.parametrize("version", [3, 2])
def test_an_n5_writer_writing_the_copy_back_lands_the_original_zarr(
    copy: Path, tmp_path: Path, version: int
) -> None:
    """Every file of the N5 copy written through ``--as n5`` into a Zarr store (as
    TensorStore's file kvstore writes them): the arrays land as they were."""
    root = n5_writes.zarr_root(tmp_path, version)
    view = n5_writes.n5_view(root)
    for path in (p for p in ARRAYS if p.startswith(f"v{version}")):
        files = sorted(p for p in (copy / path).rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name != "attributes.json")  # the document first
        n5_writes.replay(
            view, path, [(p.relative_to(copy / path).as_posix(), p.read_bytes()) for p in files]
        )
    view.close()
    for path, (attrs, names) in ARRAYS.items():
        if not path.startswith(f"v{version}"):
            continue
        array = zarr.open_array(str(root / path), mode="r")
        np.testing.assert_array_equal(array[...], values(path))
        assert dict(array.attrs) == attrs, path
        if version == 3:
            assert array.metadata.dimension_names == names, path  # type: ignore[union-attr]


def test_tensorstore_n5_labels_and_units_land_as_zarr3_names(tmp_path: Path) -> None:
    """TensorStore writes labels and units through ``--as n5``; TensorStore's zarr3 driver
    reads the Zarr array with the same name on each axis, the units as Zarr attributes."""
    root = n5_writes.zarr_root(tmp_path, 3)
    where = tmp_path / "ts"
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(where)}}
    schema = {
        "domain": {"labels": ["x", "", "z"], "shape": [4, 3, 2]},
        "dimension_units": ["4nm", None, "s"],
    }
    ts.open({**spec, "schema": schema, "dtype": "uint8", "create": True}).result()[...] = 7
    files = [
        (p.relative_to(where).as_posix(), p.read_bytes())
        for p in sorted(where.rglob("*"))
        if p.is_file()
    ]
    files.sort(key=lambda f: f[0] != "attributes.json")
    view = n5_writes.n5_view(root)
    n5_writes.replay(view, "vol", files)
    view.close()
    doc = json.loads((root / "vol/zarr.json").read_text())
    assert doc["dimension_names"] == ["z", None, "x"]
    assert doc["attributes"] == {"units": ["s", "", "nm"], "resolution": [1.0, 1.0, 4.0]}
    zspec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "vol")}}
    array = ts.open(zspec).result()
    assert array.domain.labels == ("z", "", "x")
    assert (array.read().result() == 7).all()


def test_zarr_writers_through_the_zarr3_view_get_the_same_mapping(tmp_path: Path) -> None:
    root = zarr_writes.n5_root(tmp_path)

    def write(group: zarr.Group) -> None:
        array = group.create_array(
            "vol", shape=SHAPE, chunks=(1, 2, 3), dtype="int16", dimension_names=NAMES,
            attributes=ODD,
        )  # fmt: skip
        array[...] = values("vol")
        group.create_group("g", attributes=GROUP_ATTRS)

    view = zarr_writes.writable_view(root)
    zarr_writes.replay(view, zarr_writes.zarr_files(write))
    view.close()
    doc = n5_doc(root, "vol")
    assert doc[NAMESPACE] == {k: v for k, v in ODD.items() if k != "title"}
    assert (doc["axes"], doc["dimensions"]) == (["x", "y", "z"], [4, 3, 2])
    np.testing.assert_array_equal(open_n5(root, "vol").read().result(), values("vol").T)
    assert n5_doc(root, "g") == {NAMESPACE: GROUP_ATTRS}
    view = open_view(Gateway(open_store(str(root)), GatewayConfig(read_only=True)), "zarr3")
    array = zarr.open_array(zarr_writes.read_back(view, "vol"), path="vol", mode="r")
    assert dict(array.attrs) == ODD
    assert array.metadata.dimension_names == NAMES  # type: ignore[union-attr]


def test_zattrs_through_the_zarr2_view_keep_the_dataset(tmp_path: Path) -> None:
    """``.zattrs`` of an N5 dataset written through ``--as zarr2``: attributes named like the
    dataset keys (or N5 version 0's ``compressionType``, which the dataset keeps) go aside."""
    root = zarr_writes.n5_root(tmp_path)
    (root / "old").mkdir()
    dataset = {"dimensions": [4, 3], "blockSize": [2, 2], "dataType": "uint8"}
    (root / "old/attributes.json").write_text(json.dumps({**dataset, "compressionType": "raw"}))
    view = zarr_writes.writable_view(root, "zarr2")
    zattrs = {"compressionType": "gzip", "units": ["nm", "s"], "dataType": 1}
    zarr_writes.put(view, "old/.zattrs", json.dumps(zattrs).encode())
    view.close()
    doc = n5_doc(root, "old")
    assert doc == {
        **dataset,
        "compressionType": "raw",
        "units": ["s", "nm"],
        NAMESPACE: {"compressionType": "gzip", "dataType": 1},
    }
    view, _ = view_of(root, "zarr2")  # still a dataset
    assert json.loads(view.read_file("/old/.zarray"))["shape"] == [3, 4]
    assert json.loads(view.read_file("/old/.zattrs")) == zattrs
