"""Zarr v3: ``zarr.json`` for arrays and groups, the chunk key grammar, chunk checks.

Metadata is checked against the core spec: required members and their types and ranges,
a regular chunk grid, a known chunk key encoding, a fill_value that fits the data type, a
codec chain that instantiates for this chunk shape and data type, and the extension rule:
an unknown member is refused unless it is an object with ``"must_understand": false``.
Chunks are full-size at the array's edges (unlike N5), so every chunk (or shard) must
decode to exactly ``chunk_shape`` elements.

``structural()`` holds data_type, chunk_grid, chunk_key_encoding, codecs and
storage_transformers (all in normalized JSON, so ``"crc32c"`` and ``{"name": "crc32c"}``
compare equal). fill_value joins them only for sharded arrays: there it is the value of
every empty inner chunk of a stored shard, so changing it reinterprets stored bytes;
elsewhere it only fills missing chunks, which is a metadata-only change.

The fill_value and chunk_key_encoding parsers are in :mod:`n5fs.formats.zarr3_fields`;
consolidated_metadata is kept true by :mod:`n5fs.formats.consolidation`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from n5fs.codecs import jsondoc
from n5fs.codecs.limits import CodecError
from n5fs.codecs.v3 import (
    ArraySpec,
    CodecChain,
    DataType,
    ShardingCodec,
    is_int,
    parse_data_type,
    parse_extension,
)
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
)
from n5fs.formats.consolidation import ZarrV3Consolidation
from n5fs.formats.zarr3_fields import (
    _DECIMAL,
    FMT,
    ChunkKeyEncoding,
    _bad,
    fill_identity,
    parse_fill_value,
)

if TYPE_CHECKING:
    import re
    from collections.abc import Mapping

METADATA_NAME = "zarr.json"
#: Largest decoded unit (a chunk, or an inner chunk of a shard) validated in memory.
MAX_DECODE_BYTES = 2 << 30
_MAX_DIM = 2**63 - 1
#: Most dimensions an array may have: TensorStore's limit (numpy's is 64).
MAX_NDIM = 32
_ARRAY_REQUIRED = frozenset(
    {
        "zarr_format",
        "node_type",
        "shape",
        "data_type",
        "chunk_grid",
        "chunk_key_encoding",
        "fill_value",
        "codecs",
    }
)
_ARRAY_KNOWN = _ARRAY_REQUIRED | {"attributes", "storage_transformers", "dimension_names"}
_GROUP_KNOWN = frozenset({"zarr_format", "node_type", "attributes", "consolidated_metadata"})


def retag(exc: Rejected, path: str) -> Rejected:
    """The same error (same class and rule) with this key's path and our format name."""
    return type(exc)(exc.message, path=path or exc.path, fmt=FMT, rule=exc.rule)


# --------------------------------------------------------------------------- documents


def load_json(data: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity literals (the spec spells them as strings)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"bare {token} is not JSON")

    try:
        return jsondoc.load_json(data, what=METADATA_NAME, parse_constant=refuse)
    except CodecError as exc:
        raise _bad(exc.rule, exc.message) from exc


def _check_members(
    doc: Mapping[str, Any], required: frozenset[str], known: frozenset[str], what: str
) -> None:
    missing = sorted(required - set(doc))
    if missing:
        raise _bad("missing-key", f"{what} metadata lacks required {missing}")
    for key in sorted(set(doc) - known):
        value = doc[key]
        if not (isinstance(value, dict) and value.get("must_understand") is False):
            raise _bad(
                "must-understand",
                f"unknown metadata member {key!r}: the spec requires "
                "refusing members that are not recognized unless they are objects with "
                '"must_understand": false',
            )


def _int_list(value: Any, key: str, minimum: int, ndim: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        is_int(n) and minimum <= n <= _MAX_DIM for n in value
    ):
        raise _bad(
            key.replace("_", "-"), f"{key} must be a list of integers >= {minimum}, got {value!r}"
        )
    if ndim is not None and len(value) != ndim:
        raise _bad(
            key.replace("_", "-"), f"{key} {value} has {len(value)} dimensions, shape has {ndim}"
        )
    return tuple(value)


