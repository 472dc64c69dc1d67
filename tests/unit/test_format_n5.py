"""N5 format rules: attributes.json, chunk keys, chunk validation and decoding.

Real data comes from TensorStore, written inside the tests; N5 Java's own shapes (clipped end
blocks, varlength mode, lz4-java framing) are hand-built from the published layouts.
"""

from __future__ import annotations

import functools
import gzip
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from n5fs.codecs.limits import CodecError
from n5fs.errors import Rejected
from n5fs.formats.base import KeyKind
from n5fs.formats.n5 import N5ArrayNode, N5Format, N5GroupNode

FMT = N5Format()


def parse(attrs: object, name: str = "attributes.json") -> Any:
    return FMT.parse_metadata(name, json.dumps(attrs).encode(), path="ds/attributes.json")


def dataset(
    dims: list[int],
    block: list[int],
    dtype: str = "uint16",
    compression: dict[str, Any] | None = None,
    **extra: Any,
) -> N5ArrayNode:
    node = parse(
        {
            "dimensions": dims,
            "blockSize": block,
            "dataType": dtype,
            "compression": compression or {"type": "raw"},
            **extra,
        }
    )
    assert isinstance(node, N5ArrayNode)
    return node


def hdr(*dims: int, mode: int = 0, count: int | None = None) -> bytes:
    """An N5 block header by the spec: uint16 mode, uint16 ndim, uint32 dims (big endian)."""
    out = struct.pack(">HH", mode, len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    return out + (struct.pack(">I", count) if count is not None else b"")


def be16(n: int, start: int = 0) -> bytes:
    return np.arange(start, start + n, dtype=">u2").tobytes()


# --- TensorStore, every compression it writes ---------------------------------------------

TS_COMPRESSIONS = [
    {"type": "raw"},
    {"type": "gzip"},
    {"type": "gzip", "useZlib": True, "level": 4},
    {"type": "bzip2", "blockSize": 3},
    {"type": "xz", "preset": 1},
    {"type": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 2},
    {"type": "zstd", "level": 3},
]
DTYPES = ["uint8", "uint16", "int32", "float64"]
SHAPE, BLOCK = (7, 5, 3), [3, 2, 2]  # grid 3 x 3 x 2: partial end blocks on every axis


def values_for(dtype: str) -> np.ndarray[Any, Any]:
    n = np.arange(int(np.prod(SHAPE))).reshape(SHAPE)
    return {"uint8": n % 251, "uint16": n * 257, "int32": 7 - n * 100_003, "float64": n * 0.25 - 3}[
        dtype
    ].astype(dtype)


def ts_write(
    path: Path, values: np.ndarray[Any, Any], block: list[int], compression: dict[str, Any]
) -> Any:
    store = ts.open(
        {
            "driver": "n5",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "dimensions": list(values.shape),
                "blockSize": block,
                "dataType": str(values.dtype),
                "compression": compression,
            },
        },
        create=True,
    ).result()
    store.write(values).result()
    return store


def chunk_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != "attributes.json"
    }


