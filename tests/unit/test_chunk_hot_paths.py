"""The per-chunk paths made cheap (validate, and every commit of a mount) answer as before.

Each shortcut here (a node's grid computed once, one key regex per array, one zstd decoder per
thread, the file store's flat walk) is checked against the slow, obvious answer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from n5fs.classify import Classifier
from n5fs.codecs import limits
from n5fs.codecs.limits import CodecError, zstd_decompress
from n5fs.detect import Detector
from n5fs.formats.base import ArrayNode, Classified, Format, KeyKind
from n5fs.formats.n5 import N5ArrayNode, N5Format
from n5fs.formats.zarr2 import Zarr2ArrayNode, Zarr2Format
from n5fs.formats.zarr3 import Zarr3ArrayNode, Zarr3Format
from n5fs.kvstore.file import PARTIAL_SUFFIX, FileStore
from n5fs.kvstore.memory import MemoryStore


def _zarr2(shape: list[int], chunks: list[int], **extra: object) -> Zarr2ArrayNode:
    doc = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": chunks,
        "dtype": "<u2",
        "compressor": {"id": "zstd", "level": 1},
        "fill_value": 0,
        "order": "C",
        "filters": None,
        **extra,
    }
    node = Zarr2Format().parse_metadata(".zarray", json.dumps(doc).encode())
    assert isinstance(node, Zarr2ArrayNode)
    return node


def _array(fmt: Format, name: str, doc: dict[str, object]) -> ArrayNode:
    node = fmt.parse_metadata(name, json.dumps(doc).encode())
    assert isinstance(node, ArrayNode)
    return node


V3_DOC: dict[str, object] = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [10, 7],
    "data_type": "uint8",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 7]}},
    "chunk_key_encoding": {"name": "default"},
    "codecs": [{"name": "bytes"}],
    "fill_value": 0,
}


# -- the grid, once per node -------------------------------------------------------------------


def test_grid_is_kept_by_the_node_and_takes_no_part_in_equality() -> None:
    node, twin = _zarr2([40, 33], [16, 16]), _zarr2([40, 33], [16, 16])
    assert node.grid == (3, 3)
    assert node.grid is node.grid  # computed once
    assert node == twin  # twin never computed its grid
    assert hash(node) == hash(twin)
    assert "grid" not in repr(node)
    assert node.chunk_nbytes == 16 * 16 * 2
    assert node == twin


def test_a_resized_node_has_its_own_grid() -> None:
    node = _zarr2([40, 33], [16, 16])
    assert node.grid == (3, 3)
    grown = dataclasses.replace(node, meta=dataclasses.replace(node.meta, shape=(80, 33)))
    assert grown.grid == (5, 3)
    assert node.grid == (3, 3)
    assert not grown.in_grid((5, 0))
    assert grown.in_grid((4, 2))
    assert not node.in_grid((4, 2))


def test_in_grid_edges_for_every_format() -> None:
    n5 = _array(
        N5Format(),
        "attributes.json",
        {
            "dimensions": [10, 0, 7],
            "blockSize": [4, 4, 7],
            "dataType": "uint8",
            "compression": {"type": "raw"},
        },
    )
    v3 = _array(Zarr3Format(), "zarr.json", V3_DOC)
    assert n5.grid == (3, 0, 1)
    assert v3.grid == (3, 1)
    for node, inside, outside in (
        (v3, [(0, 0), (2, 0)], [(3, 0), (0, 1), (-1, 0), (0,), (0, 0, 0)]),
        (n5, [], [(0, 0, 0), (2, 0, 0), (3, 0, 0)]),  # an empty axis: no chunk at all
        (_zarr2([], []), [()], [(0,)]),
    ):
        assert all(node.in_grid(p) for p in inside)
        assert not any(node.in_grid(p) for p in outside)


# -- one regex per array for its chunk keys ------------------------------------------------------


def _split_position(rel_key: str, separator: str, ndim: int, index: str) -> tuple[int, ...] | None:
    """The reference grammar: split at the separator, then every part one index."""
    parts = rel_key.split(separator)
    if len(parts) != ndim or not all(re.fullmatch(index, p, re.ASCII) for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _reference(node: ArrayNode, rel_key: str) -> tuple[int, ...] | None:
    """Where the grammar of each format, as written before the shortcut, puts ``rel_key``."""
    if isinstance(node, Zarr3ArrayNode):
        return node.key_encoding.parse_key(rel_key, len(node.shape))
    if isinstance(node, N5ArrayNode):
        return _split_position(rel_key, "/", len(node.shape), r"0|[1-9][0-9]{0,999}")
    assert isinstance(node, Zarr2ArrayNode)
    if not node.chunks:
        return () if rel_key == "0" else None
    return _split_position(rel_key, node.meta.separator, len(node.shape), r"0|[1-9][0-9]*")


def _v3(ndim: int, encoding: str, separator: str) -> ArrayNode:
    doc = dict(V3_DOC, shape=[10] * ndim)
    doc["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": [4] * ndim}}
    doc["chunk_key_encoding"] = {"name": encoding, "configuration": {"separator": separator}}
    return _array(Zarr3Format(), "zarr.json", doc)


def _n5(ndim: int) -> ArrayNode:
    doc = {"dimensions": [10] * ndim, "blockSize": [4] * ndim, "dataType": "uint8"}
    return _array(N5Format(), "attributes.json", {**doc, "compression": {"type": "raw"}})


NODES = [
    *(_zarr2([10] * n, [4] * n, dimension_separator=sep) for n in (0, 1, 2, 3) for sep in "./"),
    *(_v3(n, enc, sep) for n in (0, 1, 2, 3) for enc in ("default", "v2") for sep in "./"),
    *(_n5(n) for n in (1, 2, 3)),
]
#: index-like pieces (``\u0661``, an Arabic-Indic one: ``int()`` reads it, no grammar may)
INDEXES = ["0", "1", "2", "12", "01", "00", "-1", "+1", "9" * 12, "\u0661"]
TOKENS = [*INDEXES, "c", "x", ".", "/", "", " "]
KEYS = st.lists(st.sampled_from(TOKENS), max_size=9).map("".join)


def _node_id(node: ArrayNode) -> str:
    return f"{node.fmt}-{len(node.shape)}d-{node.chunk_key((0,) * len(node.shape))}"


@pytest.mark.parametrize("node", NODES, ids=_node_id)
@given(rel_key=KEYS)
def test_one_regex_reads_chunk_keys_as_splitting_them_did(node: ArrayNode, rel_key: str) -> None:
    position = _reference(node, rel_key)
    found = node.classify(rel_key)
    if position is not None:
        assert found == Classified(KeyKind.CHUNK, position, node.in_grid(position))
    else:
        assert found.kind is not KeyKind.CHUNK


@pytest.mark.parametrize("node", NODES, ids=_node_id)
def test_every_chunk_key_a_node_writes_is_read_back(node: ArrayNode) -> None:
    ndim = len(node.shape)
    for position in [(0,) * ndim, (2,) * ndim, (3,) * ndim, tuple(range(ndim))]:
        found = node.classify(node.chunk_key(position))
        assert (found.kind, found.position, found.in_grid) == (
            KeyKind.CHUNK,
            position,
            position != (3,) * ndim or ndim == 0,
        )


# -- the classifier told the folder being walked -------------------------------------------------


def test_a_folder_handed_to_the_classifier_changes_no_verdict() -> None:
    zarray = {
        "zarr_format": 2, "shape": [4, 4], "chunks": [2, 2], "dtype": "<u1", "compressor": None,
        "fill_value": 0, "order": "C", "filters": None,
    }  # fmt: skip
    files = {
        ".zgroup": b'{"zarr_format": 2}',
        "flat/.zarray": json.dumps(zarray).encode(),
        "nested/.zarray": json.dumps({**zarray, "dimension_separator": "/"}).encode(),
        "broken/.zarray": b"{",
        "plain/README": b"hello",
    }
    for name in ("0.0", "1.1", "2.0", "01.0", "0/0", "README", "sub/.zarray"):
        files[f"flat/{name}"] = files[f"nested/{name}"] = bytes(4)
    files["flat/.zattrs"] = files["nested/.zattrs"] = b"{}"
    files.update({"broken/0.0": bytes(4), "nested/1/.zarray": b"{}", "nested/1/x": b""})
    store = MemoryStore()
    for key, value in files.items():
        store.set(key, value)
    detector = Detector(store)
    classifier = Classifier(detector)
    folders = list(detector.walk("", on_error=lambda _prefix, _exc: None))
    assert {f.prefix for f in folders} == {"", "flat/", "nested/", "plain/"}
    kinds = set()
    for key in files:
        load = functools.partial(files.__getitem__, key)
        alone = classifier.classify(key, load)
        kinds.add(alone.kind)
        for folder in folders:
            assert classifier.classify(key, load, folder=folder) == alone
    assert kinds == set(KeyKind)


# -- one zstd decoder per thread -----------------------------------------------------------------


def _unsized(data: bytes) -> bytes:
    """A frame without a content size, as Java's streaming writers make them."""
    frame = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(data)
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    return frame