def _chunk_shape(value: Any, ndim: int) -> tuple[int, ...]:
    try:
        ext = parse_extension(value, "chunk_grid", rule="chunk-grid")
    except CodecError as exc:
        raise _bad(exc.rule, exc.message) from exc
    if ext.name != "regular" or not ext.must_understand:
        raise _bad(
            "chunk-grid",
            f"chunk_grid {ext.name!r} is not supported: only 'regular' "
            "(must_understand=false is not allowed here by the spec)",
        )
    if set(ext.configuration) != {"chunk_shape"}:
        raise _bad("chunk-grid", "regular chunk_grid configuration must hold exactly chunk_shape")
    return _int_list(ext.configuration["chunk_shape"], "chunk_shape", 1, ndim)


def _optional_members(doc: Mapping[str, Any], ndim: int) -> tuple[str | None, ...] | None:
    if not isinstance(doc.get("attributes", {}), dict):
        raise _bad("attributes", "attributes must be a JSON object")
    transformers = doc.get("storage_transformers", [])
    if not isinstance(transformers, list):
        raise _bad("storage-transformer", "storage_transformers must be a list")
    for item in transformers:
        try:
            ext = parse_extension(item, "storage transformer", rule="storage-transformer")
        except CodecError as exc:
            raise _bad(exc.rule, exc.message) from exc
        if ext.must_understand:
            raise _bad(
                "storage-transformer",
                f"storage transformer {ext.name!r} is not "
                "supported and not marked must_understand=false",
            )
    names = doc.get("dimension_names")
    if names is None:
        return None
    if (
        not isinstance(names, list)
        or len(names) != ndim
        or not all(n is None or isinstance(n, str) for n in names)
    ):
        raise _bad(
            "dimension-names", f"dimension_names must list {ndim} strings or nulls, got {names!r}"
        )
    return tuple(names)


def parse_document(doc: Any) -> Zarr3ArrayNode | Zarr3GroupNode:
    """Validate one parsed ``zarr.json`` document (also each consolidated entry)."""
    if not isinstance(doc, dict):
        raise _bad("json", f"{METADATA_NAME} must hold a JSON object")
    if not is_int(doc.get("zarr_format")) or doc["zarr_format"] != 3:
        raise _bad("zarr-format", f"zarr_format must be 3, got {doc.get('zarr_format')!r}")
    node_type = doc.get("node_type")
    if node_type == "group":
        return _parse_group(doc)
    if node_type == "array":
        return _parse_array(doc)
    raise _bad("node-type", f"node_type must be 'array' or 'group', got {node_type!r}")


def _parse_array(doc: dict[str, Any]) -> Zarr3ArrayNode:
    _check_members(doc, _ARRAY_REQUIRED, _ARRAY_KNOWN, "array")
    shape = _int_list(doc["shape"], "shape", 0)
    if len(shape) > MAX_NDIM:
        raise _bad("shape", f"shape has {len(shape)} dimensions; n5fs supports at most {MAX_NDIM}")
    chunk_shape = _chunk_shape(doc["chunk_grid"], len(shape))
    encoding = ChunkKeyEncoding.parse(doc["chunk_key_encoding"])
    try:
        data_type = parse_data_type(doc["data_type"])
    except CodecError as exc:
        raise _bad(exc.rule, exc.message) from exc
    fill = parse_fill_value(doc["fill_value"], data_type)
    codecs = CodecChain.parse(doc["codecs"], ArraySpec(chunk_shape, data_type, fill))
    names = _optional_members(doc, len(shape))
    return Zarr3ArrayNode(doc, shape, chunk_shape, encoding, codecs, names)


def _parse_group(doc: dict[str, Any]) -> Zarr3GroupNode:
    _check_members(doc, frozenset({"zarr_format", "node_type"}), _GROUP_KNOWN, "group")
    if not isinstance(doc.get("attributes", {}), dict):
        raise _bad("attributes", "attributes must be a JSON object")
    consolidated = doc.get("consolidated_metadata")
    entries = None if consolidated is None else _parse_consolidated(consolidated)
    return Zarr3GroupNode(doc, entries)


