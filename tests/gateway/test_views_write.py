"""Writes through ``--as zarr3`` / ``--as zarr2`` over an N5 store land as native N5.

zarr-python 3 cannot write through a :class:`~n5fs.views.base.View` without a mount, so it
writes to a memory store first and its files are replayed, in its order, into the view as
its ``LocalStore`` writes them on a mount: ``mkdir -p`` of the parent, the bytes into a
``.partial`` temp name, then a rename (or, for a create-if-absent, a hard link and an unlink)
into the real name. The store is then read natively (TensorStore's n5 driver), checked with
``n5fs validate``, and read back through the view by zarr-python. The real-mount test is in
``tests/mount/test_mount_views.py``.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import zarr
import zarr.codecs
from zarr.storage import MemoryStore

from n5fs.cli.main import main
from n5fs.errors import KeyExists, ReadOnly, Rejected, errno_of
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore import open_store
from n5fs.views import open_view
from n5fs.views.base import View


def n5_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    return root


def writable_view(root: Path, fmt: str = "zarr3") -> View:
    view = open_view(Gateway(open_store(str(root)), GatewayConfig()), fmt)
    assert not view.read_only
    return view


def zarr_files(write: Any) -> dict[str, bytes]:
    """What zarr-python writes, in its order (a memory store keeps insertion order)."""
    store = MemoryStore()
    write(zarr.open_group(store, mode="a"))
    return {key: bytes(buf.to_bytes()) for key, buf in store._store_dict.items()}


def mkdir_p(view: View, key: str) -> None:
    parts = key.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        if view.lookup(path) is None:
            view.mkdir(path)


def put(view: View, key: str, data: bytes, *, exclusive: bool = False) -> None:
    """zarr-python's LocalStore._put, as a mount sees it."""
    mkdir_p(view, key)
    tmp = "/" + key + ".0123abcd.partial"
    fh = view.create(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view.write(fh, data, 0)
        view.flush(fh)
    finally:
        view.release(fh)
    if exclusive:
        try:
            view.link(tmp, "/" + key)
        finally:
            view.unlink(tmp)
    else:
        view.rename(tmp, "/" + key)


def replay(view: View, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        put(view, key, data)


def read_back(view: View, prefix: str) -> MemoryStore:
    """The view's files under ``prefix`` (and the root's metadata), in a memory store."""
    store = MemoryStore()
    from zarr.core.buffer import default_buffer_prototype

    proto = default_buffer_prototype()

    def visit(path: str) -> None:
        for name, attr in view.readdir(path):
            child = f"{path.rstrip('/')}/{name}"
            if attr.kind.value == "dir":
                visit(child)
            else:
                store._store_dict[child.lstrip("/")] = proto.buffer.from_bytes(
                    view.read_file(child)
                )

    store._store_dict["zarr.json"] = proto.buffer.from_bytes(view.read_file("/zarr.json"))
    visit("/" + prefix)
    return store


def n5_values(root: Path, path: str) -> np.ndarray[Any, Any]:
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(root / path)}}
    return np.asarray(ts.open(spec).result().read().result())


