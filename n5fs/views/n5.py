"""``--as n5``: every group and numeric Zarr array of the store as N5.

A Zarr array (v2 or v3) becomes an N5 dataset with its shape and chunk shape reversed (N5
lists the fastest axis first), so the bytes of a C-order Zarr chunk are, value for value, the
payload of the N5 block at the reversed position: N5 payloads are big-endian in F order of
the N5 dimensions, which is C order of the Zarr ones. A sharded v3 array shows each *inner*
chunk as a block (``blockSize`` is the inner chunk shape), except where its shards must be
read whole (:func:`~n5fs.views.arrays.whole_shards`: a bytes codec after
``sharding_indexed``, a transposition before it): one block per shard, decoded. Groups (and
the root, which carries ``"n5": "4.0.0"``) get an ``attributes.json`` with their attributes;
an N5 hierarchy already in the store is shown as stored. Attributes go through
:func:`~n5fs.views.attributes.to_n5`: one that does not fit the N5 key of its name (a dataset
key, ``units`` that are no list of strings, ...) is kept under ``zarr_attributes``, fitting
per-axis conventions are reversed, a v3 array's ``dimension_names`` are its ``axes``.

Blocks (:class:`N5Dataset`), at ``x/y/z`` (N5 order, one folder per axis but the last):

- an interior block whose stored bytes N5 can keep (big-endian or one-byte values, C order,
  no filter or array codec, a compressor N5 has: gzip, zlib as gzip ``useZlib``, zstd,
  blosc, none) is the N5 header plus the stored chunk (or inner chunk) as it is;
- an end block is clipped to the dataset, as N5 writers write it (N5 Java, z5 and
  TensorStore all read clipped blocks; z5 reads no full-size end block): decoded and
  re-encoded in a frame of that codec whose size is known in advance
  (:mod:`n5fs.views.stored`), header dims the clipped extent;
- any other array (little-endian, F order, filters, transposes, checksums) is transcoded:
  every block decoded, byte-swapped to big-endian and served uncompressed (``raw``).

N5 has no fill value: its readers read 0 where no block is stored. An array whose fill value
is not 0 (any whose bytes are not all zero: NaN, -1, -0.0...) shows a *fill block* wherever
its grid has no stored chunk (:meth:`N5Dataset.fill_entry`): the fill value in the block's
(clipped) shape, in the declared compression's stored frame, so its size follows from the
shape, and the block itself is made once per shape (at most ``2**rank``: end blocks are
clipped) and kept in the byte cache (:meth:`~n5fs.views.access.StoreAccess.from_metadata`),
never stored. Such an array's block folders list every name of the grid (from metadata, no
listing of chunks); one whose fill value is 0 lists only its stored blocks, as N5 does.

Every size follows from metadata and the source's listings, no chunk read. What N5 cannot
express is left out (and ``n5fs detect --as n5`` says why): data types other than
(u)int8..64 and float32/64 (bool, float16, complex, strings, structured, datetime, objects)
and 0-d arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from n5fs.codecs.n5_header import encode_header
from n5fs.codecs.v3 import BytesCodec
from n5fs.detect import Folder, FolderKind
from n5fs.formats.registry import get_format
from n5fs.formats.zarr2 import Zarr2ArrayNode
from n5fs.formats.zarr3 import Zarr3ArrayNode
from n5fs.gateway.namespace.paths import EntryKind
from n5fs.views import declared_codecs as codecs
from n5fs.views.arrays import (
    Located,
    Position,
    ShardedStoreArray,
    StoreArray,
    store_array,
)
from n5fs.views.attributes import to_n5
from n5fs.views.declared_codecs import N5, ViewCodec
from n5fs.views.tree import (
    DIRECTORY,
    FILL_DIRECTORY,
    Entry,
    PlanCache,
    ViewTree,
    describe_tree,
    document,
    left_out,
    made,
    native,
    native_array,
    to_json,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from n5fs.codecs.v3 import CodecChain
    from n5fs.gateway import Attr
    from n5fs.views.access import StoreAccess

N5_VERSION = "4.0.0"
ATTRIBUTES = "attributes.json"
_N5_TYPES = frozenset(
    ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"]
)


@dataclass(frozen=True)
class N5Dataset:
    """One Zarr array as the N5 view shows it."""

    source: StoreArray
    codec: ViewCodec
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def document(self) -> bytes:
        node = self.source.node  # a v3 array's axis names are its dimension_names
        names = node.dimension_names if isinstance(node, Zarr3ArrayNode) else None
        doc = to_n5(self.attributes, self.rank, names, named=isinstance(node, Zarr3ArrayNode))
        doc.update(
            dimensions=list(self.source.shape[::-1]),
            blockSize=list(self.source.units[::-1]),
            dataType=self.source.dtype.newbyteorder("=").name,
            compression=self.codec.config,
        )
        return to_json(doc)

    @property
    def rank(self) -> int:
        return len(self.source.shape)

    # -- block keys ----------------------------------------------------------------------------

    @staticmethod
    def key(pos: Position) -> str:
        return "/".join(map(str, pos[::-1]))

    def parse(self, rel: str) -> tuple[int, ...] | None:
        """The N5 grid indices ``rel`` names (a prefix of them for a block folder)."""
        parts = rel.rstrip("/").split("/")
        if len(parts) > self.rank or not all(p.isdigit() and p.isascii() for p in parts):
            return None
        if any(p != "0" and p[0] == "0" for p in parts):
            return None
        grid = self.source.grid[::-1]
        n5 = tuple(int(p) for p in parts)
        return n5 if all(i < g for i, g in zip(n5, grid, strict=False)) else None

    # -- blocks --------------------------------------------------------------------------------

    def _kept(self, pos: Position) -> bool:
        return self.codec.passthrough and self.source.clipped(pos) == self.source.units

    def _header(self, pos: Position) -> bytes:
        return encode_header(self.source.clipped(pos)[::-1])

    def size(self, pos: Position, loc: Located) -> int:
        """The block's size, from metadata and the listing (the claim of ``stat``)."""
        if self._kept(pos):
            return 4 + 4 * self.rank + (loc.attr.size if loc.nbytes is None else loc.nbytes)
        return self._made_size(pos)

    def _made_size(self, pos: Position) -> int:
        """The size of a block the view encodes in its codec's stored frame."""
        nbytes = prod(self.source.clipped(pos)) * self.source.dtype.itemsize
        return 4 + 4 * self.rank + self.codec.frame.size(nbytes)

    def content(self, pos: Position, loc: Located) -> bytes:
        if self._kept(pos):
            data = self.source.payload(loc)
            if data is not None:
                return self._header(pos) + data

        def make() -> bytes:
            values = self.source.values(pos, loc)
            big = np.ascontiguousarray(values, dtype=self.source.dtype.newbyteorder(">"))
            self.source.access.count("translated")
            return self._header(pos) + self.codec.frame.encode(big.tobytes(order="C"))

        data = self.source.access.computed(N5, loc.cache_key, loc.attr, make)
        assert data is not None
        return data

    def block_entry(self, pos: Position, loc: Located) -> Entry:
        return made(self.size(pos, loc), loc.attr.mtime, lambda: self.content(pos, loc))

    # -- fill blocks (absent chunks of an array whose fill value is not 0) ---------------------

    @cached_property
    def fill(self) -> bytes | None:
        """One fill value as an N5 payload holds it (big-endian); None when its bytes are all
        zero: N5 readers read that where no block is, and the view makes no fill block."""
        value = np.asarray(self.source.fill, dtype=self.source.dtype.newbyteorder(">"))
        raw = value.tobytes()
        return raw if any(raw) else None

    def fill_entry(self, pos: Position) -> Entry:
        """The block at ``pos`` of the grid where no chunk is stored (``fill`` is not None)."""
        return made(self._made_size(pos), 0.0, lambda: self._fill_block(pos), fill=True)

    def _fill_block(self, pos: Position) -> bytes:
        fill = self.fill
        assert fill is not None
        shape = self.source.clipped(pos)
        frame = self.codec.frame

        def make() -> bytes:
            self.source.access.count("fill_blocks")
            return self._header(pos) + frame.encode(fill * prod(shape))

        # every input named: the same block serves every array of this type, fill and frame
        key = f"{self.source.dtype.str}\x00{fill.hex()}\x00{frame.name}\x00{shape}"
        return self.source.access.from_metadata("n5-fill", key, make)