def _parse_consolidated(value: Any) -> dict[str, Zarr3ArrayNode | Zarr3GroupNode]:
    """zarr-python 3's inline form: flat relative paths -> each node's own document."""
    rule = "consolidated-metadata"
    if (
        not isinstance(value, dict)
        or value.get("kind") != "inline"
        or not isinstance(value.get("metadata"), dict)
        or not isinstance(value.get("must_understand", False), bool)
        or set(value) - {"kind", "must_understand", "metadata"}
    ):
        raise _bad(
            rule,
            'consolidated_metadata must be {"kind": "inline", '
            '"must_understand": false, "metadata": {path: document}}',
        )
    entries: dict[str, Zarr3ArrayNode | Zarr3GroupNode] = {}
    for path, entry in value["metadata"].items():
        if not path or any(p in ("", ".", "..") for p in path.split("/")):
            raise _bad(rule, f"consolidated_metadata path {path!r} is not a relative node path")
        try:
            entries[path] = parse_document(entry)
        except Rejected as exc:
            raise _bad(exc.rule, f"consolidated_metadata entry {path!r}: {exc.message}") from exc
    for path in entries:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if not isinstance(entries.get(parent), Zarr3GroupNode):
                raise _bad(
                    rule,
                    f"consolidated_metadata entry {path!r} needs its parent "
                    f"{parent!r} listed as a group",
                )
    return entries


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Zarr3GroupNode(GroupNode):
    fmt: ClassVar[str] = FMT
    #: parsed inline consolidated_metadata (relative path -> node), None when absent
    consolidated: Mapping[str, Zarr3ArrayNode | Zarr3GroupNode] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def attributes(self) -> Mapping[str, Any]:
        return dict(self.raw.get("attributes", {}))


