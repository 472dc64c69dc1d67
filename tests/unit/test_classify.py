"""The one classifier (n5fs/classify.py) and what it stands on: detection of invalid nodes,
context inherited from the hierarchy, consolidated documents that change only when they must,
and names that may never be symlinks."""

from __future__ import annotations

import json

import pytest

from n5fs.classify import Classifier
from n5fs.detect import Detector, FolderKind
from n5fs.errors import Rejected, errno_of
from n5fs.formats.base import KeyKind, chunk_like
from n5fs.formats.consolidation import ZarrV2Consolidation, ZarrV3Consolidation
from n5fs.gateway import Gateway
from n5fs.kvstore.memory import MemoryStore
from n5fs.validate import validate_store

ZARRAY = {
    "zarr_format": 2, "shape": [4, 4], "chunks": [2, 2], "dtype": "<u1", "compressor": None,
    "fill_value": 0, "order": "C", "filters": None,
}  # fmt: skip


def _store(files: dict[str, object]) -> MemoryStore:
    store = MemoryStore()
    for key, value in files.items():
        store.set(key, value if isinstance(value, bytes) else json.dumps(value).encode())
    return store


def _classify(store: MemoryStore, key: str) -> tuple[KeyKind, str]:
    verdict = Classifier(Detector(store)).classify(key, lambda: store.get(key) or b"")
    return verdict.kind, verdict.rule


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("0.0", True), ("c/0/1", True), ("c.3", True), ("-1.0", True), ("01/2", True),
        ("c", False), ("0.0.partial", False), (".0.0.XyZ123", False), ("0/0.__lock", False),
        ("README", False), ("", False), ("٣.0", False), ("0..1", False),
    ],
)  # fmt: skip
def test_chunk_like(key: str, expected: bool) -> None:
    assert chunk_like(key) is expected


@pytest.mark.parametrize("broken", [b"{not json", b"[]", json.dumps({"zarr_format": 3}).encode()])
def test_broken_zarray_is_an_invalid_node_not_a_plain_folder(broken: bytes) -> None:
    store = _store({"a/.zarray": broken, "a/0.0": b"\x00" * 4, "a/notes.txt": b"x"})
    with pytest.raises(Rejected):
        Detector(store).folder("a/")
    assert _classify(store, "a/0.0") == (KeyKind.INVALID, "node-invalid")
    assert _classify(store, "a/notes.txt") == (KeyKind.OTHER, "")
    report = validate_store(store)
    assert [f.key for f in report.invalid] == ["a/.zarray"]


def test_zarray_beside_zgroup_is_refused_by_both_paths() -> None:
    store = _store({"a/.zarray": ZARRAY, "a/.zgroup": {"zarr_format": 2}})
    assert [f.key for f in validate_store(store).invalid] == ["a/"]
    gw = Gateway(_store({"a/.zarray": ZARRAY}))
    with pytest.raises(Rejected) as info:
        gw.write_file("/a/.zgroup", b'{"zarr_format": 2}')
    assert info.value.rule == "array-and-group"


def test_hdmf_hierarchy_is_inherited_by_folders_without_marks() -> None:
    store = _store({
        ".zgroup": {"zarr_format": 2}, ".zattrs": {".specloc": "specifications"},
        "acq/.zgroup": {"zarr_format": 2},
    })  # fmt: skip
    detector = Detector(store)
    assert detector.folder("").fmt == "hdmf-zarr"
    assert detector.folder("acq/").fmt == "hdmf-zarr"
    assert Classifier(detector).metadata_format("acq/.zattrs", lambda: b"{}") is not None
    fmt = Classifier(detector).metadata_format("acq/.zattrs", lambda: b"{}")
    assert fmt is not None
    assert fmt.name == "hdmf-zarr"


