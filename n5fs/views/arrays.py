"""The arrays of a store as every view sees them: C order, cut into units.

A :class:`StoreArray` is one array of the store in *view order*: the axes a Zarr view
shows (an N5 dataset's reversed: N5 lists the fastest-varying axis first, so the bytes of an
N5 block read in C order with its dimensions reversed, and no value moves), cut into *units*
(its chunks; a sharded Zarr v3 array's inner chunks, or its shards where they must be read
whole: :func:`whole_shards`). Each unit is found from metadata and the gateway's listings
alone (:meth:`StoreArray.locate`, no chunk read), and read as its stored bytes
(:meth:`~StoreArray.payload`, for a view that keeps the codec) or as values
(:meth:`~StoreArray.values`, decoded once and cached).

N5 blocks are decoded here from the header and the dataset's ``compression`` (the public
pieces of :mod:`n5fs.codecs`) rather than through
:meth:`~n5fs.formats.n5.N5ArrayNode.decode_chunk`: that one returns N5-order, native-endian
values, two copies away from the payload, which in view order and in the stored big-endian
type *is* the answer. The checks are the node's: dims equal the block or its clipped extent,
the payload decodes to exactly the elements the header states, bounded.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from n5fs.codecs.limits import CodecError, check_size
from n5fs.codecs.n5_header import MODE_DEFAULT, decode_header
from n5fs.codecs.v3 import EMPTY, ShardingCodec, TransposeCodec
from n5fs.errors import N5fsError
from n5fs.formats.base import KeyKind
from n5fs.formats.n5 import N5ArrayNode
from n5fs.formats.zarr2 import Zarr2ArrayNode
from n5fs.formats.zarr3 import Zarr3ArrayNode
from n5fs.gateway.namespace.paths import EntryKind

if TYPE_CHECKING:
    from n5fs.formats.base import ArrayNode
    from n5fs.gateway import Attr
    from n5fs.views.access import StoreAccess

Position = tuple[int, ...]


class UnreadableUnit(N5fsError):
    """A stored unit the view cannot show (corrupt, or an N5 varlength block): EIO."""


@dataclass(frozen=True, slots=True)
class Located:
    """Where a unit lives: the object ``key`` (version ``attr``) or, for an inner chunk of a
    shard, ``nbytes`` bytes of it at ``offset``."""

    key: str
    attr: Attr
    offset: int | None = None
    nbytes: int | None = None

    @property
    def cache_key(self) -> str:
        return self.key if self.offset is None else f"{self.key}\x00{self.offset}"


class StoreArray(abc.ABC):
    """One array of the store, in view order (see the module docs)."""

    def __init__(self, access: StoreAccess, prefix: str, node: ArrayNode) -> None:
        self.access = access
        self.prefix = prefix
        self.node = node

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, ...]: ...

    @property
    @abc.abstractmethod
    def units(self) -> tuple[int, ...]:
        """The shape of one unit (chunk or inner chunk)."""

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype[Any]:
        """The values' type as stored (byte order included): views serve it unconverted."""

    @property
    @abc.abstractmethod
    def fill(self) -> Any:
        """What a missing unit holds."""

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // u) for s, u in zip(self.shape, self.units, strict=True))

    @property
    def unit_nbytes(self) -> int:
        return prod(self.units) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize

    def in_grid(self, pos: Position) -> bool:
        grid = self.grid
        return len(pos) == len(grid) and all(0 <= p < g for p, g in zip(pos, grid, strict=True))

    def clipped(self, pos: Position) -> tuple[int, ...]:
        """The part of unit ``pos`` inside the array."""
        return tuple(min(u, s - p * u) for p, u, s in zip(pos, self.units, self.shape, strict=True))

    @abc.abstractmethod
    def locate(self, pos: Position) -> Located | None:
        """Where unit ``pos`` is stored; None: not stored (it reads as the fill value)."""

    @abc.abstractmethod
    def present(self) -> dict[Position, Located]:
        """Every stored unit (walks the array's folders: for listings only)."""

    def full(self, pos: Position) -> bool:
        """Does the stored unit cover the whole unit shape? (Only N5 clips end blocks.)"""
        return True

    @abc.abstractmethod
    def payload(self, loc: Located) -> bytes | None:
        """The unit's stored bytes as a view with the same codec serves them; None when this
        unit cannot be served so (the caller decodes it instead)."""

    @abc.abstractmethod
    def _decode(self, pos: Position, data: bytes) -> np.ndarray[Any, Any]:
        """The values of unit ``pos`` from its stored bytes, in view order."""

    def values(self, pos: Position, loc: Located) -> np.ndarray[Any, Any]:
        """The unit's values in view order, clipped to the array (read-only, cached)."""
        shape = self._decoded_shape(pos)

        def make() -> bytes | None:
            data = self._stored(loc)
            if data is None:
                return None
            self.access.count("decoded")
            try:
                array = self._decode(pos, data)
            except CodecError as exc:
                raise UnreadableUnit(f"/{loc.key}: {exc.message}") from exc
            return np.ascontiguousarray(array, dtype=self.dtype).tobytes()

        raw = self.access.computed("values", loc.cache_key, loc.attr, make)
        if raw is None:
            return np.full(self.clipped(pos), self.fill, dtype=self.dtype)
        flat = np.frombuffer(raw, dtype=self.dtype)
        if shape is None or flat.size != prod(shape):
            shape = self.units if flat.size == prod(self.units) else self.clipped(pos)
        block = flat.reshape(shape)
        return block[tuple(slice(0, n) for n in self.clipped(pos))]

    def _decoded_shape(self, pos: Position) -> tuple[int, ...] | None:
        return self.units

    def _stored(self, loc: Located) -> bytes | None:
        if loc.offset is None:
            return self.access.whole(loc.key, loc.attr)
        assert loc.nbytes is not None
        return self.access.ranged(loc.key, loc.attr, loc.offset, loc.nbytes)

    def _walk(self, depth: int) -> dict[Position, Located]:
        """Chunk keys of the node under the array folder, down to ``depth`` folders."""
        found: dict[Position, Located] = {}

        def visit(rel_dir: str, level: int) -> None:
            for name, attr in self.access.listing((self.prefix + rel_dir).rstrip("/")):
                rel = rel_dir + name
                if attr.kind is EntryKind.DIR and level < depth:
                    visit(rel + "/", level + 1)
                elif attr.kind is EntryKind.FILE:
                    what = self.node.classify(rel)
                    if what.kind is KeyKind.CHUNK and what.in_grid and what.position is not None:
                        found[what.position] = Located(self.prefix + rel, attr)

        visit("", 0)
        return found


