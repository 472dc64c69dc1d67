"""Writes through ``--as n5`` over a Zarr hierarchy: they land as native Zarr.

The mirror of :mod:`n5fs.views.writes` (whose staging it reuses: files written in the view
are staged in memory and committed when flushed, released or renamed under a name the view
translates). What an N5 writer writes becomes:

- ``attributes.json`` of a dataset (it has ``dimensions``, ``blockSize``, ``dataType``,
  ``compression``): the array's native document, in the hierarchy's own version (``zarr.json``
  in a Zarr v3 hierarchy; ``.zarray`` and ``.zattrs`` in a v2 one), axes reversed (N5 lists
  the fastest first), fill value 0 (what N5 readers read where no block is; an array of that
  type already there keeps its own, which the view shows in fill blocks), C order,
  big-endian values, ``/``-separated chunk keys, the compression as the codec of that name
  (``raw`` none, ``gzip`` gzip (``useZlib``: zlib in v2; v3 has no zlib codec, gzip then),
  ``zstd``, ``blosc``);
- ``attributes.json`` without dataset keys: the attributes of the group (or of the array)
  in that folder (the root's ``n5`` version is N5's, not kept);
- in both, the attributes through :func:`~n5fs.views.attributes.from_n5`: those kept under
  ``zarr_attributes`` come back as they were, fitting per-axis conventions reversed, and a
  v3 array's ``axes`` are its ``dimension_names``;
- a block at ``x/y/z``: decoded with the dataset's N5 document (the one written in this
  mount, else the view's), clipped end blocks included, and re-encoded by the native array
  as the full chunk at the reversed position under its own key (an array whose shards the
  view shows whole, one block each: the whole shard, in the array's full codec chain).

Both go to the gateway as writes of native names: its commit rules validate and record them.
What the view cannot represent is refused before anything is stored
(:class:`~n5fs.errors.Rejected`, EINVAL, recorded in the gateway's rejections): the
compressions Zarr has no codec for here (``bzip2``, ``xz``, ``lz4``: they are refused, not
transcoded, so a writer never reads back another compression than it declared), writes into
a sharded array whose blocks are inner chunks (a shard is not rewritten piece by piece),
an hdmf-zarr or N5 hierarchy, a varlength block.

Removing a block removes its native chunk; in an array whose fill value is not 0 the block
then reads as a fill block, and removing a fill block is done at once (nothing is stored).
N5 writers (TensorStore's n5 driver, z5py) remove a block they would write as all zeros, so
in such an array zeros written whole-block read back as the fill value: TensorStore's
``store_data_equal_to_fill_value`` makes it write them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from n5fs.detect import Folder, FolderKind
from n5fs.errors import KeyNotFound, Rejected
from n5fs.formats.n5 import ATTRIBUTES, N5ArrayNode, N5Format, is_dataset_attributes
from n5fs.kvstore.keys import basename, parent
from n5fs.views.arrays import ShardedStoreArray
from n5fs.views.attributes import from_n5
from n5fs.views.n5 import fill_json
from n5fs.views.removal import ARRAY, GROUP
from n5fs.views.tree import Entry, document
from n5fs.views.writes import ViewWrites, _Declared

if TYPE_CHECKING:
    from n5fs.formats.base import ArrayNode
    from n5fs.gateway import Gateway
    from n5fs.views.attributes import DimensionNames
    from n5fs.views.n5 import N5Tree
    from n5fs.views.zarr import ZarrTree

#: the Zarr formats the n5 view writes into (hdmf-zarr keeps its own rules: read-only)
WRITABLE = ("zarr3", "zarr2")
#: the native documents of an array or group, by format
_NATIVE_DOCUMENTS = {"zarr3": ("zarr.json",), "zarr2": (".zarray", ".zattrs", ".zgroup")}
_SHUFFLE = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def _refusal(message: str, path: str, rule: str, fmt: str) -> Rejected:
    return Rejected(message, path="/" + path, fmt=fmt, rule=rule)


class N5ViewWrites(ViewWrites):
    """The staged files of a writable ``--as n5`` view and their translation (module docs)."""

    #: what the view writes into (EROFS elsewhere)
    hierarchy = "Zarr"

    def __init__(self, gateway: Gateway, tree: N5Tree) -> None:
        super().__init__(gateway, cast("ZarrTree", tree))
        self.n5tree = tree

    # -- where writes go -----------------------------------------------------------------------

    def _fmt(self, key: str) -> str | None:
        """The format of the nearest folder above ``key`` that has one."""
        folder = parent(key)
        while True:
            found = self.tree.access.folder(folder)
            if found.fmt is not None:
                return found.fmt
            if not folder:
                return None
            folder = parent(folder)

    def in_n5(self, key: str) -> bool:
        """Is ``key`` in a hierarchy this view writes into (Zarr v2 or v3)? (The name is the
        caller's: for this view it asks about Zarr.)"""
        return self._fmt(key) in WRITABLE

    def implicit(self, key: str) -> bool:
        return False  # the view makes attributes.json of every group: none stands in for none

    def _array_of(self, key: str) -> str | None:
        """The prefix of the Zarr array ``key`` lies in (through block folders of the view)."""
        folder = parent(key)
        while True:
            found = self.tree.access.folder(folder)
            if found.kind is FolderKind.ARRAY:
                return found.prefix if found.fmt in WRITABLE else None
            if found.kind is FolderKind.CHUNKS and found.array_prefix is not None:
                return found.array_prefix
            if not folder or found.kind is FolderKind.GROUP:
                return None
            folder = parent(folder)

    def native_chunk(self, key: str) -> str | None:
        found = self._block(key)
        if found is None:
            return None
        prefix, node, _, pos = found
        return prefix + node.chunk_key(pos[::-1])

    def _dataset_of(self, key: str) -> N5ArrayNode | None:
        found = self._block(key)
        return None if found is None else found[2]

    def declared(self, key: str) -> Entry | None:
        """A dataset's ``attributes.json`` as its writer wrote it in this mount (its blocks
        the view makes from the chunks, with a compression of the same name)."""
        if basename(key) != ATTRIBUTES:
            return None
        folder = parent(key)
        found = self._declared.get(folder + "/" if folder else "")
        return None if found is None else document(found.doc)

    # -- removal -------------------------------------------------------------------------------

    def document_names(self) -> tuple[str, ...]:
        return (ATTRIBUTES,)

    def document_role(self, folder: Folder, name: str) -> str | None:
        if name != ATTRIBUTES or folder.fmt not in WRITABLE:
            return None
        if folder.kind is FolderKind.ARRAY:
            return ARRAY
        return GROUP if folder.kind is FolderKind.GROUP else None

    def native_documents(self, prefix: str) -> tuple[str, ...]:
        return _NATIVE_DOCUMENTS[self._fmt(prefix + ATTRIBUTES) or "zarr3"]

    def clear_group(self, prefix: str) -> None:
        """A group's ``attributes.json`` removed: its native document goes (the root's is
        rewritten without attributes: the hierarchy keeps its format)."""
        if not prefix:
            self._attributes(ATTRIBUTES, b"{}", self._fmt(ATTRIBUTES) or "zarr3")
            return
        for name in self.native_documents(prefix):
            if self.gateway.lookup("/" + prefix + name) is not None:
                self.gateway.unlink("/" + prefix + name)

    # -- translation ---------------------------------------------------------------------------

    def _translate(self, key: str, data: bytes) -> bool:
        fmt = self._fmt(key) or "zarr3"
        if basename(key) == ATTRIBUTES and parent(key) not in self._dirs:
            self._attributes(key, data, fmt)
            return True
        found = self._block(key)
        if found is None:
            return False
        prefix, node, n5node, pos = found
        values = n5node.decode_chunk(pos, data)
        if values.shape != n5node.extent(pos):
            raise _refusal("a varlength block: Zarr has no such chunk", key, "varlength", fmt)
        chunk = node.encode_chunk(pos[::-1], np.asarray(values).T)
        del values  # the chunk is all the commit needs
        self._native("/" + prefix + node.chunk_key(pos[::-1]), chunk)
        return True

    def _block(self, key: str) -> tuple[str, ArrayNode, N5ArrayNode, tuple[int, ...]] | None:
        """(array prefix, the native array, the N5 dataset it is written as, N5 position)."""
        prefix = self._array_of(key)
        if prefix is None:
            return None
        folder = self.tree.access.folder(prefix)
        node = folder.array
        plan = self.n5tree.plan(folder)
        if node is None or isinstance(plan, str):
            return None
        pos = plan.parse(key[len(prefix) :])
        if pos is None or len(pos) != plan.rank:
            return None
        if isinstance(plan.source, ShardedStoreArray):
            why = "a sharded array: an N5 block is one inner chunk, shards are not rewritten"
            raise _refusal(why, key, "sharding", folder.fmt or "zarr3")
        declared = self._declared.get(prefix)
        doc = declared.doc if declared is not None else plan.document
        n5node = N5Format().parse_metadata(ATTRIBUTES, doc, path="/" + prefix + ATTRIBUTES)
        assert isinstance(n5node, N5ArrayNode)
        return prefix, node, n5node, pos

    def _attributes(self, key: str, data: bytes, fmt: str) -> None:
        folder = parent(key)
        prefix = folder + "/" if folder else ""
        parsed = N5Format().parse_metadata(ATTRIBUTES, data, path="/" + key)
        attrs = _json(data, key, fmt)
        v3 = fmt == "zarr3"
        if is_dataset_attributes(attrs):
            assert isinstance(parsed, N5ArrayNode)
            custom, names = from_n5(attrs, len(parsed.shape), named=v3)
            self._dataset(prefix, parsed, attrs, custom, names, fmt, key)
            with self._lock:
                self._declared[prefix] = _Declared(parsed, ATTRIBUTES, data)
            return
        current = self.tree.access.folder(folder)
        if current.kind is FolderKind.ARRAY and current.fmt in WRITABLE:
            assert current.array is not None
            custom, names = from_n5(attrs, len(current.array.shape), named=v3)
            self._array_attributes(prefix, custom, names, fmt)
            with self._lock:  # the document written before no longer says what is stored
                self._declared.pop(prefix, None)
            return
        custom, _ = from_n5(attrs)
        if v3:
            group = {"zarr_format": 3, "node_type": "group", "attributes": custom}
            self._native("/" + prefix + "zarr.json", _dump(group))
        else:
            self._native("/" + prefix + ".zgroup", _dump({"zarr_format": 2}))
            self._native("/" + prefix + ".zattrs", _dump(custom))

    def _array_attributes(
        self, prefix: str, custom: dict[str, Any], names: DimensionNames | None, fmt: str
    ) -> None:
        """An N5 writer's attributes of an existing array (no dataset keys): they replace the
        array's attributes, and in v3 its ``dimension_names`` (the N5 ``axes``)."""
        if fmt == "zarr2":
            self._native("/" + prefix + ".zattrs", _dump(custom))
            return
        doc = json.loads(self.gateway.read_file("/" + prefix + "zarr.json"))
        doc["attributes"] = custom
        doc.pop("dimension_names", None)
        if names is not None:
            doc["dimension_names"] = list(names)
        self._native("/" + prefix + "zarr.json", _dump(doc))

    def _dataset(
        self,
        prefix: str,
        node: N5ArrayNode,
        attrs: dict[str, Any],
        custom: dict[str, Any],
        names: DimensionNames | None,
        fmt: str,
        key: str,
    ) -> None:
        compression = attrs.get("compression") or {"type": "raw"}
        dtype = node.dtype.newbyteorder(">")
        fill = self._kept_fill(prefix, dtype)
        shape, chunks = list(node.shape[::-1]), list(node.chunks[::-1])
        if fmt == "zarr2":
            zarray = {
                "zarr_format": 2,
                "shape": shape,
                "chunks": chunks,
                "dtype": dtype.str,
                "compressor": _v2_compressor(compression, dtype.itemsize, key),
                "fill_value": fill,
                "order": "C",
                "filters": None,
                "dimension_separator": "/",
            }
            self._native("/" + prefix + ".zarray", _dump(zarray))
            if custom or self._exists(prefix + ".zattrs"):
                self._native("/" + prefix + ".zattrs", _dump(custom))
            return
        codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "big"}}]
        codecs += _v3_codecs(compression, dtype.itemsize, key)
        zarr_json = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": shape,
            "data_type": dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": fill,
            "codecs": codecs,
            "attributes": custom,
        }
        if names is not None:
            zarr_json["dimension_names"] = list(names)
        self._native("/" + prefix + "zarr.json", _dump(zarr_json))

    def _kept_fill(self, prefix: str, dtype: np.dtype[Any]) -> Any:
        """The fill value of a dataset document: 0 (what N5 readers read where no block is),
        but an array of that type already there keeps its own (its absent chunks are fill
        blocks in the view: a writer that rewrites the document, z5py setting an attribute,
        must not turn them into zeros)."""
        folder = self.tree.access.folder(prefix)
        if folder.kind is FolderKind.ARRAY and folder.fmt in WRITABLE:
            plan = self.n5tree.plan(folder)
            if not isinstance(plan, str) and plan.source.dtype.newbyteorder(">") == dtype:
                return fill_json(plan.source.fill, dtype)
        return 0.0 if dtype.kind == "f" else 0

    def _exists(self, key: str) -> bool:
        try:
            self.gateway.stat("/" + key)
        except KeyNotFound:
            return False
        return True


