"""``--as zarr3`` and ``--as zarr2``: every group and array of the store as Zarr.

An N5 dataset becomes a Zarr array with its shape and chunk shape reversed (N5 lists the
fastest axis first; in C order the bytes of a block need no transposition), its type in N5's
big-endian byte order, fill value 0 (what N5 readers give for a missing block), and its
attributes other than the dataset keys, through :func:`~n5fs.views.attributes.from_n5` (as
are an N5 group's): those kept under ``zarr_attributes`` (Zarr attributes the N5 view could
not give N5's key of that name) come back as they were, fitting per-axis conventions
(``units``, ``resolution``, ...) are reversed into Zarr's axis order, and ``axes`` are the
v3 array's ``dimension_names`` (in v2 the ``axes`` attribute). A Zarr array of the other
version is converted (a sharded v3 array seen as v2 shows each inner chunk as a chunk of its
own, in the array's axes also where a ``transpose`` before ``sharding_indexed`` stored the
shards transposed: such a chunk is served decoded unless the transpositions add up to F
order; where a bytes codec after ``sharding_indexed`` wraps each shard, the chunks are whole
shards, decoded); an array already of the target format, and everything of a native
hierarchy, is shown as stored.

Chunks (:class:`ZarrArray`):

- where the target has the source's codec (:mod:`n5fs.views.declared_codecs`), a chunk is the stored
  payload: the whole Zarr chunk, the inner chunk's byte range, the N5 block after its header;
- an N5 end block clipped to the dataset is decoded, padded with the fill value to the full
  chunk and re-encoded in a frame of that codec whose size is known in advance
  (:mod:`n5fs.views.stored`); interior blocks are never clipped;
- otherwise the chunk is served decoded, uncompressed (the view declares no compressor).

Chunk keys are the v2 style ``z.y.x`` (``"."``: one flat folder, no folder that exists only
in the view), except where the source's keys are already what the view declares (a Zarr v2
array seen as v3 keeps its keys under the ``v2`` chunk key encoding, and a v3 array with the
``v2`` encoding seen as v2): then its folders are the source's. Sizes come from metadata and
listings: a kept payload's size is the stored one (less the N5 header), a rebuilt or decoded
chunk's follows from the chunk shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from n5fs.codecs.v3 import BytesCodec, TransposeCodec
from n5fs.detect import Folder, FolderKind
from n5fs.formats.base import KeyKind
from n5fs.formats.registry import get_format
from n5fs.formats.zarr2 import Zarr2ArrayNode
from n5fs.formats.zarr3 import Zarr3ArrayNode
from n5fs.gateway.namespace.paths import EntryKind
from n5fs.views import declared_codecs as codecs
from n5fs.views.arrays import (
    Located,
    N5StoreArray,
    Position,
    ShardedStoreArray,
    StoreArray,
    ZarrStoreArray,
    store_array,
)
from n5fs.views.attributes import from_n5
from n5fs.views.declared_codecs import ZARR2, ZARR3, ViewCodec
from n5fs.views.tree import (
    DIRECTORY,
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

#: value kinds both Zarr versions and TensorStore read: bool, ints, floats, complex
_NUMERIC_KINDS = "biufc"
_DOCS = {ZARR3: ("zarr.json",), ZARR2: (".zarray", ".zattrs")}


@dataclass(frozen=True)
class ZarrArray:
    """One source array as the Zarr view of ``target`` shows it."""

    source: StoreArray
    target: str
    codec: ViewCodec
    #: "F": chunks stay in a Zarr v2 array's F order (v3: a reversed transpose codec)
    order: str = "C"
    #: the view's chunk keys are the source's own (its folders are the view's)
    identity: bool = False
    separator: str = "."
    attributes: Mapping[str, Any] = field(default_factory=dict)
    #: a v3 array's ``dimension_names`` (None: none declared)
    dimension_names: tuple[str | None, ...] | None = None
    #: the byte order of the stored payloads a Zarr v2 view passes through (``">"``, ``"<"``;
    #: ``""``: the source's type says it): a v3 array's ``bytes`` codec names its endianness
    #: apart from its data type, a v2 ``dtype`` carries it
    byte_order: Literal["", "<", ">"] = ""

    # -- metadata ------------------------------------------------------------------------------

    @cached_property
    def documents(self) -> dict[str, bytes]:
        """The array's metadata files (made once per plan)."""
        if self.target == ZARR3:
            return {"zarr.json": to_json(self._zarr_json())}
        docs = {".zarray": to_json(self._zarray())}
        if self.attributes:
            docs[".zattrs"] = to_json(self.attributes)
        return docs

    def _zarr_json(self) -> dict[str, Any]:
        dtype = self.source.dtype
        bytes_config = {} if dtype.itemsize == 1 else {"endian": _endian(dtype)}
        codec_list: list[Any] = [{"name": "bytes", "configuration": bytes_config}]
        if self.order == "F":
            order = list(range(len(self.source.shape)))[::-1]
            codec_list.insert(0, {"name": "transpose", "configuration": {"order": order}})
        doc = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(self.source.shape),
            "data_type": "bool" if dtype.kind == "b" else dtype.newbyteorder("=").name,
            "chunk_grid": {
                "name": "regular",
                "configuration": {"chunk_shape": list(self.source.units)},
            },
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": self.separator}},
            "fill_value": fill_json(self.source.fill, dtype),
            "codecs": codec_list + list(self.codec.config),
            "attributes": dict(self.attributes),
        }
        if self.dimension_names is not None:
            doc["dimension_names"] = list(self.dimension_names)
        return doc

    def _zarray(self) -> dict[str, Any]:
        return {
            "zarr_format": 2,
            "shape": list(self.source.shape),
            "chunks": list(self.source.units),
            "dtype": self._v2_dtype().str,
            "compressor": self.codec.config,
            "fill_value": fill_json(self.source.fill, self.source.dtype),
            "order": self.order,
            "filters": None,
            "dimension_separator": self.separator,
        }

    def _v2_dtype(self) -> np.dtype[Any]:
        """The ``dtype`` of a Zarr v2 view: the stored byte order where payloads pass through
        as stored, else the source's type (what decoded chunks are served in)."""
        dtype = self.source.dtype
        if self.codec.passthrough and self.byte_order and dtype.itemsize > 1:
            return dtype.newbyteorder(self.byte_order)
        return dtype

    # -- chunk keys ----------------------------------------------------------------------------

    def key(self, pos: Position) -> str:
        if self.identity:
            return self.source.node.chunk_key(pos)
        return ".".join(map(str, pos)) if pos else "0"

    def parse(self, rel: str) -> Position | None:
        """The unit a view chunk key names (in the grid), else None."""
        if self.identity:
            what = self.source.node.classify(rel)
            ok = what.kind is KeyKind.CHUNK and what.in_grid
            return what.position if ok else None
        if not self.source.shape:
            return () if rel == "0" else None
        parts = rel.split(".")
        if len(parts) != len(self.source.shape) or not all(
            p.isdigit() and p.isascii() and (p == "0" or p[0] != "0") for p in parts
        ):
            return None
        pos = tuple(int(p) for p in parts)
        return pos if self.source.in_grid(pos) else None

    # -- chunks --------------------------------------------------------------------------------

    def _kept(self, pos: Position) -> bool:
        """Is the unit served as its stored payload (else rebuilt or decoded)?"""
        return self.codec.passthrough and self.source.full(pos)

    def size(self, pos: Position, loc: Located) -> int:
        """The view chunk's size, from metadata and the listing (the claim of ``stat``)."""
        if self._kept(pos):
            if isinstance(self.source, N5StoreArray):
                return loc.attr.size - self.source.header_size
            return loc.attr.size if loc.nbytes is None else loc.nbytes
        return self.codec.frame.size(self.source.unit_nbytes)

    def content(self, pos: Position, loc: Located) -> bytes:
        if self._kept(pos):
            data = self.source.payload(loc)
            if data is not None:
                return data

        def make() -> bytes:
            values = self.source.values(pos, loc)
            full = np.full(self.source.units, self.source.fill, dtype=self.source.dtype)
            full[tuple(slice(0, n) for n in values.shape)] = values
            self.source.access.count("translated")
            return self.codec.frame.encode(full.tobytes(order="C"))

        data = self.source.access.computed(self.target, loc.cache_key, loc.attr, make)
        assert data is not None
        return data

    def chunk_entry(self, pos: Position, loc: Located) -> Entry:
        if self.identity and self._kept(pos) and loc.offset is None:
            return native(loc.attr)  # the stored chunk itself, served by the gateway
        return made(self.size(pos, loc), loc.attr.mtime, lambda: self.content(pos, loc))