def validate_clean(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code = main(["validate", str(root)])
    out = capsys.readouterr()
    assert code == 0, out


@pytest.mark.parametrize(
    ("dtype", "compressors", "n5_type"),
    [
        ("<i4", zarr.codecs.ZstdCodec(level=2), "zstd"),
        (">u2", zarr.codecs.GzipCodec(level=4), "gzip"),
        ("<f8", zarr.codecs.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle"), "blosc"),
        ("<i8", None, "raw"),
    ],
)
def test_zarr_python_3_writes_land_as_n5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: str, compressors: Any, n5_type: str
) -> None:
    root = n5_root(tmp_path)
    values = (np.arange(7 * 5 * 3).reshape(7, 5, 3) + 1).astype(dtype)

    def write(group: zarr.Group) -> None:
        kwargs: dict[str, Any] = {} if compressors is None else {"compressors": compressors}
        if compressors is None:
            kwargs["compressors"] = None
        array = group.create_array(
            "vol", shape=values.shape, chunks=(3, 2, 2), dtype=dtype, attributes={"a": 1}, **kwargs
        )
        array[...] = values

    view = writable_view(root)
    replay(view, zarr_files(write))
    view.close()

    attrs = json.loads((root / "vol" / "attributes.json").read_text())
    assert attrs["dimensions"] == [3, 5, 7]
    assert attrs["blockSize"] == [2, 2, 3]
    assert attrs["compression"]["type"] == n5_type
    assert attrs["a"] == 1
    assert json.loads((root / "attributes.json").read_text())["n5"] == "4.0.0"
    np.testing.assert_array_equal(n5_values(root, "vol"), values.T)
    assert not list(root.rglob("*.partial"))
    assert not (root / "vol" / "zarr.json").exists()
    validate_clean(root, capsys)

    view = open_view(Gateway(open_store(str(root)), GatewayConfig(read_only=True)), "zarr3")
    array = zarr.open_array(read_back(view, "vol"), path="vol", mode="r")
    np.testing.assert_array_equal(array[...], values)


def test_end_blocks_are_clipped_as_n5_java_writes_them(tmp_path: Path) -> None:
    root = n5_root(tmp_path)
    values = np.arange(1, 8, dtype="<u1")

    def write(group: zarr.Group) -> None:
        group.create_array("v", shape=(7,), chunks=(3,), dtype="u1", compressors=None)[...] = values

    view = writable_view(root)
    replay(view, zarr_files(write))
    view.close()
    last = (root / "v" / "2").read_bytes()
    assert last[:4] == bytes([0, 0, 0, 1])  # default mode, one dimension
    assert last[4:8] == (1).to_bytes(4, "big")  # clipped: 1 element, not 3
    assert last[8:] == bytes([7])


def test_chunks_at_the_views_own_keys_and_their_deletion(tmp_path: Path) -> None:
    """A writer that opens the array through a later mount's view writes its flat ``z.y``
    keys (the view's document: big-endian)."""
    root = n5_root(tmp_path)
    view = writable_view(root)
    replay(
        view, zarr_files(lambda g: g.create_array("m", shape=(4, 4), chunks=(2, 2), dtype="<i2"))
    )
    view = writable_view(root)  # a later mount: the view's own document
    doc = json.loads(view.read_file("/m/zarr.json"))
    assert doc["chunk_key_encoding"]["configuration"]["separator"] == "."
    store = MemoryStore()
    store._store_dict["m/zarr.json"] = (
        zarr.core.buffer.default_buffer_prototype().buffer.from_bytes(json.dumps(doc).encode())
    )
    values = np.arange(16, dtype=">i2").reshape(4, 4) + 1
    zarr.open_array(store, path="m", mode="r+")[...] = values
    chunks = {k: v for k, v in zarr_files_of(store).items() if k != "m/zarr.json"}
    assert sorted(chunks) == ["m/0.0", "m/0.1", "m/1.0", "m/1.1"]
    for key, data in chunks.items():
        put(view, key, data)
    np.testing.assert_array_equal(n5_values(root, "m"), values.T)
    view.unlink("/m/1.0")
    assert not (root / "m" / "0" / "1").exists()
    assert view.lookup("/m/1.0") is None


def zarr_files_of(store: MemoryStore) -> dict[str, bytes]:
    return {key: bytes(buf.to_bytes()) for key, buf in store._store_dict.items()}


def test_what_n5_cannot_hold_is_refused_with_a_rejection(tmp_path: Path) -> None:
    root = n5_root(tmp_path)
    view = writable_view(root)
    files = zarr_files(
        lambda g: g.create_array(
            "c", shape=(4,), chunks=(2,), dtype="<i4", compressors=zarr.codecs.Crc32cCodec()
        )
    )
    with pytest.raises(Rejected) as caught:
        put(view, "c/zarr.json", files["c/zarr.json"], exclusive=True)
    assert errno_of(caught.value) == errno.EINVAL
    assert caught.value.rule == "codec"
    assert "crc32c" in caught.value.message
    refused = [r for r in view.gateway.rejections if r.path == "/c/zarr.json"]
    assert refused
    assert refused[0].rule == "codec"
    assert not (root / "c" / "attributes.json").exists()
    filled = zarr_files(
        lambda g: g.create_array("f", shape=(4,), chunks=(2,), dtype="<i4", fill_value=7)
    )
    with pytest.raises(Rejected, match="fill value"):
        put(view, "f/zarr.json", filled["f/zarr.json"])


def test_zarr2_view_writes_and_group_attributes(tmp_path: Path) -> None:
    root = n5_root(tmp_path)
    view = writable_view(root, "zarr2")
    store = MemoryStore()
    group = zarr.open_group(store, mode="a", zarr_format=2)
    group.attrs["title"] = "t"
    array = group.create_array(
        "w", shape=(5, 3), chunks=(2, 2), dtype="<u4", compressors=numcodecs.Zlib(level=1)
    )
    values = np.arange(15, dtype="<u4").reshape(5, 3) + 1
    array[...] = values
    replay(view, zarr_files_of(store))
    assert json.loads((root / "attributes.json").read_text()) == {"n5": "4.0.0", "title": "t"}
    np.testing.assert_array_equal(n5_values(root, "w"), values.T)
    compression = json.loads((root / "w" / "attributes.json").read_text())["compression"]
    assert compression == {"type": "gzip", "useZlib": True, "level": 1}


def test_read_only_views_and_exclusive_links(tmp_path: Path) -> None:
    root = n5_root(tmp_path)
    npy = open_view(Gateway(open_store(str(root)), GatewayConfig()), "npy")
    assert npy.read_only
    with pytest.raises(ReadOnly):
        npy.create("/x", os.O_WRONLY)
    view = writable_view(root)
    files = zarr_files(lambda g: g.create_array("e", shape=(2,), chunks=(2,), dtype="<i4"))
    put(view, "e/zarr.json", files["e/zarr.json"], exclusive=True)
    with pytest.raises(KeyExists):
        put(view, "e/zarr.json", files["e/zarr.json"], exclusive=True)


def test_the_writer_reads_its_chunks_back_in_its_own_encoding(tmp_path: Path) -> None:
    """zarr-python keeps the document it wrote (``c/0/0`` keys, little-endian): a partial
    update reads a chunk at that key and must get it in those terms, not the view's."""
    root = n5_root(tmp_path)
    view = writable_view(root)
    values = np.arange(1, 17, dtype="<i4").reshape(4, 4)
    store = MemoryStore()
    zarr.open_group(store, mode="a").create_array("p", shape=(4, 4), chunks=(2, 2), dtype="<i4")[
        ...
    ] = values
    written = zarr_files_of(store)
    replay(view, written)
    assert view.read_file("/p/c/1/0") == written["p/c/1/0"]
    assert view.stat("/p/c/1/0").size == len(written["p/c/1/0"])
    assert view.lookup("/p/c/5/0") is None
    assert view.read_file("/p/zarr.json") == written["p/zarr.json"]
    assert dict(view.readdir("/p"))["zarr.json"].size == len(written["p/zarr.json"])
    later = open_view(Gateway(open_store(str(root)), GatewayConfig(read_only=True)), "zarr3")
    doc = json.loads(later.read_file("/p/zarr.json"))
    assert doc["codecs"][0]["configuration"]["endian"] == "big"
    assert later.lookup("/p/c/1/0") is None
    assert later.lookup("/p/1.0") is not None


def test_a_zarr2_writer_reads_its_little_endian_chunks_at_the_views_names(
    tmp_path: Path,
) -> None:
    """In v2 the writer's chunk names are the view's own (``1.0``): within the mount they are
    served in the writer's byte order, so a partial update reads the values it wrote."""
    root = n5_root(tmp_path)
    view = writable_view(root, "zarr2")
    store = MemoryStore()
    group = zarr.open_group(store, mode="a", zarr_format=2)
    group.create_array("q", shape=(4, 4), chunks=(2, 2), dtype="<i4")[...] = np.arange(16).reshape(
        4, 4
    )
    written = zarr_files_of(store)
    replay(view, written)
    assert view.read_file("/q/1.0") == written["q/1.0"]
    assert json.loads(view.read_file("/q/.zarray"))["dtype"] == "<i4"


def test_plain_files_of_a_group_are_written_as_stored(tmp_path: Path) -> None:
    root = n5_root(tmp_path)
    (root / "README").write_text("old")
    view = writable_view(root)
    fh = view.create("/README", os.O_WRONLY | os.O_TRUNC)
    view.write(fh, b"new", 0)
    view.flush(fh)
    view.release(fh)
    assert (root / "README").read_text() == "new"
    fh = view.create("/notes.txt", os.O_WRONLY | os.O_CREAT)
    view.write(fh, b"staged", 0)
    view.release(fh)
    assert view.read_file("/notes.txt") == b"staged"  # staged in the view, never stored
    assert not (root / "notes.txt").exists()
    view.unlink("/notes.txt")
    assert view.lookup("/notes.txt") is None


@pytest.mark.parametrize(
    ("fmt", "compression"),
    [
        ("zarr3", {"type": "gzip"}),  # TensorStore stores "level": -1 (N5's default); shown as 6
        ("zarr2", {"type": "gzip"}),
        ("zarr2", {"type": "gzip", "useZlib": True}),
        ("zarr3", {"type": "gzip", "useZlib": True}),  # no zlib in v3: shown raw, decoded
        ("zarr3", {"type": "bzip2"}),  # shown raw, decoded
        ("zarr3", {"type": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2}),
    ],
)
def test_the_views_own_document_written_back_changes_no_compression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str, compression: dict[str, Any]
) -> None:
    """zarr-python re-saves an array's metadata (``arr.attrs[...] = ...``) by writing back the
    document it read, the view's: a document whose compression is the one the view shows for
    the stored one changes no compression (the chunks stay), while a real change is still
    refused while chunks exist."""
    from tests.writers import tensorstore_n5

    root = n5_root(tmp_path)
    values = np.arange(4 * 6, dtype="uint16").reshape(4, 6) + 1
    tensorstore_n5(root / "a", values, [3, 4], compression)
    stored = json.loads((root / "a" / "attributes.json").read_text())["compression"]
    view = writable_view(root, fmt)
    name = "zarr.json" if fmt == "zarr3" else ".zarray"
    doc = view.read_file(f"/a/{name}")
    put(view, f"a/{name}", doc)  # written back unchanged

    store = MemoryStore()
    proto = zarr.core.buffer.default_buffer_prototype()
    store._store_dict[f"a/{name}"] = proto.buffer.from_bytes(doc)
    array = zarr.open_array(store, path="a", mode="r+", zarr_format=3 if fmt == "zarr3" else 2)
    array.attrs["x"] = 1
    array[0:4, 0:3] = 99  # one whole chunk, in the view's codecs: stored in N5's
    for key, data in zarr_files_of(store).items():
        put(view, key, data)
    attrs = json.loads((root / "a" / "attributes.json").read_text())
    assert attrs["compression"] == stored
    assert attrs["x"] == 1
    values[0:3, 0:4] = 99
    np.testing.assert_array_equal(n5_values(root, "a"), values)
    validate_clean(root, capsys)

    changed = json.loads(doc)
    if fmt == "zarr3":
        changed["codecs"] = [changed["codecs"][0], {"name": "zstd", "configuration": {"level": 1}}]
    else:
        changed["compressor"] = {"id": "zstd", "level": 1}
    with pytest.raises(Rejected) as caught:
        put(view, f"a/{name}", json.dumps(changed).encode())
    assert caught.value.rule == "structural-change"
    assert json.loads((root / "a" / "attributes.json").read_text())["compression"] == stored
