"""Writes through ``--as n5`` over a Zarr store land as native Zarr.

TensorStore's n5 driver writes into a temp folder first (a file kvstore) and its files are
replayed into the view as it writes them on a mount (strace of its file kvstore): ``mkdir``
of the folders (EEXIST tolerated), ``open(key.__lock, O_WRONLY|O_CREAT)`` twice (a lock and
a writer), the bytes, an fsync, a ``rename`` onto the key while both are open, then the
closes (a flush each); ``attributes.json`` first, then the blocks. The store is then read
natively (zarr-python, TensorStore zarr3/zarr, transposed) and checked with ``n5fs validate``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from n5fs.cli.main import main
from n5fs.errors import KeyExists, Rejected, errno_of
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore import open_store
from n5fs.views import open_view
from n5fs.views.base import View


def zarr_root(tmp_path: Path, zarr_format: int) -> Path:
    root = tmp_path / "store"
    group = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)  # type: ignore[arg-type]
    group.attrs["kind"] = "root"
    return root


def n5_view(root: Path) -> View:
    view = open_view(Gateway(open_store(str(root)), GatewayConfig()), "n5")
    assert not view.read_only
    return view


def tensorstore_n5_files(
    tmp_path: Path, metadata: dict[str, Any], values: np.ndarray[Any, Any]
) -> list[tuple[str, bytes]]:
    """What TensorStore's n5 driver writes for ``values``: attributes.json, then the blocks."""
    where = tmp_path / "ts"
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(where)}}
    array = ts.open({**spec, "metadata": metadata, "create": True}).result()
    array[...] = values
    files = [("attributes.json", (where / "attributes.json").read_bytes())]
    blocks = sorted(p for p in where.rglob("*") if p.is_file() and p.name != "attributes.json")
    return files + [(p.relative_to(where).as_posix(), p.read_bytes()) for p in blocks]


def put(view: View, key: str, data: bytes) -> None:
    """TensorStore's file kvstore write, as a mount sees it."""
    parts = key.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        with contextlib.suppress(KeyExists):  # TensorStore's mkdir tolerates EEXIST
            view.mkdir("/" + "/".join(parts[:i]))
    lock_path = "/" + key + ".__lock"
    lock = view.create(lock_path, os.O_WRONLY | os.O_CREAT)
    writer = view.open(lock_path, os.O_WRONLY | os.O_CREAT)
    try:
        view.write(writer, data, 0)
        view.fsync(writer)
        view.rename(lock_path, "/" + key)
        view.flush(writer)  # its close, after the rename: nothing left to flush
    finally:
        view.release(writer)
        view.release(lock)


def replay(view: View, prefix: str, files: list[tuple[str, bytes]]) -> None:
    for name, data in files:
        put(view, f"{prefix}/{name}", data)


def validate_clean(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code = main(["validate", str(root)])
    out = capsys.readouterr()
    assert code == 0, out


@pytest.mark.parametrize(
    ("dtype", "compression", "codec"),
    [
        ("uint16", {"type": "gzip"}, "gzip"),
        ("float64", {"type": "zstd", "level": 2}, "zstd"),
        ("int32", {"type": "blosc", "cname": "lz4", "clevel": 3, "shuffle": 1}, "blosc"),
        ("uint8", {"type": "raw"}, None),
    ],
)
def test_tensorstore_n5_writes_land_as_zarr3(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    dtype: str,
    compression: dict[str, Any],
    codec: str | None,
) -> None:
    root = zarr_root(tmp_path, 3)
    values = (np.arange(7 * 5 * 3).reshape(7, 5, 3) + 1).astype(dtype)  # N5 order: x, y, z
    metadata = {
        "dimensions": [7, 5, 3],
        "blockSize": [3, 2, 2],  # clipped end blocks on every axis
        "dataType": dtype,
        "compression": compression,
    }
    view = n5_view(root)
    replay(view, "vol", tensorstore_n5_files(tmp_path, metadata, values))
    written = json.loads(view.read_file("/vol/attributes.json"))
    assert written["compression"]["type"] == compression["type"]
    view.close()

    doc = json.loads((root / "vol" / "zarr.json").read_text())
    assert doc["shape"] == [3, 5, 7]
    assert doc["chunk_grid"]["configuration"]["chunk_shape"] == [2, 2, 3]
    assert [c["name"] for c in doc["codecs"]] == ["bytes"] + ([codec] if codec else [])
    assert not (root / "vol" / "attributes.json").exists()
    assert not list(root.rglob("*.__lock"))
    assert (root / "vol" / "c" / "1" / "2" / "2").is_file()  # the Zarr key of N5 block 2/2/1
    np.testing.assert_array_equal(zarr.open_array(str(root / "vol"), mode="r")[...], values.T)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "vol")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), values.T)
    assert zarr.open_group(str(root), mode="r").attrs["kind"] == "root"
    validate_clean(root, capsys)