def _endian(dtype: np.dtype[Any]) -> str:
    return "big" if dtype.byteorder == ">" else "little"


def fill_json(value: Any, dtype: np.dtype[Any]) -> Any:
    """A fill value as both Zarr versions spell it (NaN and infinities as strings)."""
    scalar = np.asarray(value, dtype=dtype).item()
    if dtype.kind == "b":
        return bool(scalar)
    if dtype.kind in "iu":
        return int(scalar)
    if dtype.kind == "c":
        return [_float_json(scalar.real), _float_json(scalar.imag)]
    return _float_json(float(scalar))


def _float_json(value: float) -> Any:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _numeric(dtype: np.dtype[Any], target: str) -> str | None:
    """Why ``dtype`` has no type in ``target`` every reader reads, or None."""
    if dtype.fields is None and dtype.kind in _NUMERIC_KINDS:
        return None
    version = "v3" if target == ZARR3 else "v2"
    return f"data type {dtype.str} has no Zarr {version} type every reader reads"


def _to_v2(source: ZarrStoreArray) -> ZarrArray:
    """A Zarr v3 array (sharded: its inner chunks) as Zarr v2."""
    node = source.node
    assert isinstance(node, Zarr3ArrayNode)
    outer = node.codecs
    if outer.bytes_bytes and node.sharding is not None:
        names = ", ".join(c.name for c in outer.bytes_bytes)
        why = (
            f"{names} after sharding_indexed wraps each shard whole: every shard is decoded "
            "and served as one chunk"
        )
        whole = ZarrStoreArray(source.access, source.prefix, node)
        return ZarrArray(whole, ZARR2, codecs.raw(ZARR2, why), attributes=node.attributes)
    if node.sharding is not None and not isinstance(source, ShardedStoreArray):
        source = ShardedStoreArray(source.access, source.prefix, node)  # transposed shards
    if isinstance(source, ShardedStoreArray):
        chain = source.codec.inner
        order, why = _v2_layout(chain, source.order)
        if why and source.order != tuple(range(len(source.order))):
            why = f"shards transposed before sharding_indexed, each inner chunk decoded: {why}"
    else:
        chain = outer
        order, why = _v2_layout(chain)
    bytes_bytes = chain.bytes_bytes
    endian = chain.array_bytes.endian if isinstance(chain.array_bytes, BytesCodec) else None
    codec = codecs.raw(ZARR2, why) if why else codecs.v3_to_v2(bytes_bytes)
    identity = node.key_encoding.name == "v2" and not isinstance(source, ShardedStoreArray)
    return ZarrArray(
        source,
        ZARR2,
        codec,
        order if codec.passthrough else "C",
        identity,
        node.key_encoding.separator if identity else ".",
        node.attributes,
        byte_order=">" if endian == "big" else "<" if endian == "little" else "",
    )


