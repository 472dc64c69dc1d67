"""N5: ``attributes.json`` rules, the chunk key grammar, and chunk checks.

Per the N5 file-system specification (saalfeldlab/n5 README): every directory is a group;
``attributes.json`` holds its attributes; a dataset is a group whose attributes include
``dimensions``, ``blockSize``, ``dataType`` and ``compression``; a chunk at grid position
``(i, j, k)`` is the file ``i/j/k``; chunks start with the block header of
:mod:`n5fs.codecs.n5_header`.

Orders. Everything here is in N5 order, the order ``dimensions`` lists: the header's
dimensions, chunk keys, ``position`` tuples, and the arrays :meth:`N5ArrayNode.decode_chunk`
returns and :meth:`N5ArrayNode.encode_chunk` takes (``a[x, y, z]`` for ``dimensions`` ``[X, Y,
Z]``). The payload is the values in that order with the *first* index varying fastest
(Fortran order), big endian; decoded arrays are native-endian.

Liberal where real writers differ: end chunks may be clipped to the dataset (N5 Java, z5)
or full-size (TensorStore, zarr-python); the root ``"n5"`` version may be absent (TensorStore)
or any version N5 Java itself accepts (major <= 4: zarr-python 2 and z5 write ``2.0.0``);
N5 version 0's ``compressionType`` string stands in for ``compression``; ``lz4`` chunks may be
lz4-java streams (N5 Java) or bare LZ4 blocks (z5), told apart per chunk. Which members each
``compression`` needs is decided in :mod:`n5fs.codecs.n5_compression`.

Keys: a chunk-like name (see :func:`~n5fs.formats.base.chunk_like`) that is not exactly one
canonical decimal per dimension joined by ``/`` is INVALID (``01/0``, ``-1/0``, ``0.0``, a
wrong index count), never an ordinary file that would shadow or fake a chunk.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from n5fs.codecs import jsondoc
from n5fs.codecs.limits import CodecError, check_size
from n5fs.codecs.n5_compression import (
    N5Compression,
    compression_from_type,
    parse_compression,
    short_repr,
)
from n5fs.codecs.n5_header import BlockHeader, decode_header, encode_header
from n5fs.errors import Rejected
from n5fs.formats.base import (
    ArrayNode,
    Classified,
    Format,
    GroupNode,
    KeyKind,
    Node,
    bad_chunk_key,
    chunk_key_pattern,
    chunk_like,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

ATTRIBUTES = "attributes.json"
VERSION_KEY = "n5"
DATASET_KEYS = ("dimensions", "blockSize", "dataType", "compression")
#: N5 version 0 named the compression by a string under this key
VERSION0_COMPRESSION_KEY = "compressionType"
#: N5 Java reads a container if its major version is at most its own (4)
SUPPORTED_MAJOR = 4
#: "Chunks cannot be larger than 2GB (2^31 Bytes)" (N5 spec); applied to decoded bytes
MAX_CHUNK_BYTES = 1 << 31
DATA_TYPES: Mapping[str, str] = {
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "float32": "f4",
    "float64": "f8",
}
_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
# Canonical decimals as N5 Java writes them; the cap keeps int() under Python's 4300 digits.
_MAX_INDEX_DIGITS = 1000
_INDEX = re.compile(rf"0|[1-9][0-9]{{0,{_MAX_INDEX_DIGITS - 1}}}", re.ASCII)
_VERSION = re.compile(r"([0-9]+)(?:\.[0-9]+){0,2}(?:[-+].*)?")
_USER_EXCLUDED = frozenset((*DATASET_KEYS, VERSION0_COMPRESSION_KEY, VERSION_KEY))


def _reject(path: str, rule: str, message: str) -> Rejected:
    return Rejected(message, path=path, fmt="n5", rule=rule)


def _retag(exc: CodecError, path: str) -> CodecError:
    """The same codec error, now naming the key and the format."""
    return CodecError(exc.message, path=path, fmt="n5", rule=exc.rule)


def load_attributes(data: bytes, *, path: str = "") -> dict[str, Any]:
    """Parse ``attributes.json`` bytes into a JSON object, or raise Rejected (rule ``json``)."""
    try:
        obj = jsondoc.load_json(data, what="attributes.json")
    except CodecError as exc:
        raise _reject(path, exc.rule, exc.message) from exc
    if not isinstance(obj, dict):
        raise _reject(
            path, "json", f"attributes.json must hold a JSON object, not {type(obj).__name__}"
        )
    return obj


def present_dataset_keys(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """Which of the four dataset keys ``attrs`` has (``compressionType`` counts as
    ``compression``)."""
    return tuple(
        key
        for key in DATASET_KEYS
        if key in attrs or (key == "compression" and VERSION0_COMPRESSION_KEY in attrs)
    )


def is_dataset_attributes(attrs: Mapping[str, Any]) -> bool:
    """Does ``attrs`` declare a dataset (all four dataset keys present, valid or not)?"""
    return len(present_dataset_keys(attrs)) == len(DATASET_KEYS)


def check_version(value: object, *, path: str = "") -> str:
    """Accept an ``"n5"`` version N5 Java would read (semver, major <= 4)."""
    match = _VERSION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise _reject(
            path,
            "n5-version",
            "the root attribute 'n5' must be a version string such as \"4.0.0\", "
            f"not {short_repr(value)}",
        )
    if int(match.group(1)) > SUPPORTED_MAJOR:
        raise _reject(
            path,
            "n5-version",
            f"N5 version {value} is newer than the supported major version {SUPPORTED_MAJOR}",
        )
    return str(value)


def _int_list(attrs: Mapping[str, Any], key: str, lo: int, hi: int, path: str) -> tuple[int, ...]:
    value = attrs[key]
    ok = (
        isinstance(value, list)
        and len(value) >= 1
        and all(type(v) is int and lo <= v <= hi for v in value)
    )
    if not ok:
        raise _reject(
            path,
            key,
            f"dataset attribute {key!r} must be a non-empty list of "
            f"integers in [{lo}, {hi}], not {short_repr(value)}",
        )
    return tuple(value)


def _parse_compression(attrs: Mapping[str, Any], itemsize: int, path: str) -> N5Compression:
    try:
        if "compression" in attrs:
            return parse_compression(attrs["compression"], itemsize=itemsize)
        return compression_from_type(attrs[VERSION0_COMPRESSION_KEY])
    except CodecError as exc:
        raise _retag(exc, path) from exc


def _parse_dataset(attrs: dict[str, Any], version: str | None, path: str) -> N5ArrayNode:
    dims = _int_list(attrs, "dimensions", 0, _INT64_MAX, path)
    block = _int_list(attrs, "blockSize", 1, _INT32_MAX, path)
    if len(dims) != len(block):
        raise _reject(
            path,
            "blockSize",
            f"'blockSize' has {len(block)} entries, 'dimensions' {len(dims)}: they must agree",
        )
    data_type = attrs["dataType"]
    if not isinstance(data_type, str) or data_type not in DATA_TYPES:
        raise _reject(
            path,
            "dataType",
            f"'dataType' must be one of {', '.join(DATA_TYPES)}, not {short_repr(data_type)}",
        )
    itemsize = np.dtype(DATA_TYPES[data_type]).itemsize
    if prod(block) * itemsize > MAX_CHUNK_BYTES:
        raise _reject(
            path,
            "blockSize",
            f"a {data_type} block of {list(block)} exceeds the spec's 2 GB chunk limit",
        )
    compression = _parse_compression(attrs, itemsize, path)
    return N5ArrayNode(
        raw=attrs,
        dimensions=dims,
        block_size=block,
        data_type=data_type,
        compression=compression,
        version=version,
    )


@dataclass(frozen=True)
class N5GroupNode(GroupNode):
    fmt: ClassVar[str] = "n5"
    #: the ``"n5"`` version attribute (roots only, and optional even there)
    version: str | None = None

    @property
    def attributes(self) -> Mapping[str, Any]:
        return {k: v for k, v in self.raw.items() if k != VERSION_KEY}


@dataclass(frozen=True)
class N5ArrayNode(ArrayNode):
    """An N5 dataset. ``position`` tuples and arrays are in N5 order (see module docs)."""

    fmt: ClassVar[str] = "n5"
    #: decoded-size cap for varlength blocks, whose element count the header alone states
    varlength_limit: ClassVar[int] = MAX_CHUNK_BYTES
    dimensions: tuple[int, ...]
    block_size: tuple[int, ...]
    data_type: str
    compression: N5Compression
    version: str | None = None

    @property
    def attributes(self) -> Mapping[str, Any]:
        return {k: v for k, v in self.raw.items() if k not in _USER_EXCLUDED}

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dimensions

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.block_size

    @property
    def dtype(self) -> np.dtype[Any]:
        """Native-endian element type (what :meth:`decode_chunk` returns)."""
        return np.dtype(DATA_TYPES[self.data_type])

    @property
    def stored_dtype(self) -> np.dtype[Any]:
        """Big-endian element type of the chunk payload."""
        return np.dtype(">" + DATA_TYPES[self.data_type])

    def extent(self, position: tuple[int, ...]) -> tuple[int, ...]:
        """The block's shape clipped to the dataset: what N5 Java writes at ``position``."""
        return tuple(
            min(b, d - p * b)
            for p, b, d in zip(position, self.block_size, self.dimensions, strict=True)
        )

    def classify(self, rel_key: str) -> Classified:
        """``attributes.json`` -> METADATA; ``i/j/k`` (one canonical decimal per dimension)
        -> CHUNK; a key that only looks like one (``01/2``, ``-1/0``, ``0/0/0`` in 2-D,
        ``0.0``) -> INVALID; anything else (temp names, READMEs) -> OTHER."""
        if rel_key == ATTRIBUTES:
            return Classified(KeyKind.METADATA)
        match = self._key_pattern.fullmatch(rel_key)
        if match is None:
            if chunk_like(rel_key):
                return bad_chunk_key(rel_key, self._grammar())
            return Classified(KeyKind.OTHER)
        position = tuple(map(int, match.groups()))
        return Classified(KeyKind.CHUNK, position, self.in_grid(position))

    @functools.cached_property
    def _key_pattern(self) -> re.Pattern[str]:
        return chunk_key_pattern(len(self.dimensions), "/", _INDEX.pattern)

    def _grammar(self) -> str:
        n = len(self.dimensions)
        return (
            f"{n} {'index' if n == 1 else 'indices'} joined by '/' (e.g. "
            f"{'/'.join('0' * n)!r}), each a plain decimal: no sign, no leading zero, "
            f"at most {_MAX_INDEX_DIGITS} digits"
        )

    def chunk_key(self, position: tuple[int, ...]) -> str:
        return "/".join(str(p) for p in position)

    def validate_chunk(self, position: tuple[int, ...], data: bytes, *, path: str = "") -> None:
        self._decode(position, data, path)

    def decode_chunk(self, position: tuple[int, ...], data: bytes) -> np.ndarray[Any, Any]:
        """The values inside the dataset, shaped ``extent(position)`` whether the writer
        clipped the block or not; a varlength block whose count differs from its dims'
        product comes back flat (1-D, ``count`` elements), as N5 Java hands it over."""
        header, payload = self._decode(position, data, "")
        values = np.frombuffer(payload, dtype=self.stored_dtype)
        if header.num_elements != prod(header.dims):
            return values.astype(self.dtype)
        block = values.reshape(header.dims, order="F")
        inside = block[tuple(slice(0, e) for e in self.extent(position))]
        return inside.astype(self.dtype, order="C")

    def encode_chunk(self, position: tuple[int, ...], values: np.ndarray[Any, Any]) -> bytes:
        """What N5 Java writes: default mode, dims clipped to the dataset. ``values`` is
        shaped ``extent(position)``, or the full block (the part outside is dropped)."""
        if not self.in_grid(position):
            raise self._out_of_grid(position, "")
        extent = self.extent(position)
        array = np.asarray(values)
        if array.shape == self.block_size:
            array = array[tuple(slice(0, e) for e in extent)]
        if array.shape != extent:
            raise _reject(
                "",
                "block-shape",
                f"values of shape {array.shape} do not fit the "
                f"block at {position}, shaped {extent}",
            )
        payload = array.astype(self.stored_dtype, copy=False).tobytes(order="F")
        return encode_header(extent) + self.compression.encode(payload)

    def structural(self) -> Mapping[str, Any]:
        return {
            "dataType": self.data_type,
            "blockSize": list(self.block_size),
            "compression": self.compression.canonical(),
        }

    def codec_summary(self) -> str:
        return self.compression.summary()

    def _out_of_grid(self, position: tuple[int, ...], path: str) -> Rejected:
        return _reject(
            path,
            "out-of-grid",
            f"chunk position {list(position)} lies outside the "
            f"grid {list(self.grid)} of dimensions "
            f"{list(self.dimensions)}",
        )

    def _decode(
        self, position: tuple[int, ...], data: bytes, path: str
    ) -> tuple[BlockHeader, bytes]:
        """Check everything about a chunk; return its header and decoded payload."""
        if not self.in_grid(position):
            raise self._out_of_grid(position, path)
        try:
            header = decode_header(data)
            expected = self._expected_bytes(header, position)
            payload = self.compression.decode(data[header.size :], expected)
            check_size(len(payload), expected, f"{self.compression.type} payload")
        except CodecError as exc:
            raise _retag(exc, path) from exc
        return header, payload

    def _expected_bytes(self, header: BlockHeader, position: tuple[int, ...]) -> int:
        """The payload's decoded size once the header fits the dataset at ``position``."""
        self._check_dims(header, position)
        expected = header.num_elements * self.dtype.itemsize
        if header.varlength and expected > self.varlength_limit:
            raise CodecError(
                f"varlength block of {header.num_elements} elements exceeds "
                f"{self.varlength_limit} bytes",
                rule="block-varlength",
            )
        return expected

    def _check_dims(self, header: BlockHeader, position: tuple[int, ...]) -> None:
        """The header's dims against blockSize: interior blocks full, end blocks clipped
        (N5 Java, z5) or full (TensorStore, zarr-python), per dimension."""
        if len(header.dims) != len(self.block_size):
            raise CodecError(
                f"block header has {len(header.dims)} dimensions, the dataset "
                f"{len(self.block_size)}",
                rule="block-ndim",
            )
        extent = self.extent(position)
        for axis, (got, full, clipped) in enumerate(
            zip(header.dims, self.block_size, extent, strict=True)
        ):
            if got > full:
                raise CodecError(
                    f"block dimension {axis} is {got}, more than blockSize {full}",
                    rule="block-dims",
                )
            if got not in (full, clipped):
                where = "an end block" if clipped != full else "an interior block"
                allowed = f"{clipped} (clipped) or {full}" if clipped != full else str(full)
                raise CodecError(
                    f"block dimension {axis} is {got}; in {where} it must be {allowed}",
                    rule="block-shape",
                )