def test_a_refused_frame_leaves_the_threads_decoder_fit_for_the_next() -> None:
    good = bytes(range(256)) * 4
    frame = zstandard.ZstdCompressor(level=3).compress(good)
    corrupt = frame[:8] + bytes(b ^ 0xFF for b in frame[8:-3]) + frame[-3:]
    cases = [
        (_unsized(bytes(1 << 20)), 4096, "decoded-size"),  # a bomb: bounded by the buffer
        (zstandard.ZstdCompressor().compress(bytes(8192)), 4096, "decoded-size"),  # size stated
        (_unsized(good)[:-2], len(good), None),  # truncated: refused, whatever the rule
        (corrupt, len(good), None),
    ]
    for bad, limit, rule in cases:
        with pytest.raises(CodecError) as info:
            zstd_decompress(bad, limit)
        assert rule is None or info.value.rule == rule
        assert zstd_decompress(frame, len(good)) == good
        assert zstd_decompress(_unsized(good), len(good)) == good  # the limit, exactly


def test_each_thread_decodes_with_its_own_decoder() -> None:
    workers = 3
    everyone_in = threading.Barrier(workers)  # all threads alive at once: no reuse of one

    def decode(seed: int) -> tuple[int, bytes]:
        data = bytes((seed + i) % 251 for i in range(4096))
        decoded = zstd_decompress(_unsized(data), len(data))
        assert decoded == data
        everyone_in.wait(timeout=30)
        return id(limits._ZSTD.get()), decoded

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(decode, range(workers)))
    assert len({decoder for decoder, _ in results}) == workers
    assert limits._ZSTD.get() is limits._ZSTD.get()  # and a thread keeps its own