def _v2_layout(chain: CodecChain, outer: tuple[int, ...] | None = None) -> tuple[str, str]:
    """(order, why not kept) for a v3 chain's array codecs in Zarr v2 terms; ``outer``: the
    axes a sharded array's shards were transposed to before this (inner) chain. The stored
    bytes keep the view's values in C order when the transpositions compose to none, in F
    order when they reverse the axes; any other order is no Zarr v2 layout."""
    if not isinstance(chain.array_bytes, BytesCodec):
        return "C", f"Zarr v2 has no {chain.array_bytes.name} codec"
    identity = tuple(range(len(chain.spec.shape)))
    order = identity if outer is None else outer
    for codec in chain.array_array:
        assert isinstance(codec, TransposeCodec)  # the only array -> array codec
        order = tuple(order[i] for i in codec.order)
    if order == identity:
        return "C", ""
    if order == identity[::-1]:
        return "F", ""
    return "C", "Zarr v2 keeps C or F order only"


def zarr_array(access: StoreAccess, folder: Folder, target: str) -> ZarrArray | str:
    """The Zarr view of the array in ``folder``, or why the view leaves it out."""
    node = folder.array
    assert node is not None
    source = store_array(access, folder.prefix, node)
    if isinstance(source, str):
        return source
    if isinstance(source, N5StoreArray):
        codec = codecs.from_n5(source.node.compression, target, source.dtype.itemsize)
        attrs, names = from_n5(node.attributes, len(node.shape), named=target == ZARR3)
        return ZarrArray(source, target, codec, attributes=attrs, dimension_names=names)
    assert isinstance(source, ZarrStoreArray)
    why = _numeric(source.dtype, target)
    if why is not None:
        return why
    if target == ZARR2:
        return _to_v2(source)
    assert isinstance(node, Zarr2ArrayNode)
    codec = codecs.v2_to_v3(node.meta.pipeline, source.dtype.itemsize)
    order = node.meta.order if codec.passthrough else "C"
    return ZarrArray(source, ZARR3, codec, order, True, node.meta.separator, node.attributes)


