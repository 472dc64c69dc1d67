"""``sharding_indexed``: many inner chunks in one stored object, located by an index.

The index is a ``(*chunks_per_shard, 2)`` uint64 array of ``(offset, nbytes)`` pairs in C
order of the inner chunks, encoded with ``index_codecs`` (which must have a fixed size, so
its place is known without reading the rest) at the start or the end of the shard. Both
values ``2^64 - 1`` mark an empty inner chunk (read as fill_value).

A shard is checked as a whole before it is stored: the index decodes (crc32c included),
every entry is empty or lies inside the shard and outside the index, and every present inner
chunk decodes through the inner chain. Validation decodes one inner chunk at a time, so its
memory is bounded by the inner chunk, never by the (often huge) shard.

This module imports the chain; the chain finds this codec through the registry's lazy
entry, so neither import order makes a cycle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from n5fs.codecs.limits import CodecError
from n5fs.codecs.v3.base import ArrayBytesCodec
from n5fs.codecs.v3.chain import CodecChain
from n5fs.codecs.v3.types import ArraySpec, bad_config, check_keys, is_int, parse_data_type

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

#: offset and nbytes of an empty inner chunk
EMPTY = 2**64 - 1
_INDEX_TYPE = parse_data_type("uint64")


@dataclass(frozen=True)
class ShardIndex:
    """The decoded index: ``offsets``/``nbytes`` per inner chunk, C order of positions."""

    grid: tuple[int, ...]
    offsets: np.ndarray[Any, np.dtype[np.uint64]]
    nbytes: np.ndarray[Any, np.dtype[np.uint64]]

    def present(self) -> Iterator[tuple[tuple[int, ...], int, int]]:
        """(inner position, offset, nbytes) of every non-empty inner chunk."""
        for flat in np.flatnonzero(self.offsets != np.uint64(EMPTY)):
            pos = tuple(int(i) for i in np.unravel_index(flat, self.grid))
            yield pos, int(self.offsets[flat]), int(self.nbytes[flat])


@dataclass(frozen=True)
class ShardingCodec(ArrayBytesCodec):
    """The ``sharding_indexed`` array -> bytes codec (spec: sharding-indexed v1.0)."""

    name = "sharding_indexed"
    chunk_shape: tuple[int, ...]
    inner: CodecChain
    index: CodecChain
    index_location: str
    index_nbytes: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> ShardingCodec:
        check_keys(
            config,
            "sharding_indexed",
            {"chunk_shape", "codecs", "index_codecs"},
            {"index_location"},
        )
        inner_shape = _inner_shape(config["chunk_shape"], spec.shape)
        location = config.get("index_location", "end")
        if location not in ("start", "end"):
            raise bad_config(f"sharding index_location must be 'start' or 'end', got {location!r}")
        inner = CodecChain.parse(config["codecs"], spec.with_shape(inner_shape), "codecs")
        grid = tuple(s // c for s, c in zip(spec.shape, inner_shape, strict=True))
        index_spec = ArraySpec((*grid, 2), _INDEX_TYPE, np.uint64(EMPTY))
        index = CodecChain.parse(config["index_codecs"], index_spec, "index_codecs")
        size = index.encoded_size()
        if size is None:
            raise bad_config(
                "sharding index_codecs must have a fixed encoded size: the spec "
                "forbids variable-size codecs such as compressors there"
            )
        return cls(inner_shape, inner, index, location, size)

    def configuration(self) -> dict[str, Any]:
        return {
            "chunk_shape": list(self.chunk_shape),
            "codecs": self.inner.to_json(),
            "index_codecs": self.index.to_json(),
            "index_location": self.index_location,
        }

    def summary(self) -> str:
        shape = "x".join(map(str, self.chunk_shape))
        return f"sharding_indexed({shape}; {self.inner.summary()})"

    @property
    def grid(self) -> tuple[int, ...]:
        """Inner chunks per shard along each dimension."""
        return tuple(int(n) for n in self.index.spec.shape[:-1])

    def max_encoded_size(self, spec: ArraySpec) -> int:
        count = int(np.prod(self.grid, dtype=object))
        return self.index_nbytes + count * self.inner.max_encoded_size()

    # ---------------------------------------------------------------- reading

    def read_index(self, data: bytes) -> ShardIndex:
        """Decode and check the index of shard ``data``; CodecError(rule="shard-index")."""
        size, length = self.index_nbytes, len(data)
        if length < size:
            raise CodecError(
                f"shard is {length} bytes, shorter than its {size}-byte index", rule="shard-index"
            )
        raw = data[:size] if self.index_location == "start" else data[length - size :]
        try:
            table = self.index.decode(raw).reshape(-1, 2)
        except CodecError as exc:
            raise CodecError(f"shard index: {exc.message}", rule=exc.rule) from exc
        index = ShardIndex(self.grid, table[:, 0].copy(), table[:, 1].copy())
        self._check_entries(index, length)
        return index

    def _check_entries(self, index: ShardIndex, length: int) -> None:
        empty_off, empty_nb = index.offsets == np.uint64(EMPTY), index.nbytes == np.uint64(EMPTY)
        half = np.flatnonzero(empty_off != empty_nb)
        if half.size:
            pos = tuple(int(i) for i in np.unravel_index(half[0], self.grid))
            raise CodecError(
                f"shard index entry for inner chunk {pos} has only one of offset/"
                "nbytes set to 2^64-1; the spec marks an empty inner chunk by "
                "setting both",
                rule="shard-index",
            )
        lo, hi = (
            (self.index_nbytes, length)
            if self.index_location == "start"
            else (0, length - self.index_nbytes)
        )
        for pos, offset, nbytes in index.present():
            if offset + nbytes > length:
                raise CodecError(
                    f"inner chunk {pos} at bytes [{offset}, {offset + nbytes}) "
                    f"extends past the end of the {length}-byte shard",
                    rule="shard-index",
                )
            if offset < lo or offset + nbytes > hi:
                raise CodecError(
                    f"inner chunk {pos} at bytes [{offset}, {offset + nbytes}) "
                    f"overlaps the shard index (index_location "
                    f"{self.index_location!r})",
                    rule="shard-index",
                )

    def _inner(
        self, data: bytes, pos: tuple[int, ...], offset: int, nbytes: int, *, decode: bool
    ) -> np.ndarray[Any, Any] | None:
        piece = data[offset : offset + nbytes]
        try:
            if decode:
                return self.inner.decode(piece)
            self.inner.validate(piece)
        except CodecError as exc:
            raise CodecError(f"inner chunk {pos}: {exc.message}", rule=exc.rule) from exc
        return None

    def validate(self, data: bytes, spec: ArraySpec) -> None:
        for pos, offset, nbytes in self.read_index(data).present():
            self._inner(data, pos, offset, nbytes, decode=False)

    def decode(self, data: bytes, spec: ArraySpec) -> np.ndarray[Any, Any]:
        out = spec.filled()
        for pos, offset, nbytes in self.read_index(data).present():
            out[self._region(pos)] = self._inner(data, pos, offset, nbytes, decode=True)
        return out

    def _region(self, pos: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(p * c, (p + 1) * c) for p, c in zip(pos, self.chunk_shape, strict=True))

    # ---------------------------------------------------------------- writing

    def encode(self, array: np.ndarray[Any, Any], spec: ArraySpec) -> bytes:
        """Inner chunks equal to fill_value are left empty, as zarr-python writes them."""
        table = np.full((*self.grid, 2), EMPTY, dtype=np.uint64)
        pieces: list[bytes] = []
        cursor = self.index_nbytes if self.index_location == "start" else 0
        for pos in itertools.product(*(range(n) for n in self.grid)):
            block = array[self._region(pos)]
            if _all_fill(block, spec.fill_value):
                continue
            piece = self.inner.encode(block)
            table[pos] = (cursor, len(piece))
            pieces.append(piece)
            cursor += len(piece)
        index = self.index.encode(table)
        return b"".join([index, *pieces] if self.index_location == "start" else [*pieces, index])


def _inner_shape(value: Any, shard_shape: tuple[int, ...]) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(is_int(n) and n > 0 for n in value):
        raise bad_config(f"sharding chunk_shape must be a list of positive integers, got {value!r}")
    if len(value) != len(shard_shape):
        raise bad_config(
            f"sharding chunk_shape {value} has {len(value)} dimensions, the shard "
            f"shape {list(shard_shape)} has {len(shard_shape)}"
        )
    if any(s % c for s, c in zip(shard_shape, value, strict=True)):
        raise bad_config(
            f"sharding chunk_shape {value} must evenly divide the shard shape {list(shard_shape)}"
        )
    return tuple(value)


def _all_fill(block: np.ndarray[Any, Any], fill: Any) -> bool:
    if block.dtype.kind in "fc":
        return bool(np.array_equal(block, np.full_like(block, fill), equal_nan=True))
    return bool(np.all(block == fill))