def block_slices(position: tuple[int, ...], block: list[int]) -> tuple[slice, ...]:
    return tuple(slice(p * b, (p + 1) * b) for p, b in zip(position, block, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compression", TS_COMPRESSIONS, ids=lambda c: json.dumps(c))
def test_every_tensorstore_chunk_validates_and_decodes(
    tmp_path: Path, compression: dict[str, Any], dtype: str
) -> None:
    values = values_for(dtype)
    ts_write(tmp_path, values, BLOCK, compression)
    node = FMT.parse_metadata("attributes.json", (tmp_path / "attributes.json").read_bytes())
    assert isinstance(node, N5ArrayNode)
    assert node.dtype == np.dtype(dtype)
    files = chunk_files(tmp_path)
    assert len(files) == 3 * 3 * 2
    full_end_blocks = 0
    for key, data in files.items():
        found = node.classify(key)
        assert found.kind is KeyKind.CHUNK
        assert found.in_grid
        assert found.position is not None
        assert node.chunk_key(found.position) == key
        node.validate_chunk(found.position, data, path=key)
        decoded = node.decode_chunk(found.position, data)
        np.testing.assert_array_equal(decoded, values[block_slices(found.position, BLOCK)])
        assert decoded.dtype == np.dtype(dtype)
        if node.extent(found.position) != tuple(BLOCK):
            # TensorStore writes end blocks full-size; the header says so.
            assert struct.unpack(">3I", data[4:16]) == tuple(BLOCK)
            full_end_blocks += 1
    assert full_end_blocks == 3 * 3 * 2 - 2 * 2 * 1


@pytest.mark.parametrize("compression", TS_COMPRESSIONS, ids=lambda c: c["type"])
def test_tensorstore_reads_what_encode_chunk_writes(
    tmp_path: Path, compression: dict[str, Any]
) -> None:
    store = ts_write(tmp_path, values_for("int32"), BLOCK, compression)
    node = FMT.parse_metadata("attributes.json", (tmp_path / "attributes.json").read_bytes())
    assert isinstance(node, N5ArrayNode)
    expected = values_for("int32")
    for position in [(0, 0, 0), (2, 2, 1), (1, 2, 0)]:  # interior, corner end, mixed
        new = (np.arange(int(np.prod(node.extent(position)))) * -3 + 11).astype("int32")
        new = new.reshape(node.extent(position))
        data = node.encode_chunk(position, new)
        # N5 Java's layout: default mode, the dims clipped to the dataset.
        assert data[:16] == hdr(*node.extent(position))
        node.validate_chunk(position, data)
        (tmp_path / node.chunk_key(position)).write_bytes(data)
        expected[block_slices(position, BLOCK)] = new
    reread = ts.open(
        {"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path)}}, open=True
    ).result()
    np.testing.assert_array_equal(reread.read().result(), expected)
    assert store.shape == SHAPE


# --- N5 Java shapes, hand-built -----------------------------------------------------------

README_BLOCK = hdr(1, 2, 3) + bytes.fromhex("000100020003000400050006")


def test_the_spec_example_block_decodes_in_n5_order() -> None:
    node = dataset([1, 2, 3], [1, 2, 3])
    decoded = node.decode_chunk((0, 0, 0), README_BLOCK)
    assert decoded.shape == (1, 2, 3)
    # The first dimension varies fastest: values 1..6 fill a[0, y, z] with y before z.
    assert decoded[0].tolist() == [[1, 3, 5], [2, 4, 6]]


@pytest.mark.parametrize(
    ("compression", "payload"),
    [  # the payloads the N5 README prints for that block (1..6 as uint16)
        ({"type": "gzip"}, "1f8b0800000000000000636064606260666061606560 0300aaea6dbf0c000000"),
        (
            {"type": "bzip2"},
            (
                "425a683931415926535902 3e0dd200000040007f00200031 0c010d31a873"
                "94337c5dc914e1424008f83748"
            ),
        ),
        (
            {"type": "xz"},
            (
                "fd377a585a000004e6d6b4460200210116000000742fe5a301000b00010002"
                "00030004000500 06000d0309ca34ec15a70001240ca618d8d81fb6f37d01"
                "0000000004595a"
            ),
        ),
    ],
    ids=["gzip", "bzip2", "xz"],
)
def test_the_spec_example_payloads_decode(compression: dict[str, Any], payload: str) -> None:
    node = dataset([1, 2, 3], [1, 2, 3], compression=compression)
    data = hdr(1, 2, 3) + bytes.fromhex(payload.replace(" ", ""))
    assert node.decode_chunk((0, 0, 0), data).ravel(order="F").tolist() == [1, 2, 3, 4, 5, 6]


def test_n5_java_truncated_end_block() -> None:
    node = dataset([5, 3], [4, 2])  # grid 2 x 2; the far corner holds a single value
    corner = hdr(1, 1) + bytes.fromhex("1234")
    assert node.decode_chunk((1, 1), corner).tolist() == [[0x1234]]
    edge = hdr(1, 2) + bytes.fromhex("01020304")
    assert node.decode_chunk((1, 0), edge).tolist() == [[0x0102, 0x0304]]
    assert node.encode_chunk((1, 0), np.array([[0x0102, 0x0304]], dtype="uint16")) == edge
    # A full-size end block (TensorStore's way) is fine too; the part outside is dropped.
    full = hdr(4, 2) + be16(8, 100)
    assert node.decode_chunk((1, 0), full).tolist() == [[100, 104]]


def test_varlength_blocks() -> None:
    node = dataset([4, 4], [2, 2], dtype="uint8", compression={"type": "gzip"})
    same = hdr(2, 2, mode=1, count=4) + gzip.compress(bytes([1, 2, 3, 4]))
    assert node.decode_chunk((0, 0), same).tolist() == [[1, 3], [2, 4]]
    # A count other than the dims' product (label multisets): the elements come back flat.
    other = hdr(2, 2, mode=1, count=10) + gzip.compress(bytes(range(10)))
    node.validate_chunk((1, 1), other)
    assert node.decode_chunk((1, 1), other).tolist() == list(range(10))
    short = hdr(2, 2, mode=1, count=10) + gzip.compress(bytes(range(9)))
    with pytest.raises(CodecError) as info:
        node.validate_chunk((1, 1), short)
    assert info.value.rule == "decoded-size"


def _lz4_java_stream(data: bytes) -> bytes:
    """lz4-java LZ4BlockOutputStream output for ``data`` as one raw block, by the layout."""
    check = xxhash.xxh32_intdigest(data, 0x9747B28C) & 0x0FFFFFFF
    block = b"LZ4Block" + bytes([0x16]) + struct.pack("<iii", len(data), len(data), check)
    return block + data + b"LZ4Block" + bytes([0x16]) + b"\x00" * 12


def test_lz4_dataset_with_a_hand_built_chunk() -> None:
    node = dataset([4, 3], [4, 3], compression={"type": "lz4"})
    data = hdr(4, 3) + _lz4_java_stream(be16(12))
    assert node.decode_chunk((0, 0), data).ravel(order="F").tolist() == list(range(12))
    assert node.codec_summary() == "lz4(blockSize=65536)"
    ours = node.encode_chunk((0, 0), node.decode_chunk((0, 0), data))
    assert node.decode_chunk((0, 0), ours).ravel(order="F").tolist() == list(range(12))


# --- invalid chunks -----------------------------------------------------------------------


@functools.cache
def gzip_bomb() -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\x00" * (1 << 20)
    return b"".join(comp.compress(zeros) for _ in range(100)) + comp.flush()


RAW = {"type": "raw"}
GZ = {"type": "gzip"}
ZL = {"type": "gzip", "useZlib": True}
LZ4 = {"type": "lz4"}
BAD_CHUNKS = [  # dims [10, 7], blockSize [4, 3], uint16: grid 3 x 3, end extents 2 and 1
    ("mode 3", RAW, (0, 0), lambda: hdr(4, 3, mode=3) + be16(12), "block-mode"),
    ("object mode", RAW, (0, 0), lambda: struct.pack(">HI", 2, 12) + be16(12), "block-mode"),
    ("header cut", RAW, (0, 0), lambda: hdr(4, 3)[:7], "block-header"),
    ("3 dims", RAW, (0, 0), lambda: hdr(4, 3, 1) + be16(12), "block-ndim"),
    ("dims > blockSize", RAW, (0, 0), lambda: hdr(5, 3) + be16(15), "block-dims"),
    ("interior short", RAW, (1, 1), lambda: hdr(3, 3) + be16(9), "block-shape"),
    ("end neither", RAW, (2, 0), lambda: hdr(3, 3) + be16(9), "block-shape"),
    ("zero dims", RAW, (2, 2), lambda: hdr(0, 0), "block-shape"),
    ("raw truncated", RAW, (0, 0), lambda: hdr(4, 3) + be16(11), "decoded-size"),
    ("raw trailing", RAW, (0, 0), lambda: hdr(4, 3) + be16(13), "trailing-data"),
    ("gzip short", GZ, (0, 0), lambda: hdr(4, 3) + gzip.compress(be16(11)), "decoded-size"),
    ("gzip long", GZ, (0, 0), lambda: hdr(4, 3) + gzip.compress(be16(13)), "decoded-size"),
    ("gzip cut", GZ, (0, 0), lambda: hdr(4, 3) + gzip.compress(be16(12))[:-5], "undecodable"),
    ("not gzip", GZ, (0, 0), lambda: hdr(4, 3) + b"certainly not gzip", "undecodable"),
    (
        "zlib trailing",
        ZL,
        (0, 0),
        lambda: hdr(4, 3) + zlib.compress(be16(12)) + b"x",
        "trailing-data",
    ),
    ("gzip bomb", GZ, (0, 0), lambda: hdr(4, 3) + gzip_bomb(), "decoded-size"),
    (
        "lz4 checksum",
        LZ4,
        (0, 0),
        lambda: (
            hdr(4, 3)
            + _lz4_java_stream(be16(12))[:17]
            + b"\x00\x00\x00\x00"
            + _lz4_java_stream(be16(12))[21:]
        ),
        "checksum",
    ),
    ("varlength huge", RAW, (0, 0), lambda: hdr(4, 3, mode=1, count=0xFFFFFFFF), "block-varlength"),
    ("out of grid", RAW, (3, 0), lambda: hdr(4, 3) + be16(12), "out-of-grid"),
    ("negative", RAW, (-1, 0), lambda: hdr(4, 3) + be16(12), "out-of-grid"),
    ("wrong rank", RAW, (0,), lambda: hdr(4, 3) + be16(12), "out-of-grid"),
]


@pytest.mark.parametrize(
    ("compression", "position", "build", "rule"),
    [case[1:] for case in BAD_CHUNKS],
    ids=[c[0] for c in BAD_CHUNKS],
)
def test_bad_chunks_are_refused(
    compression: dict[str, Any], position: tuple[int, ...], build: Any, rule: str
) -> None:
    node = dataset([10, 7], [4, 3], compression=compression)
    with pytest.raises(Rejected) as info:
        node.validate_chunk(position, build(), path="ds/0/0")
    assert info.value.rule == rule
    assert info.value.fmt == "n5"
    assert info.value.path == "ds/0/0"


def test_valid_end_blocks_of_that_dataset_pass() -> None:
    node = dataset([10, 7], [4, 3])
    node.validate_chunk((2, 2), hdr(2, 1) + be16(2))  # clipped, N5 Java
    node.validate_chunk((2, 2), hdr(4, 3) + be16(12))  # full, TensorStore
    node.validate_chunk((2, 0), hdr(2, 3) + be16(6))
    node.validate_chunk((0, 2), hdr(4, 1) + be16(4))


# --- keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "kind", "position", "in_grid"),
    [
        ("attributes.json", KeyKind.METADATA, None, True),
        ("0/0", KeyKind.CHUNK, (0, 0), True),
        ("2/2", KeyKind.CHUNK, (2, 2), True),
        ("3/0", KeyKind.CHUNK, (3, 0), False),
        ("0/12", KeyKind.CHUNK, (0, 12), False),
        # chunk-like keys that break N5's grammar: refused, never stored as plain files
        ("0", KeyKind.INVALID, None, True),  # too few indices
        ("0/0/0", KeyKind.INVALID, None, True),  # too many
        ("01/0", KeyKind.INVALID, None, True),  # a leading zero
        ("-1/0", KeyKind.INVALID, None, True),  # a sign
        ("+1/0", KeyKind.INVALID, None, True),
        ("0.0", KeyKind.INVALID, None, True),  # Zarr v2's separator
        ("c/0/0", KeyKind.INVALID, None, True),  # Zarr v3's prefix
        ("9" * 5000 + "/0", KeyKind.INVALID, None, True),  # over-long index
        ("9", KeyKind.INVALID, None, True),
        # not chunk-like: ordinary files
        ("\u0661/0", KeyKind.OTHER, None, True),  # an Arabic-Indic one is no N5 index
        ("0/0.partial", KeyKind.OTHER, None, True),
        ("README.md", KeyKind.OTHER, None, True),
        ("9" * 300 + "/0", KeyKind.CHUNK, (int("9" * 300), 0), False),
        ("a/attributes.json", KeyKind.OTHER, None, True),
        ("0/attributes.json", KeyKind.OTHER, None, True),
    ],
)
def test_classify(key: str, kind: KeyKind, position: tuple[int, ...] | None, in_grid: bool) -> None:
    found = dataset([10, 7], [4, 3]).classify(key)
    assert (found.kind, found.position, found.in_grid) == (kind, position, in_grid)
    if kind is KeyKind.INVALID:
        assert found.rule == "chunk-key"
        assert "2 indices joined by '/'" in found.message
        assert len(found.message) < 300  # an over-long key is cut in the message
    else:
        assert (found.rule, found.message) == ("", "")


def test_classify_names_the_rank_of_a_1d_dataset() -> None:
    found = dataset([10], [4]).classify("0/0")
    assert found.kind is KeyKind.INVALID
    assert "1 index joined by '/' (e.g. '0')" in found.message
    assert dataset([10], [4]).classify("2").position == (2,)


# --- which attributes.json is N5 metadata -------------------------------------------------


def _loader(data: bytes) -> Any:
    calls: list[int] = []

    def load() -> bytes:
        calls.append(1)
        return data

    load.calls = calls  # type: ignore[attr-defined]
    return load


@pytest.mark.parametrize(
    ("name", "context", "data", "claimed"),
    [
        ("attributes.json", "n5", b"{}", True),
        ("attributes.json", "n5", b"{not json", True),  # claimed, then refused by parse
        ("attributes.json", "n5", b"[1]", True),
        ("attributes.json", None, b'{"n5": "4.0.0"}', True),
        ("attributes.json", None, b'{"dimensions": [3]}', True),  # one dataset key suffices
        ("attributes.json", "zarr2", b'{"dataType": "uint8"}', True),
        ("attributes.json", None, b'{"compressionType": "gzip"}', True),
        ("attributes.json", None, b'{"title": "any tool may write this"}', False),
        ("attributes.json", None, b"{not json", False),
        ("attributes.json", None, b'["n5"]', False),
        ("attributes.json", "zarr3", b"{}", False),
        (".zarray", "n5", b'{"n5": "4.0.0"}', False),
        ("zarr.json", None, b'{"n5": "4.0.0"}', False),
        ("Attributes.json", "n5", b"{}", False),
    ],
)
def test_claims(name: str, context: str | None, data: bytes, claimed: bool) -> None:
    assert FMT.claims(name, context, _loader(data)) is claimed


def test_claims_reads_nothing_it_does_not_need() -> None:
    inside = _loader(b"{}")
    assert FMT.claims("attributes.json", "n5", inside)
    assert inside.calls == []  # the context decides
    other = _loader(b"{}")
    assert not FMT.claims("README.md", None, other)
    assert other.calls == []


# --- attributes.json ----------------------------------------------------------------------

GOOD = {
    "dimensions": [10, 7],
    "blockSize": [4, 3],
    "dataType": "uint16",
    "compression": {"type": "gzip"},
}


def _with(**changes: Any) -> dict[str, Any]:
    out = {**GOOD, **changes}
    return {k: v for k, v in out.items() if v is not None}


BAD_ATTRIBUTES = [
    ("not json", b"{nope", "json"),
    ("bad utf-8", b"\xff\xfe\xfd", "json"),
    ("array", b"[1, 2]", "json"),
    ("partial", {"dimensions": [10], "dataType": "uint8"}, "dataset-keys"),
    ("no compression", _with(compression=None), "dataset-keys"),
    ("dims string", _with(dimensions="abc"), "dimensions"),
    ("dims negative", _with(dimensions=[-1, 7]), "dimensions"),
    ("dims bool", _with(dimensions=[True, 7]), "dimensions"),
    ("dims float", _with(dimensions=[10.0, 7]), "dimensions"),
    ("dims empty", _with(dimensions=[], blockSize=[]), "dimensions"),
    ("block zero", _with(blockSize=[0, 3]), "blockSize"),
    ("block int32", _with(blockSize=[1 << 31, 3]), "blockSize"),
    ("block rank", _with(blockSize=[4]), "blockSize"),
    ("block 2 GB", _with(blockSize=[65536, 65536]), "blockSize"),
    ("float16", _with(dataType="float16"), "dataType"),
    ("dtype int", _with(dataType=5), "dataType"),
    ("compression str", _with(compression="gzip"), "compression"),
    ("gzip level", _with(compression={"type": "gzip", "level": 11}), "compression"),
    ("unknown", _with(compression={"type": "jpeg"}), "unknown-compression"),
    ("v0 unknown", _with(compression=None, compressionType="blosc"), "unknown-compression"),
    ("n5 major 5", {"n5": "5.0.0"}, "n5-version"),
    ("n5 word", {"n5": "four"}, "n5-version"),
    ("n5 number", {"n5": 4}, "n5-version"),
]


@pytest.mark.parametrize(
    ("doc", "rule"), [c[1:] for c in BAD_ATTRIBUTES], ids=[c[0] for c in BAD_ATTRIBUTES]
)
def test_bad_attributes_are_refused(doc: object, rule: str) -> None:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(Rejected) as info:
        FMT.parse_metadata("attributes.json", data, path="ds/attributes.json")
    assert info.value.rule == rule
    assert info.value.fmt == "n5"
    assert info.value.path == "ds/attributes.json"


def test_partial_dataset_keys_are_named() -> None:
    with pytest.raises(Rejected, match="lacks blockSize, compression"):
        parse({"dimensions": [10], "dataType": "uint8"})


def test_wrong_metadata_name() -> None:
    with pytest.raises(Rejected) as info:
        parse(GOOD, name=".zarray")
    assert info.value.rule == "metadata-name"


@pytest.mark.parametrize("version", ["4.0.0", "4.1.2-SNAPSHOT", "2.0.0", "1.0.0", "3"])
def test_root_versions_n5_java_reads(version: str) -> None:
    node = parse({"n5": version, "title": "t"})
    assert isinstance(node, N5GroupNode)
    assert node.version == version
    assert node.attributes == {"title": "t"}


def test_groups_and_datasets() -> None:
    assert isinstance(parse({}), N5GroupNode)
    group = parse({"resolution": [4, 4, 40], "dimensions_note": "x"})
    assert isinstance(group, N5GroupNode)
    assert group.version is None  # TensorStore writes no version
    node = parse(_with(resolution=[4, 4], units=["nm", "nm"], n5="4.0.0"))
    assert isinstance(node, N5ArrayNode)
    assert node.attributes == {"resolution": [4, 4], "units": ["nm", "nm"]}
    assert (node.shape, node.chunks, node.grid) == ((10, 7), (4, 3), (3, 3))
    assert node.codec_summary() == "gzip(level=-1)"


def test_version0_compression_type() -> None:
    node = parse(_with(compression=None, compressionType="bzip2"))
    assert isinstance(node, N5ArrayNode)
    assert node.structural()["compression"] == {"type": "bzip2", "blockSize": 9}


def test_empty_dataset_has_no_chunks() -> None:
    node = dataset([0, 5], [4, 4])
    assert node.grid == (0, 2)
    assert node.classify("0/0").in_grid is False


def test_matches_roots_and_datasets_only() -> None:
    def enc(doc: object) -> bytes:
        return json.dumps(doc).encode()

    assert FMT.matches({"attributes.json": enc({"n5": "4.0.0"})})
    assert FMT.matches({"attributes.json": enc(GOOD)})
    assert not FMT.matches({"attributes.json": enc({"title": "a group"})})
    assert not FMT.matches({"attributes.json": b"{broken"})
    assert not FMT.matches({".zarray": enc(GOOD)})
    assert isinstance(FMT.node_from_probes({"attributes.json": enc(GOOD)}), N5ArrayNode)


def test_structural_changes() -> None:
    old = parse(GOOD)
    explicit = parse(_with(compression={"type": "gzip", "level": -1, "useZlib": False}))
    assert old.structural() == explicit.structural()
    FMT.check_change(old, explicit, chunks_exist=True)
    FMT.check_change(old, parse(_with(dimensions=[20, 7], note="resized")), chunks_exist=True)
    with pytest.raises(Rejected) as info:
        FMT.check_change(old, parse(_with(compression={"type": "zstd"})), chunks_exist=True)
    assert info.value.rule == "structural-change"
    assert "compression" in str(info.value)
    FMT.check_change(old, parse(_with(dataType="int8")), chunks_exist=False)


# --- only Rejected, whatever the input ----------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
INT_LISTS = st.lists(st.integers(min_value=-2, max_value=1 << 33), min_size=0, max_size=3)
COMPRESSION_OBJECTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["raw", "gzip", "bzip2", "xz", "blosc", "zstd", "lz4", "x"])},
    optional={
        k: JSON | st.integers(-3, 70000)
        for k in (
            "level",
            "useZlib",
            "blockSize",
            "preset",
            "cname",
            "clevel",
            "shuffle",
            "blocksize",
            "typesize",
            "dict",
        )
    },
)
ATTRIBUTE_DOCS = st.fixed_dictionaries(
    {},
    optional={
        "dimensions": INT_LISTS | JSON,
        "blockSize": INT_LISTS | JSON,
        "dataType": st.sampled_from(["uint8", "float64", "float16"]) | JSON,
        "compression": COMPRESSION_OBJECTS | JSON,
        "compressionType": JSON,
        "n5": st.sampled_from(["4.0.0", "2.0.0", "9.1"]) | JSON,
        "other": JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64) | ATTRIBUTE_DOCS.map(lambda d: json.dumps(d).encode()))