def test_n5_attributes_in_an_n5_tree_are_parsed_even_without_n5_keys() -> None:
    store = _store({"attributes.json": {"n5": "4.0.0"}, "g/attributes.json": b"{broken"})
    with pytest.raises(Rejected):
        Detector(store).folder("g/")
    assert [f.key for f in validate_store(store).invalid] == ["g/attributes.json"]


def test_attributes_json_outside_n5_is_an_ordinary_file() -> None:
    store = _store({".zgroup": {"zarr_format": 2}, "attributes.json": b"not json at all"})
    assert _classify(store, "attributes.json") == (KeyKind.OTHER, "")
    assert validate_store(store).ok


def test_metadata_in_a_chunk_folder_is_invalid() -> None:
    zarray = {**ZARRAY, "dimension_separator": "/"}
    store = _store({"a/.zarray": zarray, "a/0/.zattrs": {}})
    assert _classify(store, "a/0/.zattrs") == (KeyKind.INVALID, "metadata-in-chunks")


# -- consolidated documents ----------------------------------------------------------------------


def test_v2_update_is_a_no_op_when_the_entry_is_already_true() -> None:
    cons = ZarrV2Consolidation()
    doc = {"zarr_consolidated_format": 1, "metadata": {"a/.zarray": ZARRAY}}
    assert cons.updated(".zmetadata", doc, "a/.zarray", dict(ZARRAY)) == doc
    grown = {**ZARRAY, "shape": [8, 4]}
    assert cons.updated(".zmetadata", doc, "a/.zarray", grown) == {
        "zarr_consolidated_format": 1, "metadata": {"a/.zarray": grown},
    }  # fmt: skip
    assert cons.updated(".zmetadata", doc, "a/.zarray", None) == {
        "zarr_consolidated_format": 1, "metadata": {},
    }  # fmt: skip
    assert cons.updated(".zmetadata", {"no": "metadata"}, "a/.zarray", ZARRAY) is None
    assert cons.documents("x/y/.zattrs") == ["x/y/.zmetadata", "x/.zmetadata", ".zmetadata"]
    assert cons.documents("x/0.0") == []


def test_v3_update_removes_a_whole_subtree_and_ignores_writer_quirks() -> None:
    cons = ZarrV3Consolidation()
    group = {"zarr_format": 3, "node_type": "group", "attributes": {}}
    block = {"kind": "inline", "must_understand": False, "metadata": {
        "g": {**group, "consolidated_metadata": None}, "g/a": {"node_type": "array"},
    }}  # fmt: skip
    root = {**group, "consolidated_metadata": block}
    # zarr-python writes a sub-group with its own (here null) block: the same node.
    assert cons.updated("zarr.json", root, "g/zarr.json", group) == root
    gone = cons.updated("zarr.json", root, "g/zarr.json", None)
    assert gone is not None
    assert gone["consolidated_metadata"]["metadata"] == {}
    stale = cons.stale_entries("zarr.json", root, {"zarr.json": root, "g/zarr.json": group})
    assert stale == ["'g/a' names nothing stored"]


# -- symlinks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".zattrs", ".zarray", "zarr.json", "attributes.json"])
def test_a_metadata_name_is_never_a_symlink(name: str) -> None:
    gw = Gateway(_store({
        ".zgroup": {"zarr_format": 2}, ".zattrs": {".specloc": "specifications"},
        "g/.zgroup": {"zarr_format": 2}, "target/.zgroup": {"zarr_format": 2},
    }))  # fmt: skip
    with pytest.raises(Rejected) as info:
        gw.symlink("../target", f"/g/{name}")
    assert (info.value.rule, errno_of(info.value)) == ("metadata-symlink", 22)
    assert [r.path for r in gw.rejections] == [f"/g/{name}"]
    assert gw.readdir("/g") == [(".zgroup", gw.stat("/g/.zgroup"))]
    gw.symlink("../target", "/g/ok")  # an ordinary link name still works
    assert gw.readlink("/g/ok") == "../target"
    assert Detector(gw.store).folder("g/").kind is FolderKind.GROUP