# -- the file store's flat listing ----------------------------------------------------------------


def _reachable(root: Path, prefix: str) -> list[tuple[str, int, float]]:
    """The reference: every regular file under ``root``, symlinked folders not followed, a
    symlink to a file counted where it leads inside the root, keyed by its path below the
    root, temp files left out; then the prefix."""
    real_root = os.path.realpath(root)
    found = []
    for folder, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = os.path.join(folder, name)
            inside = os.path.realpath(path).startswith(real_root + os.sep)
            if name.endswith(PARTIAL_SUFFIX) or not inside or not os.path.isfile(path):
                continue
            st = os.stat(path)
            found.append(
                (os.path.relpath(path, root).replace(os.sep, "/"), st.st_size, st.st_mtime)
            )
    return sorted(f for f in found if f[0].startswith(prefix))


def _tree(tmp_path: Path) -> FileStore:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "secret").write_bytes(b"s")
    store = FileStore(tmp_path / "root")
    for key in ("a/0/0", "a/0/1", "a/1/0", "a/b", "a/bb/c", "ab", "b/ü n+%", "z/.zarray"):
        store.set(key, key.encode() * 3)
    root = store.root
    (root / "a" / "empty").mkdir()
    (root / "a" / "0" / f".0.0.x{PARTIAL_SUFFIX}").write_bytes(b"half")
    os.symlink(root / "a" / "0", root / "a" / "alias")  # a folder inside: not followed
    os.symlink(root / "ab", root / "a" / "ab-link")  # a file inside: served
    os.symlink(outside, root / "a" / "out")  # leads out: never
    os.symlink(outside / "deep" / "secret", root / "a" / "out-file")
    os.symlink(root / "gone", root / "a" / "dangling")
    os.mkfifo(root / "a" / "fifo")  # not a file: not a key
    return store


@pytest.mark.parametrize("prefix", ["", "a/", "a/b", "a/0/", "ab", "nothing/", "a/0/0"])
def test_flat_listing_finds_what_the_filesystem_holds(tmp_path: Path, prefix: str) -> None:
    store = _tree(tmp_path)
    expected = _reachable(store.root, prefix)
    listing = store.list(prefix, delimiter=None)
    assert [(i.key, i.size, i.mtime) for i in listing.keys] == expected
    assert listing.prefixes == ()
    assert [(i.key, i.size, i.mtime) for i in store.walk(prefix)] == expected
    if prefix == "a/":
        assert "a/ab-link" in {i.key for i in listing.keys}
        assert not any(i.key.startswith("a/alias") for i in listing.keys)
        assert not any("secret" in i.key or "fifo" in i.key for i in listing.keys)


def test_other_delimiters_still_group(tmp_path: Path) -> None:
    store = _tree(tmp_path)
    listing = store.list("a/", delimiter="b")
    assert listing.prefixes == ("a/ab", "a/b")
    assert {"a/0/0", "a/0/1"} <= set(listing.names())
    assert not any(name.startswith("a/alias") for name in listing.names())


@pytest.mark.parametrize("change", ["removed", "file", "link-out", "link-in"])
def test_a_folder_changed_between_scan_and_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The hook runs just before the listing opens ``a/0`` below ``a``: what it finds there
    then, not at the scan, decides, and a link there is not followed (a symlinked folder)."""
    store = _tree(tmp_path)
    root, real_open = store.root, os.open
    outside = tmp_path / "outside"

    def opening(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is not None and path == "0" and not (root / "a" / "moved").exists():
            os.rename(root / "a" / "0", root / "a" / "moved")
            if change == "file":
                (root / "a" / "0").write_bytes(b"now a file")
            elif change == "link-out":
                os.symlink(outside, root / "a" / "0")
            elif change == "link-in":
                os.symlink(root / "a" / "moved", root / "a" / "0")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", opening)
    keys = {i.key for i in store.walk("a/")}
    monkeypatch.undo()
    assert (root / "a" / "moved").exists()  # the hook ran
    assert {"a/1/0", "a/b", "a/bb/c"} <= keys
    assert not any(key.startswith("a/moved") for key in keys)  # not there at the scan
    assert not any("secret" in key or "deep" in key for key in keys)
    assert not any(key.startswith("a/0") for key in keys)