class N5Format(Format):
    """N5 folders: ``attributes.json`` makes a group, or a dataset with the dataset keys."""

    name: ClassVar[str] = "n5"
    probe_names: ClassVar[frozenset[str]] = frozenset({ATTRIBUTES})
    metadata_names: ClassVar[frozenset[str]] = frozenset({ATTRIBUTES})
    tensorstore_driver: ClassVar[str] = "n5"
    implicit_groups: ClassVar[bool] = True

    def matches(self, probes: Mapping[str, bytes]) -> bool:
        """An N5 root or dataset: ``attributes.json`` with the ``"n5"`` version or all four
        dataset keys. A bare group's attributes are any JSON, so they prove nothing."""
        data = probes.get(ATTRIBUTES)
        if data is None:
            return False
        try:
            attrs = load_attributes(data)
        except Rejected:
            return False
        return VERSION_KEY in attrs or is_dataset_attributes(attrs)

    def claims(self, name: str, context: str | None, load: Callable[[], bytes]) -> bool:
        """``attributes.json`` is N5 metadata inside an N5 hierarchy, or anywhere when it
        declares N5 (the ``"n5"`` version or any dataset key); elsewhere it is an ordinary
        file (any tool may write an ``attributes.json``), as is one that is not a JSON
        object. Other names are never N5 metadata."""
        if name != ATTRIBUTES:
            return False
        if context == self.name:
            return True
        try:
            attrs = load_attributes(load())
        except Rejected:
            return False
        return VERSION_KEY in attrs or bool(present_dataset_keys(attrs))

    def parse_metadata(self, name: str, data: bytes, *, path: str = "") -> Node:
        if name != ATTRIBUTES:
            raise self.rejected(
                path, "metadata-name", f"N5 metadata lives in {ATTRIBUTES}, not {short_repr(name)}"
            )
        attrs = load_attributes(data, path=path)
        version = check_version(attrs[VERSION_KEY], path=path) if VERSION_KEY in attrs else None
        present = present_dataset_keys(attrs)
        if not present:
            return N5GroupNode(raw=attrs, version=version)
        if len(present) < len(DATASET_KEYS):
            missing = [k for k in DATASET_KEYS if k not in present]
            raise self.rejected(
                path,
                "dataset-keys",
                f"attributes.json has dataset keys {', '.join(present)} but "
                f"lacks {', '.join(missing)}: a dataset needs all of "
                f"{', '.join(DATASET_KEYS)}",
            )
        return _parse_dataset(attrs, version, path)