def test_a_partial_update_and_group_attributes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second writer updates part of the dataset (whole blocks re-written, as TensorStore
    reads and writes them); an N5 group's attributes.json becomes a Zarr v3 group."""
    root = zarr_root(tmp_path, 3)
    values = np.arange(6 * 4, dtype="int16").reshape(6, 4)
    metadata = {"dimensions": [6, 4], "blockSize": [4, 4], "dataType": "int16"}
    view = n5_view(root)
    put(view, "g/attributes.json", json.dumps({"about": "n5 group"}).encode())
    replay(view, "g/a", tensorstore_n5_files(tmp_path, metadata, values))
    values[1:3, 1:3] = -5
    updated = tensorstore_n5_files(tmp_path / "again", metadata, values)
    replay(view, "g/a", [f for f in updated if f[0] == "0/0"])
    view.close()

    group = json.loads((root / "g" / "zarr.json").read_text())
    assert group == {"zarr_format": 3, "node_type": "group", "attributes": {"about": "n5 group"}}
    np.testing.assert_array_equal(zarr.open_array(str(root / "g" / "a"), mode="r")[...], values.T)
    validate_clean(root, capsys)


def test_a_zarr2_hierarchy_gets_zarray_and_zlib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = zarr_root(tmp_path, 2)
    values = np.arange(5 * 3, dtype="uint32").reshape(5, 3)
    metadata = {
        "dimensions": [5, 3],
        "blockSize": [2, 2],
        "dataType": "uint32",
        "compression": {"type": "gzip", "useZlib": True},
    }
    files = tensorstore_n5_files(tmp_path, metadata, values)
    attrs = json.loads(files[0][1])
    files[0] = ("attributes.json", json.dumps({**attrs, "unit": "nm"}).encode())
    view = n5_view(root)
    replay(view, "z", files)
    view.close()

    zarray = json.loads((root / "z" / ".zarray").read_text())
    assert zarray["compressor"]["id"] == "zlib"
    assert zarray["shape"] == [3, 5]
    assert json.loads((root / "z" / ".zattrs").read_text()) == {"unit": "nm"}
    array = zarr.open_array(str(root / "z"), mode="r", zarr_format=2)
    np.testing.assert_array_equal(array[...], values.T)
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(root / "z")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), values.T)
    validate_clean(root, capsys)


def test_a_compression_zarr_lacks_is_refused_with_a_rejection(tmp_path: Path) -> None:
    root = zarr_root(tmp_path, 3)
    view = n5_view(root)
    doc = {"dimensions": [4], "blockSize": [2], "dataType": "uint8", "compression": {"type": "xz"}}
    with pytest.raises(Rejected) as caught:
        put(view, "x/attributes.json", json.dumps(doc).encode())
    assert errno_of(caught.value) == errno.EINVAL
    assert caught.value.rule == "compression"
    assert "xz" in caught.value.message
    refused = [r for r in view.gateway.rejections if r.path == "/x/attributes.json"]
    assert refused
    assert refused[0].rule == "compression"
    assert not (root / "x" / "zarr.json").exists()
    assert view.lookup("/x/attributes.json") is None


def test_removing_a_block_removes_the_chunk_and_a_sharded_array_is_refused(
    tmp_path: Path,
) -> None:
    root = zarr_root(tmp_path, 3)
    values = np.arange(4 * 4, dtype="uint8").reshape(4, 4)
    metadata = {"dimensions": [4, 4], "blockSize": [2, 2], "dataType": "uint8"}
    view = n5_view(root)
    replay(view, "m", tensorstore_n5_files(tmp_path, metadata, values))
    assert (root / "m" / "c" / "1" / "0").is_file()
    view.unlink("/m/0/1")  # N5 block x=0, y=1: Zarr chunk (1, 0)
    assert not (root / "m" / "c" / "1" / "0").exists()
    assert (root / "m" / "c" / "0" / "1").is_file()

    group = zarr.open_group(str(root), mode="a")
    group.create_array("s", shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="uint8")
    view = n5_view(root)
    assert json.loads(view.read_file("/s/attributes.json"))["blockSize"] == [2, 2]
    block = dict(tensorstore_n5_files(tmp_path / "s", metadata, values))["0/0"]
    with pytest.raises(Rejected) as caught:
        put(view, "s/0/0", block)
    assert caught.value.rule == "sharding"
    assert [r.rule for r in view.gateway.rejections if r.path == "/s/0/0"] == ["sharding"]
    assert not (root / "s" / "c").exists()