class N5StoreArray(StoreArray):
    """An N5 dataset: axes reversed, values big-endian as stored, missing blocks 0."""

    node: N5ArrayNode

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.dimensions[::-1]

    @property
    def units(self) -> tuple[int, ...]:
        return self.node.block_size[::-1]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.node.stored_dtype

    @property
    def fill(self) -> Any:
        return self.dtype.type(0)

    @property
    def header_size(self) -> int:
        """The default-mode header of a block of this dataset's rank."""
        return 4 + 4 * len(self.node.dimensions)

    def locate(self, pos: Position) -> Located | None:
        if not self.in_grid(pos):
            return None
        key = self.prefix + self.node.chunk_key(pos[::-1])
        attr = self.access.file(key)
        return None if attr is None else Located(key, attr)

    def present(self) -> dict[Position, Located]:
        return {pos[::-1]: loc for pos, loc in self._walk(len(self.shape)).items()}

    def full(self, pos: Position) -> bool:
        return self.clipped(pos) == self.units

    def payload(self, loc: Located) -> bytes | None:
        data = self._stored(loc)
        if data is None:
            return None
        try:
            header = decode_header(data)
        except CodecError:
            return None
        if header.mode != MODE_DEFAULT or header.dims != self.node.block_size:
            return None  # a varlength or clipped block: decoded and rebuilt instead
        return data[header.size :]

    def _decoded_shape(self, pos: Position) -> tuple[int, ...] | None:
        return None  # full (TensorStore) or clipped (N5 Java, z5): told by the size

    def _decode(self, pos: Position, data: bytes) -> np.ndarray[Any, Any]:
        node = self.node
        header = decode_header(data)
        n5pos = pos[::-1]
        extent = node.extent(n5pos)
        if len(header.dims) != len(extent) or any(
            d not in (b, e) for d, b, e in zip(header.dims, node.block_size, extent, strict=True)
        ):
            raise CodecError(
                f"block dims {list(header.dims)} fit neither blockSize {list(node.block_size)} "
                f"nor the clipped block {list(extent)}",
                rule="block-shape",
            )
        count = prod(header.dims)
        if header.num_elements != count:
            raise CodecError(
                f"a varlength block of {header.num_elements} elements is no {list(header.dims)} "
                "array",
                rule="block-varlength",
            )
        expected = count * self.dtype.itemsize
        payload = node.compression.decode(data[header.size :], expected)
        check_size(len(payload), expected, f"{node.compression.type} payload")
        return np.frombuffer(payload, dtype=self.dtype).reshape(header.dims[::-1])