@dataclass(frozen=True)
class Zarr3ArrayNode(ArrayNode):
    fmt: ClassVar[str] = FMT
    array_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    key_encoding: ChunkKeyEncoding
    codecs: CodecChain = field(compare=False)
    dimension_names: tuple[str | None, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array_shape

    @property
    def chunks(self) -> tuple[int, ...]:
        """The chunk shape of the grid: for a sharded array, the shard shape."""
        return self.chunk_shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.data_type.dtype

    @property
    def data_type(self) -> DataType:
        return self.codecs.spec.data_type

    @property
    def fill_value(self) -> Any:
        return self.codecs.spec.fill_value

    @property
    def sharding(self) -> ShardingCodec | None:
        codec = self.codecs.array_bytes
        return codec if isinstance(codec, ShardingCodec) else None

    @property
    def attributes(self) -> Mapping[str, Any]:
        return dict(self.raw.get("attributes", {}))

    def classify(self, rel_key: str) -> Classified:
        if rel_key == METADATA_NAME:
            return Classified(KeyKind.METADATA)
        match = self._key_pattern.fullmatch(rel_key)
        if match is not None:
            position = tuple(map(int, match.groups()))
            return Classified(KeyKind.CHUNK, position, self.in_grid(position))
        if self.key_encoding.looks_like_key(rel_key):
            return bad_chunk_key(rel_key, self.key_encoding.grammar(len(self.array_shape)))
        return Classified(KeyKind.OTHER)

    @functools.cached_property
    def _key_pattern(self) -> re.Pattern[str]:
        """What ``self.key_encoding.parse_key`` accepts, in one regex: ``c`` then the indices
        (``default``), or the indices alone, ``0`` for a 0-d array (``v2``)."""
        ndim, encoding = len(self.array_shape), self.key_encoding
        head = "c" if encoding.name == "default" else "" if ndim else "0"
        return chunk_key_pattern(ndim, encoding.separator, _DECIMAL.pattern, head=head)

    def chunk_key(self, position: tuple[int, ...]) -> str:
        return self.key_encoding.key(position)

    def _check_position(self, position: tuple[int, ...], path: str) -> None:
        if not self.in_grid(position):
            raise Rejected(
                f"chunk {position} is outside the chunk grid {self.grid} of shape "
                f"{self.array_shape}",
                path=path,
                fmt=FMT,
                rule="out-of-grid",
            )

    def validate_chunk(self, position: tuple[int, ...], data: bytes, *, path: str = "") -> None:
        """Decode the chunk (a shard: each inner chunk in turn) and refuse any flaw."""
        self._check_position(position, path)
        unit = _decode_unit(self.codecs)
        if unit > MAX_DECODE_BYTES:
            raise Rejected(
                f"a decoded chunk would be {unit} bytes, over the {MAX_DECODE_BYTES} "
                "bytes n5fs validates in memory",
                path=path,
                fmt=FMT,
                rule="chunk-too-large",
            )
        try:
            self.codecs.validate(data)
        except Rejected as exc:
            raise retag(exc, path) from exc

    def decode_chunk(self, position: tuple[int, ...], data: bytes) -> np.ndarray[Any, Any]:
        self._check_position(position, "")
        try:
            return self.codecs.decode(data)
        except Rejected as exc:
            raise retag(exc, "") from exc

    def encode_chunk(self, position: tuple[int, ...], values: np.ndarray[Any, Any]) -> bytes:
        """Full-size chunk bytes; values clipped at the array edge are padded with fill."""
        self._check_position(position, "")
        values = np.asarray(values)
        if (
            values.shape != self.chunk_shape
            and values.ndim == len(self.chunk_shape)
            and all(v <= c for v, c in zip(values.shape, self.chunk_shape, strict=True))
        ):
            full = self.codecs.spec.filled()
            full[tuple(slice(0, n) for n in values.shape)] = values
            values = full
        try:
            return self.codecs.encode(values)
        except Rejected as exc:
            raise retag(exc, "") from exc

    def structural(self) -> Mapping[str, Any]:
        fields: dict[str, Any] = {
            "data_type": self.data_type.json,
            "chunk_grid": {
                "name": "regular",
                "configuration": {"chunk_shape": list(self.chunk_shape)},
            },
            "chunk_key_encoding": self.key_encoding.to_json(),
            "codecs": self.codecs.to_json(),
            "storage_transformers": list(self.raw.get("storage_transformers", [])),
        }
        if self.sharding is not None:
            fields["fill_value"] = fill_identity(self.fill_value, self.data_type)
        return fields

    def codec_summary(self) -> str:
        return self.codecs.summary()


def _decode_unit(chain: CodecChain) -> int:
    """Bytes held in memory at once when validating: the innermost chunk of a shard."""
    codec = chain.array_bytes
    if isinstance(codec, ShardingCodec):
        return _decode_unit(codec.inner)
    spec = chain.spec
    return spec.size * 8 if spec.nbytes is None else spec.nbytes  # vlen: one pointer per item


# --------------------------------------------------------------------------- format


class Zarr3Format(Format):
    """Any folder holding ``zarr.json``: no other format uses that name."""

    name: ClassVar[str] = FMT
    probe_names: ClassVar[frozenset[str]] = frozenset({METADATA_NAME})
    metadata_names: ClassVar[frozenset[str]] = frozenset({METADATA_NAME})
    tensorstore_driver: ClassVar[str] = "zarr3"
    consolidation = ZarrV3Consolidation()

    def matches(self, probes: Mapping[str, bytes]) -> bool:
        """Presence decides; a broken ``zarr.json`` is then reported by parse_metadata."""
        return METADATA_NAME in probes

    def parse_metadata(self, name: str, data: bytes, *, path: str = "") -> Node:
        if name != METADATA_NAME:
            raise self.rejected(
                path, "metadata-name", f"zarr v3 metadata is named {METADATA_NAME!r}, not {name!r}"
            )
        try:
            return parse_document(load_json(data))
        except Rejected as exc:
            raise retag(exc, path) from exc

    def node_name_problem(self, name: str) -> str | None:
        """The core spec's "Node names" MUSTs, exactly: not empty, no ``/``, not only
        periods, no reserved ``__`` prefix, not ``zarr.json``.

        The spec's recommendations are not enforced. Characters outside ``a-zA-Z0-9-_.``
        and names that are not case-folded NFKC are only advised against, and real writers
        use them (zarr-python 3 refuses nothing but ``.`` and ``..`` path segments;
        TensorStore opens an array at any path), so refusing them would lock users out of
        their own stores. Case-insensitive uniqueness is no rule at all: the spec says names
        are case sensitive, ``foo`` and ``FOO`` being two nodes (that they collide on a
        case-folding file system is a limit of that store, which refuses the second name
        itself). ``ZARR.JSON`` passes for the same reason.
        """
        spec = "the Zarr v3 core spec"
        if not name:
            return f"a node name must not be empty ({spec})"
        if "/" in name:
            return f"node name {name[:80]!r} must not contain '/' ({spec})"
        if not name.strip("."):
            return f"node name {name[:80]!r} must not consist only of periods ({spec})"
        if name.startswith("__"):
            return f"node name {name[:80]!r} starts with '__', a prefix reserved by {spec}"
        if name == METADATA_NAME:
            return f"a node must not be named {METADATA_NAME!r}, the metadata name ({spec})"
        return None