def _layout_problem(source: StoreArray) -> str:
    """Why the source's stored bytes are not an N5 payload (byte order, layout), or ""."""
    dtype = source.dtype
    node = source.node
    if isinstance(node, Zarr2ArrayNode):
        if node.meta.order != "C":
            return "F-order chunks are re-laid out in N5's order"
        big = dtype.itemsize == 1 or dtype.byteorder == ">"
        return "" if big else "little-endian values are byte-swapped to N5's big-endian"
    assert isinstance(node, Zarr3ArrayNode)
    if node.sharding is not None and not isinstance(source, ShardedStoreArray):
        return _whole_shards_problem(node)
    chain: CodecChain = source.codec.inner if isinstance(source, ShardedStoreArray) else node.codecs
    if chain.array_array or not isinstance(chain.array_bytes, BytesCodec):
        return "array codecs are decoded into N5's layout"
    if dtype.itemsize > 1 and chain.array_bytes.endian != "big":
        return "little-endian values are byte-swapped to N5's big-endian"
    return ""


def _unsupported(source: StoreArray) -> str | None:
    """Why N5 cannot show the array, or None."""
    dtype = source.dtype
    if dtype.fields is not None or dtype.newbyteorder("=").name not in _N5_TYPES:
        return f"data type {dtype.str} has no N5 dataType"
    if not source.shape:
        return "N5 has no 0-d datasets"
    return None