class ZarrStoreArray(StoreArray):
    """A Zarr v2 or v3 array, one unit per stored chunk (a sharded one: per shard)."""

    node: Zarr2ArrayNode | Zarr3ArrayNode

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def units(self) -> tuple[int, ...]:
        return self.node.chunks

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.node.dtype

    @property
    def fill(self) -> Any:
        if isinstance(self.node, Zarr2ArrayNode):
            return self.node.meta.fill[()]
        return self.node.fill_value

    def locate(self, pos: Position) -> Located | None:
        if not self.in_grid(pos):
            return None
        key = self.prefix + self.node.chunk_key(pos)
        attr = self.access.file(key)
        return None if attr is None else Located(key, attr)

    def present(self) -> dict[Position, Located]:
        return self._walk(len(self.shape) + 1)

    def payload(self, loc: Located) -> bytes | None:
        return self._stored(loc)

    def _decode(self, pos: Position, data: bytes) -> np.ndarray[Any, Any]:
        return self.node.decode_chunk(pos, data)


class ShardedStoreArray(ZarrStoreArray):
    """A sharded Zarr v3 array, one unit per inner chunk: found through its shard's index
    (one ranged GET per shard, cached), read by one ranged GET of its own.

    ``transpose`` codecs before ``sharding_indexed`` (which :func:`store_array` leaves to a
    :class:`ZarrStoreArray` of whole shards; the Zarr v2 view makes this one of them) transpose
    each shard before it is cut: the inner chunk grid, the index and every inner chunk are
    in the transposed shard's axes. :attr:`order` maps them to view axes, so a unit is still
    one inner chunk, its values transposed back on decode. Nothing may follow
    ``sharding_indexed`` (a bytes codec there wraps the whole shard: its byte ranges are
    then no inner chunks).
    """

    node: Zarr3ArrayNode

    @property
    def codec(self) -> ShardingCodec:
        codec = self.node.sharding
        assert codec is not None
        return codec

    @cached_property
    def order(self) -> tuple[int, ...]:
        """Axis ``i`` of a stored shard is view axis ``order[i]`` (the transpositions before
        ``sharding_indexed``, composed; none: the identity)."""
        order = tuple(range(len(self.node.shape)))
        for codec in self.node.codecs.array_array:
            assert isinstance(codec, TransposeCodec)
            order = tuple(order[i] for i in codec.order)
        return order

    @cached_property
    def _view_axes(self) -> tuple[int, ...]:
        """View axis ``d`` is axis ``_view_axes[d]`` of a stored shard (``order`` inverted)."""
        return tuple(int(i) for i in np.argsort(self.order))

    def _to_view(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(stored[i] for i in self._view_axes)

    def _to_stored(self, view: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(view[i] for i in self.order)

    @property
    def units(self) -> tuple[int, ...]:
        return self._to_view(self.codec.chunk_shape)

    def locate(self, pos: Position) -> Located | None:
        if not self.in_grid(pos):
            return None
        per = self._to_view(self.codec.grid)
        shard = tuple(p // k for p, k in zip(pos, per, strict=True))
        key = self.prefix + self.node.chunk_key(shard)
        attr = self.access.file(key)
        if attr is None:
            return None
        table = self.index(key, attr)
        inner = self._to_stored(tuple(p % k for p, k in zip(pos, per, strict=True)))
        offset, nbytes = (int(v) for v in table[inner])
        if offset == EMPTY:
            return None
        return Located(key, attr, offset, nbytes)

    def present(self) -> dict[Position, Located]:
        per = self._to_view(self.codec.grid)
        found: dict[Position, Located] = {}
        for shard, loc in self._walk(len(self.shape) + 1).items():
            table = self.index(loc.key, loc.attr)
            for stored in zip(*np.nonzero(table[..., 0] != np.uint64(EMPTY)), strict=True):
                offset, nbytes = (int(v) for v in table[stored])
                inner = self._to_view(tuple(int(i) for i in stored))
                pos = tuple(s * k + i for s, k, i in zip(shard, per, inner, strict=True))
                if self.in_grid(pos):
                    found[pos] = Located(loc.key, loc.attr, offset, nbytes)
        return found

    def index(self, key: str, attr: Attr) -> np.ndarray[Any, Any]:
        """The shard's index, ``(*inner grid, 2)`` of (offset, nbytes), checked."""
        codec = self.codec
        size = codec.index_nbytes
        start = 0 if codec.index_location == "start" else attr.size - size

        def make() -> bytes | None:
            if start < 0:
                raise UnreadableUnit(f"/{key}: shorter than its {size}-byte shard index")
            raw = self.access.fetch(key, start, size)
            if raw is None:
                return None
            self.access.count("shard_indexes")
            try:
                table = codec.index.decode(raw).reshape(-1, 2)
            except CodecError as exc:
                raise UnreadableUnit(f"/{key}: shard index: {exc.message}") from exc
            _check_index(table, attr.size, size, codec.index_location, key)
            return np.ascontiguousarray(table, dtype="<u8").tobytes()

        raw = self.access.computed("shard-index", key, attr, make)
        if raw is None:
            raise UnreadableUnit(f"/{key} vanished from the store")
        return np.frombuffer(raw, dtype="<u8").reshape((*codec.grid, 2))

    def _decode(self, pos: Position, data: bytes) -> np.ndarray[Any, Any]:
        return self.codec.inner.decode(data).transpose(self._view_axes)


def _check_index(table: np.ndarray[Any, Any], length: int, size: int, where: str, key: str) -> None:
    """The spec's rules for index entries (as :class:`ShardingCodec` checks a whole shard)."""
    empty = table[:, 0] == np.uint64(EMPTY)
    if np.any(empty != (table[:, 1] == np.uint64(EMPTY))):
        raise UnreadableUnit(f"/{key}: shard index entry with only one of offset/nbytes empty")
    lo, hi = (size, length) if where == "start" else (0, length - size)
    used = table[~empty].astype(object)
    if any(o < lo or o + n > hi for o, n in used):
        raise UnreadableUnit(f"/{key}: shard index points outside the shard's data")


def whole_shards(node: Zarr3ArrayNode) -> bool:
    """Must a view read this sharded array's shards whole? Yes when a transposition precedes
    ``sharding_indexed`` (the Zarr v2 view reads those by inner chunk all the same:
    :class:`ShardedStoreArray` maps their axes) or a bytes codec follows it (it wraps each shard
    whole: the index's byte ranges are no inner chunks)."""
    return bool(node.codecs.array_array or node.codecs.bytes_bytes)


def store_array(access: StoreAccess, prefix: str, node: ArrayNode) -> StoreArray | str:
    """The array at ``prefix`` as views read it, or why no view can show it."""
    if isinstance(node, N5ArrayNode):
        return N5StoreArray(access, prefix, node)
    if isinstance(node, (Zarr2ArrayNode, Zarr3ArrayNode)) and node.dtype.hasobject:
        return "its values are Python objects (variable-length), not fixed-size numbers"
    if isinstance(node, Zarr3ArrayNode):
        if node.sharding is not None and not whole_shards(node):
            return ShardedStoreArray(access, prefix, node)
        return ZarrStoreArray(access, prefix, node)
    if isinstance(node, Zarr2ArrayNode):
        return ZarrStoreArray(access, prefix, node)
    return f"{node.fmt} arrays are not supported by views"