def test_parse_metadata_raises_only_rejected(data: bytes) -> None:
    try:
        node = FMT.parse_metadata("attributes.json", data)
    except Rejected:
        return
    assert isinstance(node, (N5ArrayNode, N5GroupNode))


FUZZ_NODES = {
    c["type"] + str(c.get("useZlib", "")): dataset([10, 7], [4, 3], compression=c)
    for c in [*TS_COMPRESSIONS, {"type": "lz4"}]
}
HEADERS = st.sampled_from(
    [hdr(4, 3), hdr(2, 1), hdr(4, 3, mode=1, count=12), hdr(2, 3, mode=1, count=5), b""]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(FUZZ_NODES)),
    head=HEADERS,
    body=st.binary(max_size=200),
    position=st.sampled_from([(0, 0), (2, 2), (2, 0)]),
)
def test_validate_chunk_raises_only_rejected(
    name: str, head: bytes, body: bytes, position: tuple[int, int]
) -> None:
    node = FUZZ_NODES[name]
    try:
        node.validate_chunk(position, head + body)
    except Rejected:
        return
    assert node.decode_chunk(position, head + body).size >= 1


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(FUZZ_NODES)), data=st.data())
def test_mutated_valid_chunks_raise_only_rejected(name: str, data: st.DataObject) -> None:
    node = FUZZ_NODES[name]
    position = data.draw(st.sampled_from([(0, 0), (2, 2)]))
    valid = bytearray(node.encode_chunk(position, np.ones(node.extent(position), "uint16")))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(valid) - 1))
        valid[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(valid)))
    chunk = bytes(valid[:cut]) + data.draw(st.binary(max_size=8))
    try:
        node.validate_chunk(position, chunk)
    except Rejected:
        return
    assert node.decode_chunk(position, chunk).shape == node.extent(position)