def n5_dataset(access: StoreAccess, folder: Folder) -> N5Dataset | str:
    """The N5 view of the Zarr array in ``folder``, or why the view leaves it out."""
    node = folder.array
    assert node is not None
    source = store_array(access, folder.prefix, node)
    if isinstance(source, str):
        return source
    why = _unsupported(source)
    if why is not None:
        return why
    itemsize = source.dtype.itemsize
    if isinstance(node, Zarr2ArrayNode):
        codec = codecs.n5_from_v2(node.meta.pipeline, itemsize)
    else:
        assert isinstance(node, Zarr3ArrayNode)
        inner = source.codec.inner if isinstance(source, ShardedStoreArray) else node.codecs
        codec = codecs.n5_from_v3(inner.bytes_bytes, itemsize)
    layout = _layout_problem(source)
    if layout and codec.passthrough:
        codec = codecs.n5_transcoded(layout)
    return N5Dataset(source, codec, node.attributes)


def _whole_shards_problem(node: Zarr3ArrayNode) -> str:
    """Why a sharded array whose shards are read whole is transcoded (one block per shard)."""
    after = node.codecs.bytes_bytes
    if after:
        names = ", ".join(c.name for c in after)
        return (
            f"{names} after sharding_indexed wraps each shard whole: every shard is one "
            "block, decoded"
        )
    return "shards transposed before sharding_indexed: every shard is one block, decoded"


