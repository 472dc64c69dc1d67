"""hdmf-zarr: Zarr v2 plus reserved attributes; links; reference arrays never unpickled.

The store is laid out as hdmf-zarr (< 0.14, Zarr v2) writes NWB files: groups and plain arrays
by zarr-python 3, reserved attributes as hdmf-zarr's ZarrIO sets them. zarr-python 3 refuses
to create generic object arrays, so reference arrays get the ``.zarray`` zarr-python 2 wrote
for hdmf-zarr and chunk bytes from numcodecs' Pickle/JSON codecs, the very encoders zarr 2
called; ``.zmetadata`` is consolidated as zarr-python 2 did (zarr 3 cannot open these arrays).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from n5fs.errors import NotSupported, Rejected
from n5fs.formats.base import KeyKind
from n5fs.formats.hdmf import (
    HdmfArrayNode,
    HdmfAttrsNode,
    HdmfConsolidatedNode,
    HdmfGroupNode,
    HdmfLink,
    HdmfZarrFormat,
    is_hdmf_attrs,
    link_targets,
    parse_links,
    symlink_target,
    with_link,
)
from n5fs.formats.zarr2 import (
    REFERENCE_PICKLE_GLOBALS,
    Zarr2ArrayNode,
    Zarr2Format,
    Zarr2GroupNode,
)
from n5fs.gateway import Gateway
from n5fs.kvstore.memory import MemoryStore

HDMF = HdmfZarrFormat()
ZARR2 = Zarr2Format()
DEVICE = "/general/devices/array"
REFERENCE = {"source": ".", "path": DEVICE, "object_id": "6f2c", "source_object_id": "a1b2"}


def _object_zarray(codec: dict[str, Any], n: int) -> dict[str, Any]:
    """The ``.zarray`` zarr-python 2 wrote for hdmf-zarr's object datasets."""
    return {
        "zarr_format": 2,
        "shape": [n],
        "chunks": [n],
        "dtype": "|O",
        "fill_value": 0,
        "order": "C",
        "filters": [codec],
        "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    }


def _write_object_array(root: Path, codec: Any, values: list[Any], attrs: dict[str, Any]) -> None:
    root.mkdir(parents=True)
    zarray = _object_zarray(codec.get_config(), len(values))
    (root / ".zarray").write_text(json.dumps(zarray))
    (root / ".zattrs").write_text(json.dumps(attrs))
    chunk = codec.encode(np.array(values, dtype=object))
    (root / "0").write_bytes(bytes(numcodecs.Blosc(cname="lz4").encode(chunk)))


@pytest.fixture
def nwb(tmp_path: Path) -> Path:
    """A small NWB-like hdmf-zarr store."""
    root = tmp_path / "file.nwb.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top = zarr.open_group(str(root), mode="w", zarr_format=2)
        top.attrs.update(
            {
                ".specloc": "specifications",
                "namespace": "core",
                "neurodata_type": "NWBFile",
                "object_id": "a1b2",
            }
        )
        device = top.create_group("general/devices/array")
        device.attrs.update({"namespace": "core", "neurodata_type": "Device", "object_id": "6f2c"})
        acq = top.create_group("acquisition")
        acq.attrs["zarr_link"] = [
            {"name": "device", "source": ".", "path": DEVICE},
            {"name": "other", "source": "../other.nwb.zarr", "path": "/x"},
        ]
        data = top.create_array("acquisition/ts/data", shape=(10,), chunks=(4,), dtype="<f4")
        data[:] = np.arange(10, dtype="<f4")
        data.attrs["zarr_dtype"] = "float32"
        top.create_group("specifications/core/2.6.0")
    _write_object_array(
        root / "refs_pickle", numcodecs.Pickle(), [REFERENCE, REFERENCE], {"zarr_dtype": "object"}
    )
    _write_object_array(root / "refs_json", numcodecs.JSON(), [REFERENCE], {"zarr_dtype": "object"})
    _write_object_array(
        root / "specifications/core/2.6.0/namespace",
        numcodecs.JSON(),
        ['{"namespaces": []}'],
        {"zarr_dtype": "scalar"},
    )
    _consolidate(root)
    return root


def _consolidate(root: Path) -> None:
    """``.zmetadata`` as zarr-python 2 wrote it (zarr 3 cannot read the object arrays)."""
    entries = {
        p.relative_to(root).as_posix(): json.loads(p.read_text())
        for p in sorted(root.rglob(".z*"))
        if p.name in (".zarray", ".zgroup", ".zattrs")
    }
    doc = {"zarr_consolidated_format": 1, "metadata": entries}
    (root / ".zmetadata").write_text(json.dumps(doc, indent=4, sort_keys=True))


def _probes(folder: Path) -> dict[str, bytes]:
    return {n: (folder / n).read_bytes() for n in HDMF.probe_names if (folder / n).exists()}


def test_every_folder_of_the_store_is_valid(nwb: Path) -> None:
    seen = 0
    for folder in [nwb, *(p for p in nwb.rglob("*") if p.is_dir())]:
        probes = _probes(folder)
        if not probes:
            continue
        assert ZARR2.matches(probes)  # hdmf-zarr refines zarr2: every folder is zarr2
        node = HDMF.node_from_probes(probes, path=str(folder))
        if isinstance(node, HdmfArrayNode):
            for key in os.listdir(folder):
                found = node.classify(key)
                if found.kind is KeyKind.CHUNK:
                    assert found.position is not None
                    node.validate_chunk(found.position, (folder / key).read_bytes())
                    seen += 1
    assert seen == 6  # 3 float chunks, 3 object chunks


@pytest.mark.parametrize(
    ("folder", "hdmf"),
    [
        ("", True),
        ("acquisition", True),
        ("general/devices/array", True),
        ("refs_pickle", True),
        ("acquisition/ts/data", True),
        ("general", False),
        ("general/devices", False),
    ],
)
def test_detection_needs_hdmf_marks(nwb: Path, folder: str, hdmf: bool) -> None:
    probes = _probes(nwb / folder)
    assert ZARR2.matches(probes)
    assert HDMF.matches(probes) is hdmf


def test_nodes_carry_links(nwb: Path) -> None:
    acq = HDMF.node_from_probes(_probes(nwb / "acquisition"))
    assert isinstance(acq, HdmfGroupNode)
    assert acq.links == {"device": "general/devices/array"}
    attrs = HDMF.parse_metadata(".zattrs", (nwb / "acquisition/.zattrs").read_bytes())
    assert isinstance(attrs, HdmfAttrsNode)
    assert attrs.links == acq.links


def test_links_keep_external_ones_apart(nwb: Path) -> None:
    attrs = json.loads((nwb / "acquisition/.zattrs").read_text())
    links = parse_links(attrs)
    assert links == (HdmfLink("device", ".", DEVICE), HdmfLink("other", "../other.nwb.zarr", "/x"))
    assert [link.internal for link in links] == [True, False]
    assert link_targets(attrs) == {"device": "general/devices/array"}
    assert link_targets({}) == {}


@pytest.mark.parametrize(
    ("folder", "target", "expected"),
    [
        ("acquisition", "general/devices/array", "../general/devices/array"),
        ("", "general/devices/array", "general/devices/array"),
        ("a/b/c", "a/x", "../../x"),
        ("a", "", ".."),
    ],
)
def test_symlink_targets_are_relative(folder: str, target: str, expected: str) -> None:
    assert symlink_target(folder, target) == expected


def test_with_link_adds_and_replaces() -> None:
    attrs = {"zarr_link": [{"name": "a", "source": ".", "path": "/x"}], "doc": "kept"}
    added = with_link(attrs, "b", "general/devices/array")
    assert link_targets(added) == {"a": "x", "b": "general/devices/array"}
    assert added["zarr_link"][1] == {"name": "b", "source": ".", "path": DEVICE}
    assert link_targets(with_link(added, "a", "y/z")) == {"b": "general/devices/array", "a": "y/z"}
    assert added["doc"] == "kept"
    with pytest.raises(Rejected):
        with_link(attrs, "bad/name", "x")


def test_consolidated_metadata_uses_hdmf_nodes(nwb: Path) -> None:
    node = HDMF.parse_metadata(".zmetadata", (nwb / ".zmetadata").read_bytes())
    assert isinstance(node, HdmfConsolidatedNode)
    assert isinstance(node.entries["refs_pickle/.zarray"], HdmfArrayNode)
    assert isinstance(node.entries["acquisition/.zgroup"], HdmfGroupNode)
    doc = json.loads((nwb / ".zmetadata").read_text())
    doc["metadata"]["acquisition/.zattrs"]["zarr_link"] = [{"name": "x"}]
    with pytest.raises(Rejected) as info:
        HDMF.parse_metadata(".zmetadata", json.dumps(doc).encode(), path=".zmetadata")
    assert (info.value.rule, info.value.fmt) == ("zarr-link", "hdmf-zarr")
    ZARR2.parse_metadata(".zmetadata", json.dumps(doc).encode())  # plain v2 has no such rule


INVALID_ATTRS: list[tuple[dict[str, Any], str]] = [
    ({"zarr_link": {"name": "a", "source": ".", "path": "/x"}}, "zarr-link"),
    ({"zarr_link": ["a"]}, "zarr-link"),
    ({"zarr_link": [{"name": "a", "source": "."}]}, "zarr-link"),
    ({"zarr_link": [{"name": "a", "source": 1, "path": "/x"}]}, "zarr-link"),
    ({"zarr_link": [{"name": "", "source": ".", "path": "/x"}]}, "zarr-link"),
    ({"zarr_link": [{"name": "a/b", "source": ".", "path": "/x"}]}, "zarr-link"),
    ({"zarr_link": [{"name": "..", "source": ".", "path": "/x"}]}, "zarr-link"),
    ({"zarr_link": [{"name": "a", "source": ".", "path": "/../etc"}]}, "zarr-link"),
    *(
        ({"zarr_link": [{"name": "a", "source": source, "path": "/x"}]}, "zarr-link")
        for source in (
            "/data/other.nwb.zarr",
            "\\\\server\\x.zarr",
            "C:\\x.zarr",
            "D:/x.zarr",
            "s3://bucket/x.zarr",
            "file:///x.zarr",
        )
    ),
    (
        {
            "zarr_link": [
                {"name": "a", "source": ".", "path": "/x"},
                {"name": "a", "source": ".", "path": "/y"},
            ]
        },
        "zarr-link",
    ),
    ({"zarr_dtype": 3}, "zarr-dtype"),
    ({"zarr_dtype": ""}, "zarr-dtype"),
    ({"zarr_dtype": [{"name": "x"}]}, "zarr-dtype"),
    ({"zarr_dtype": [["x", "int32"]]}, "zarr-dtype"),
    ({"zarr_dtype": "bogus"}, "zarr-dtype"),
    ({"zarr_dtype": "f8"}, "zarr-dtype"),  # a typestr always carries its byte order
    ({"zarr_dtype": "Float32"}, "zarr-dtype"),
    ({"zarr_dtype": [{"name": "x", "dtype": "bogus"}]}, "zarr-dtype"),
    ({".specloc": 1}, "specloc"),
    ({".specloc": "/"}, "specloc"),
    ({".specloc": "a/../../b"}, "specloc"),
]


@pytest.mark.parametrize(
    ("attrs", "rule"), INVALID_ATTRS, ids=[f"{r}:{json.dumps(a)[:40]}" for a, r in INVALID_ATTRS]
)
def test_malformed_reserved_attributes_refused(attrs: dict[str, Any], rule: str) -> None:
    data = json.dumps(attrs).encode()
    with pytest.raises(Rejected) as info:
        HDMF.parse_metadata(".zattrs", data, path="g/.zattrs")
    assert (info.value.rule, info.value.fmt, info.value.path) == (rule, "hdmf-zarr", "g/.zattrs")
    assert ZARR2.parse_metadata(".zattrs", data).attributes == attrs


#: what hdmf-zarr 0.13 wrote: its markers, its mapping's names, the type names it resolved,
#: and its iterative writer's ``np.dtype(...).str``
WRITTEN_ZARR_DTYPES = (
    "scalar", "object", "text", "isodatetime", "str", "bytes", "int16", "float64", "bool",
    "bool_", "str_", "bytes_", "<U0", "|S0", "|b1", "|O", "<M8[ns]", "|V16",
)  # fmt: skip


@pytest.mark.parametrize(
    "attrs",
    [
        {
            "zarr_dtype": [
                {"name": "idx", "dtype": "int32"},
                {"name": "ref", "dtype": {"target_type": "X"}},
            ]
        },
        {"zarr_dtype": "<i8", ".specloc": "/specifications"},
        *({"zarr_dtype": name} for name in WRITTEN_ZARR_DTYPES),
        {"zarr_dtype": [{"name": "x", "dtype": "float64"}, {"name": "r", "dtype": "object"}]},
        {"zarr_link": []},
        # hdmf-zarr's relpath of another file: relative to this file's root
        {"zarr_link": [{"name": "a", "source": "../other.nwb.zarr", "path": "/x"}]},
        {"zarr_link": [{"name": "a", "source": "other.nwb.zarr", "path": "/x"}]},
        {"zarr_link": [{"name": "a", "source": "a:b.zarr", "path": "/x"}]},
    ],
)
def test_wellformed_reserved_attributes_accepted(attrs: dict[str, Any]) -> None:
    assert HDMF.parse_metadata(".zattrs", json.dumps(attrs).encode()).attributes == attrs


def test_unknown_zarr_dtype_names_the_value_and_the_allowed_ones() -> None:
    with pytest.raises(Rejected) as info:
        HDMF.parse_metadata(".zattrs", b'{"zarr_dtype": "bogus"}', path="d/.zattrs")
    message = str(info.value)
    assert "'bogus'" in message
    for allowed in ("'scalar'", "'object'", "'float32'", "'isodatetime'", "'str_'", "'<f8'"):
        assert allowed in message


def test_gateway_refuses_an_unknown_zarr_dtype(nwb: Path) -> None:
    """Copied into a gateway, the store takes a good ``zarr_dtype`` and refuses ``"bogus"``."""
    with Gateway(MemoryStore()) as gw:
        for path in sorted(p for p in nwb.rglob("*") if p.is_file()):
            gw.write_file(f"/{path.relative_to(nwb).as_posix()}", path.read_bytes())
        attrs = "/acquisition/ts/data/.zattrs"
        gw.write_file(attrs, json.dumps({"zarr_dtype": "<f4"}).encode())
        with pytest.raises(Rejected) as info:
            gw.write_file(attrs, json.dumps({"zarr_dtype": "bogus"}).encode())
        assert (info.value.rule, info.value.fmt) == ("zarr-dtype", "hdmf-zarr")
        assert "'bogus'" in str(info.value)
        assert json.loads(gw.read_file(attrs)) == {"zarr_dtype": "<f4"}


def test_hdmf_marks() -> None:
    assert is_hdmf_attrs({"namespace": "core", "neurodata_type": "NWBFile"})
    assert not is_hdmf_attrs({"namespace": "core"})
    assert is_hdmf_attrs({".specloc": "specifications"})
    assert not is_hdmf_attrs(["zarr_link"])
    assert not HDMF.matches({".zgroup": b'{"zarr_format": 2}', ".zattrs": b"\xff"})


class _Payload:
    """Unpickling this would create ``target``: a stand-in for any command."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.target), "w"))


def test_malicious_reference_array_never_executes(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    folder = tmp_path / "refs"
    _write_object_array(
        folder, numcodecs.Pickle(), [REFERENCE, _Payload(target)], {"zarr_dtype": "object"}
    )
    node = HDMF.node_from_probes(_probes(folder), path="refs")
    assert isinstance(node, HdmfArrayNode)
    data = (folder / "0").read_bytes()
    with pytest.raises(Rejected) as info:
        node.validate_chunk((0,), data, path="refs/0")
    assert (info.value.rule, info.value.path, info.value.fmt) == (
        "pickle-global",
        "refs/0",
        "hdmf-zarr",
    )
    assert "open" in str(info.value)
    with pytest.raises(Rejected) as decoded:
        node.decode_chunk((0,), data)
    assert decoded.value.rule == "unsafe-codec"
    assert not target.exists()


@settings(max_examples=300, deadline=None)
@given(
    attrs=st.dictionaries(
        st.sampled_from(["zarr_link", "zarr_dtype", ".specloc", "namespace", "neurodata_type"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=6),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["name", "source", "path", "dtype"]), inner, max_size=4
                )
            ),
            max_leaves=10,
        ),
    )
)
def test_arbitrary_reserved_attributes_only_rejected(attrs: dict[str, Any]) -> None:
    data = json.dumps(attrs).encode()
    try:
        node = HDMF.parse_metadata(".zattrs", data)
    except Rejected:
        return
    assert isinstance(node, HdmfAttrsNode)
    assert set(node.links) <= {link.name for link in parse_links(attrs)}


# --- hdmf-zarr's pickled references -----------------------------------------------------------


class ZarrReference(dict):  # type: ignore[type-arg]
    """Stands for ``hdmf_zarr.utils.ZarrReference`` (a dict subclass) where hdmf-zarr is not
    installed; pickled under that module's name (tests/mount/test_nwb.py uses the real one)."""


@pytest.fixture
def zarr_reference(monkeypatch: pytest.MonkeyPatch) -> type[ZarrReference]:
    package, module = types.ModuleType("hdmf_zarr"), types.ModuleType("hdmf_zarr.utils")
    module.ZarrReference = ZarrReference  # type: ignore[attr-defined]
    package.utils = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hdmf_zarr", package)
    monkeypatch.setitem(sys.modules, "hdmf_zarr.utils", module)
    monkeypatch.setattr(ZarrReference, "__module__", "hdmf_zarr.utils")
    return ZarrReference


def _zarr2_probes(folder: Path) -> dict[str, bytes]:
    return {n: (folder / n).read_bytes() for n in (".zarray", ".zgroup") if (folder / n).exists()}


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickled_zarr_references_accepted_in_v2_object_arrays(
    tmp_path: Path, zarr_reference: type[ZarrReference], protocol: int
) -> None:
    folder = tmp_path / "electrodes/group"
    ref = zarr_reference(**REFERENCE)
    attrs = {"zarr_dtype": "object", "namespace": "hdmf-common", "neurodata_type": "VectorData"}
    _write_object_array(folder, numcodecs.Pickle(protocol=protocol), [ref, ref, ref], attrs)
    data = (folder / "0").read_bytes()
    assert b"ZarrReference" in numcodecs.Blosc().decode(data)
    node = HDMF.node_from_probes(_probes(folder), path="electrodes/group")
    assert isinstance(node, HdmfArrayNode)
    node.validate_chunk((0,), data, path="electrodes/group/0")
    with pytest.raises(Rejected) as decoded:  # accepted is not unpickled
        node.decode_chunk((0,), data)
    assert decoded.value.rule == "unsafe-codec"
    # Also without hdmf-zarr's marks: cp -r may copy the chunk before any of them.
    plain = ZARR2.node_from_probes(_zarr2_probes(folder), path="electrodes/group")
    assert isinstance(plain, Zarr2ArrayNode)
    assert not isinstance(plain, HdmfArrayNode)
    plain.validate_chunk((0,), data, path="electrodes/group/0")


def test_the_hdmf_allow_list_is_exact(zarr_reference: type[ZarrReference]) -> None:
    """Only the reference class: nothing else of hdmf_zarr, nothing near its name."""
    assert frozenset({"hdmf_zarr.utils.ZarrReference"}) == REFERENCE_PICKLE_GLOBALS
    node = HDMF.parse_metadata(".zarray", json.dumps(_object_zarray({"id": "pickle"}, 1)).encode())
    assert isinstance(node, HdmfArrayNode)
    good = pickle.dumps(np.array([zarr_reference(**REFERENCE)], dtype=object), protocol=5)
    for fake in (b"hdmf_zarr.utilsX", b"hdmf_zarr.backend"):
        forged = good.replace(b"\x8c\x0fhdmf_zarr.utils", b"\x8c\x10" + fake[:16])
        assert forged != good
        with pytest.raises(Rejected) as info:
            node.validate_chunk((0,), numcodecs.Blosc(cname="lz4").encode(forged))
        assert info.value.rule == "pickle-global"
    node.validate_chunk((0,), numcodecs.Blosc(cname="lz4").encode(good))


# --- claims -----------------------------------------------------------------------------------


def _never() -> bytes:
    raise AssertionError("the name and context were enough: content must not be read")


@pytest.mark.parametrize("name", [".zarray", ".zgroup", ".zattrs", ".zmetadata"])
def test_hdmf_claims_zarr2_names_inside_its_hierarchy(name: str) -> None:
    assert HDMF.claims(name, "hdmf-zarr", _never)
    if name != ".zattrs":
        assert not HDMF.claims(name, None, _never)
        assert not HDMF.claims(name, "zarr2", _never)


@pytest.mark.parametrize(
    ("attrs", "claimed"),
    [
        (b'{"namespace": "core", "neurodata_type": "NWBFile"}', True),
        (b'{"zarr_link": []}', True),
        (b'{".specloc": "specifications"}', True),
        (b'{"namespace": "core"}', False),
        (b'{"title": "plain zarr"}', False),
        (b"\xff not json", False),
        (b'["zarr_link"]', False),
    ],
)
def test_hdmf_claims_a_zattrs_by_its_marks(attrs: bytes, claimed: bool) -> None:
    for context in (None, "zarr2", "n5"):
        assert HDMF.claims(".zattrs", context, lambda: attrs) is claimed


@pytest.mark.parametrize("name", ["zarr.json", "attributes.json", "0.0", "notes.txt"])
def test_hdmf_claims_nothing_else(name: str) -> None:
    assert not HDMF.claims(name, "hdmf-zarr", _never)


# --- links and link_update --------------------------------------------------------------------


def _group(attrs: dict[str, Any]) -> HdmfGroupNode:
    node = HDMF.node_from_probes(
        {".zgroup": b'{"zarr_format": 2}', ".zattrs": json.dumps(attrs).encode()}
    )
    assert isinstance(node, HdmfGroupNode)
    return node


def test_links_of_an_hdmf_group(nwb: Path) -> None:
    acq = HDMF.node_from_probes(_probes(nwb / "acquisition"))
    assert HDMF.links(acq) == {"device": "general/devices/array"}  # the external one left out
    data = HDMF.node_from_probes(_probes(nwb / "acquisition/ts/data"))
    assert isinstance(data, HdmfArrayNode)
    assert HDMF.links(data) == {}
    assert HDMF.links(None) == {}
    plain = ZARR2.node_from_probes(_probes(nwb / "acquisition"))
    assert isinstance(plain, Zarr2GroupNode)
    assert HDMF.links(plain) == {}  # not an hdmf-zarr node
    assert ZARR2.links(plain) == {}


def test_link_update_adds_replaces_and_removes() -> None:
    attrs = {
        "namespace": "core",
        "neurodata_type": "ElectrodeGroup",
        "zarr_link": [{"name": "device", "path": "/general/devices/probe", "source": "."}],
    }
    name, data = HDMF.link_update(_group(attrs), "other", "general/devices/array")
    assert name == ".zattrs"
    doc = json.loads(data)
    assert data == json.dumps(doc, indent=2).encode()  # the layout the gateway always wrote
    assert doc["zarr_link"][1] == {"name": "other", "source": ".", "path": DEVICE}
    assert {k: v for k, v in doc.items() if k != "zarr_link"} == {
        k: v for k, v in attrs.items() if k != "zarr_link"
    }
    assert HDMF.links(
        HDMF.node_from_probes({".zgroup": b'{"zarr_format": 2}', ".zattrs": data})
    ) == {
        "device": "general/devices/probe",
        "other": "general/devices/array",
    }
    _, replaced = HDMF.link_update(_group(doc), "device", "x/y")
    assert HDMF.links(_group(json.loads(replaced))) == {
        "other": "general/devices/array",
        "device": "x/y",
    }
    _, removed = HDMF.link_update(_group(doc), "device", None)
    assert HDMF.links(_group(json.loads(removed))) == {"other": "general/devices/array"}
    _, absent = HDMF.link_update(_group(doc), "nothing", None)
    assert json.loads(absent) == doc
    _, root = HDMF.link_update(_group({}), "top", "")
    assert json.loads(root)["zarr_link"] == [{"name": "top", "source": ".", "path": "/"}]


@pytest.mark.parametrize(("name", "target"), [("a/b", "x"), ("..", "x"), ("a", "../outside")])
def test_link_update_refuses_what_hdmf_zarr_could_not_read(name: str, target: str) -> None:
    with pytest.raises(Rejected) as info:
        HDMF.link_update(_group({}), name, target)
    assert info.value.rule == "zarr-link"


def test_link_update_needs_an_hdmf_group(nwb: Path) -> None:
    array = HDMF.node_from_probes(_probes(nwb / "acquisition/ts/data"))
    plain = ZARR2.node_from_probes(_probes(nwb / "acquisition"))
    for node in (array, plain, None):
        with pytest.raises(NotSupported):
            HDMF.link_update(node, "a", "x")
    with pytest.raises(NotSupported):
        ZARR2.link_update(plain, "a", "x")