def _dump(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def _json(data: bytes, key: str, fmt: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise _refusal(f"not JSON: {exc}", key, "json", fmt) from exc
    if not isinstance(doc, dict):
        raise _refusal("attributes.json must be a JSON object", key, "attributes", fmt)
    return doc


def _level(config: dict[str, Any], default: int) -> int:
    level = config.get("level", default)
    return level if isinstance(level, int) and 0 <= level <= 9 else default


def _blosc(config: dict[str, Any], itemsize: int) -> dict[str, Any]:
    shuffle = config.get("shuffle", 1)
    return {
        "cname": config.get("cname", "lz4"),
        "clevel": config.get("clevel", 5),
        "shuffle": shuffle,
        "blocksize": config.get("blocksize", 0),
        "typesize": itemsize,
    }


def _unsupported(name: str, key: str) -> Rejected:
    why = (
        f"N5 compression {name!r}: this view stores gzip, zstd, blosc or raw blocks as Zarr "
        "codecs (it does not transcode: the writer would read back another compression)"
    )
    return _refusal(why, key, "compression", "n5")


def _v3_codecs(compression: dict[str, Any], itemsize: int, key: str) -> list[dict[str, Any]]:
    """The bytes-to-bytes codecs of a v3 array for an N5 ``compression``."""
    name = compression.get("type")
    if name == "raw":
        return []
    if name == "gzip":  # useZlib too: v3 has no zlib codec; blocks are re-encoded anyway
        return [{"name": "gzip", "configuration": {"level": _level(compression, 6)}}]
    if name == "zstd":
        level = compression.get("level", 3)
        return [{"name": "zstd", "configuration": {"level": level, "checksum": False}}]
    if name == "blosc":
        config = _blosc(compression, itemsize)
        config["shuffle"] = _SHUFFLE.get(config["shuffle"], "shuffle")
        return [{"name": "blosc", "configuration": config}]
    raise _unsupported(str(name), key)


def _v2_compressor(compression: dict[str, Any], itemsize: int, key: str) -> Any:
    """The numcodecs compressor of a v2 array for an N5 ``compression``."""
    name = compression.get("type")
    if name == "raw":
        return None
    if name == "gzip":
        codec = "zlib" if compression.get("useZlib") else "gzip"
        return {"id": codec, "level": _level(compression, 6 if codec == "gzip" else 1)}
    if name == "zstd":
        return {"id": "zstd", "level": compression.get("level", 3)}
    if name == "blosc":
        config = _blosc(compression, itemsize)
        del config["typesize"]
        return {"id": "blosc", **config}
    raise _unsupported(str(name), key)