class N5Tree(ViewTree):
    """The namespace of ``--as n5`` (see the module docs)."""

    name = N5

    def __init__(self, access: StoreAccess) -> None:
        super().__init__(access)
        self._plans: PlanCache[N5Dataset | str] = PlanCache()

    def plan(self, folder: Folder) -> N5Dataset | str:
        node = folder.array
        assert node is not None
        return self._plans.get(folder.prefix, node, lambda: n5_dataset(self.access, folder))

    def is_native(self, folder: Folder) -> bool:
        fmt = folder.format
        return fmt is not None and N5 in (fmt.name, fmt.refines)

    # -- groups and plain folders --------------------------------------------------------------

    def documents(self, folder: Folder) -> Mapping[str, bytes]:
        if self.is_native(folder):
            return {}
        root = folder.prefix == ""
        if folder.kind is not FolderKind.GROUP and not root:
            return {}  # a plain folder: an N5 group without attributes
        attrs = to_n5(folder.node.attributes) if folder.node is not None else {}
        if root:
            attrs["n5"] = N5_VERSION
        return {ATTRIBUTES: to_json(attrs)}

    def subfolder(self, key: str, attr: Attr) -> Entry | None:
        folder = self.access.folder(key)
        left_out = folder.kind is FolderKind.ARRAY and not self.is_native(folder)
        if left_out and isinstance(self.plan(folder), str):
            return None  # left out: `n5fs detect --as n5` says why
        return Entry(EntryKind.DIR, mtime=attr.mtime)

    def listed(
        self, folder: Folder, name: str, key: str, attr: Attr
    ) -> Iterator[tuple[str, Entry]]:
        if attr.kind is EntryKind.DIR and self.is_native(folder):
            yield name, Entry(EntryKind.DIR, mtime=attr.mtime)  # as stored: no detection
            return
        yield from super().listed(folder, name, key, attr)

    # -- datasets ------------------------------------------------------------------------------

    def in_array(self, array: Folder, rel: str) -> Entry | None:
        if self.is_native(array):
            attr = self.access.lookup(array.prefix + rel)
            return None if attr is None else native(attr)
        plan = self.plan(array)
        if isinstance(plan, str):
            return None
        if rel == ATTRIBUTES:
            return document(plan.document)
        n5 = plan.parse(rel)
        if n5 is None:
            return None
        if len(n5) < plan.rank:
            return DIRECTORY  # a block folder of the grid (listed where blocks are)
        loc = plan.source.locate(n5[::-1])
        if loc is not None:
            return plan.block_entry(n5[::-1], loc)
        return None if plan.fill is None else plan.fill_entry(n5[::-1])

    def array_children(self, array: Folder, rel_dir: str) -> list[tuple[str, Entry]]:
        if self.is_native(array):
            listing = self.access.listing((array.prefix + rel_dir).rstrip("/"))
            return [(name, native(attr)) for name, attr in listing]
        plan = self.plan(array)
        if isinstance(plan, str):
            return []
        above = plan.parse(rel_dir) if rel_dir else ()
        if above is None:
            return []
        depth = len(above)
        out: dict[str, Entry] = {}
        if not rel_dir:
            out[ATTRIBUTES] = document(plan.document)
        for pos, loc in plan.source.present().items():
            n5 = pos[::-1]
            if n5[:depth] != above:
                continue
            name = str(n5[depth])
            if depth + 1 < plan.rank:
                out[name] = DIRECTORY
            else:
                out[name] = plan.block_entry(pos, loc)
        if plan.fill is not None:  # every other name of the grid here: fill blocks
            leaf = depth + 1 == plan.rank
            for i in range(plan.source.grid[::-1][depth]):
                if str(i) not in out:
                    pos = (*above, i)[::-1]
                    out[str(i)] = plan.fill_entry(pos) if leaf else FILL_DIRECTORY
        return list(out.items())

    # -- detect --as n5 ------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        return describe_tree(
            self, self._describe_array, group_kinds=(FolderKind.GROUP, FolderKind.PLAIN)
        )

    def _describe_array(self, folder: Folder, path: str) -> dict[str, Any]:
        if self.is_native(folder):
            return native_array(folder, path)
        plan = self.plan(folder)
        if isinstance(plan, str):
            return left_out(folder, path, plan)
        source = plan.source
        described: dict[str, Any] = {
            "path": path,
            "format": N5,
            "kind": "array",
            "from": get_format(folder.fmt).name if folder.fmt else None,
            "dtype": source.dtype.newbyteorder(">").str,
            "shape": list(source.shape[::-1]),
            "chunks": list(source.units[::-1]),
            "codecs": codecs.summary(plan.codec),
        }
        if plan.fill is not None:
            # counting the absent ones would list every chunk folder (and read every shard
            # index): the grid's size says the most there can be
            described["fill_blocks"] = {
                "fill_value": fill_json(source.fill, source.dtype),
                "where": "every absent block",
                "grid_blocks": prod(source.grid),
            }
        return described


def fill_json(value: Any, dtype: np.dtype[Any]) -> Any:
    """A fill value as Zarr writes it in JSON (``"NaN"``, ``"Infinity"``, ``"-Infinity"`` for
    the floats JSON has no number for)."""
    item = np.asarray(value, dtype=dtype).item()
    if isinstance(item, float) and not np.isfinite(item):
        return "NaN" if np.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
    return item