class ZarrTree(ViewTree):
    """The namespace of ``--as zarr3`` / ``--as zarr2`` (see the module docs)."""

    def __init__(self, access: StoreAccess, target: str) -> None:
        super().__init__(access)
        if target not in (ZARR3, ZARR2):
            raise ValueError(f"no Zarr view {target!r}")
        self.name = target
        self._plans: PlanCache[ZarrArray | str] = PlanCache()

    def plan(self, folder: Folder) -> ZarrArray | str:
        node = folder.array
        assert node is not None
        return self._plans.get(
            folder.prefix, node, lambda: zarr_array(self.access, folder, self.name)
        )

    def is_native(self, folder: Folder) -> bool:
        fmt = folder.format
        return fmt is not None and self.name in (fmt.name, fmt.refines)

    # -- groups and plain folders --------------------------------------------------------------

    def documents(self, folder: Folder) -> Mapping[str, bytes]:
        if folder.kind is not FolderKind.GROUP or self.is_native(folder):
            return {}
        attrs = dict(folder.node.attributes) if folder.node is not None else {}
        if folder.fmt == "n5":
            attrs, _ = from_n5(attrs)
        if self.name == ZARR3:
            return {
                "zarr.json": to_json({"zarr_format": 3, "node_type": "group", "attributes": attrs})
            }
        docs = {".zgroup": to_json({"zarr_format": 2})}
        if attrs:
            docs[".zattrs"] = to_json(attrs)
        return docs

    def subfolder(self, key: str, attr: Attr) -> Entry | None:
        folder = self.access.folder(key)
        left_out = folder.kind is FolderKind.ARRAY and not self.is_native(folder)
        if left_out and isinstance(self.plan(folder), str):
            return None  # left out: `n5fs detect --as` says why
        return Entry(EntryKind.DIR, mtime=attr.mtime)

    def listed(
        self, folder: Folder, name: str, key: str, attr: Attr
    ) -> Iterator[tuple[str, Entry]]:
        if attr.kind is EntryKind.DIR and (folder.fmt == "n5" or self.is_native(folder)):
            # every N5 dataset has a Zarr form, and a native group's folders are as stored:
            # no need to detect each sub-folder to list this one
            yield name, Entry(EntryKind.DIR, mtime=attr.mtime)
            return
        yield from super().listed(folder, name, key, attr)

    # -- arrays --------------------------------------------------------------------------------

    def in_array(self, array: Folder, rel: str) -> Entry | None:
        if self.is_native(array):
            attr = self.access.lookup(array.prefix + rel)
            return None if attr is None else native(attr)
        plan = self.plan(array)
        if isinstance(plan, str):
            return None
        doc = plan.documents.get(rel)
        if doc is not None:
            return document(doc)
        pos = plan.parse(rel)
        if pos is None:
            attr = self.access.lookup(array.prefix + rel) if plan.identity else None
            return DIRECTORY if attr is not None and attr.kind is EntryKind.DIR else None
        loc = plan.source.locate(pos)
        return None if loc is None else plan.chunk_entry(pos, loc)

    def array_children(self, array: Folder, rel_dir: str) -> list[tuple[str, Entry]]:
        if self.is_native(array):
            listing = self.access.listing((array.prefix + rel_dir).rstrip("/"))
            return [(name, native(attr)) for name, attr in listing]
        plan = self.plan(array)
        if isinstance(plan, str):
            return []
        out: list[tuple[str, Entry]] = []
        if not rel_dir:
            out += [(name, document(doc)) for name, doc in plan.documents.items()]
        if not plan.identity:
            if not rel_dir:
                present = plan.source.present()
                out += [(plan.key(pos), plan.chunk_entry(pos, loc)) for pos, loc in present.items()]
            return out
        for name, attr in self.access.listing((array.prefix + rel_dir).rstrip("/")):
            if attr.kind is EntryKind.DIR:
                out.append((name, Entry(EntryKind.DIR, mtime=attr.mtime)))
                continue
            pos = plan.parse(rel_dir + name)
            if pos is not None and attr.kind is EntryKind.FILE:
                loc = Located(array.prefix + rel_dir + name, attr)
                out.append((name, plan.chunk_entry(pos, loc)))
        return out

    # -- detect --as ---------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        return describe_tree(self, self._describe_array)

    def _describe_array(self, folder: Folder, path: str) -> dict[str, Any]:
        if self.is_native(folder):
            return native_array(folder, path)
        plan = self.plan(folder)
        if isinstance(plan, str):
            return left_out(folder, path, plan)
        source = plan.source
        return {
            "path": path,
            "format": self.name,
            "kind": "array",
            "from": get_format(folder.fmt).name if folder.fmt else None,
            "dtype": source.dtype.str,
            "shape": list(source.shape),
            "chunks": list(source.units),
            "codecs": codecs.summary(plan.codec),
        }
