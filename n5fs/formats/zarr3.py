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
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import unicodedata
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
from n5fs.formats.base import ArrayNode, Classified, Format, GroupNode, KeyKind, Node

if TYPE_CHECKING:
    from collections.abc import Mapping

from n5fs.formats.base import bad_chunk_key, chunk_like

FMT = "zarr3"
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
_EMPTY_CONSOLIDATED: dict[str, Any] = {"kind": "inline", "must_understand": False, "metadata": {}}


def _bad(rule: str, message: str) -> Rejected:
    return Rejected(message, fmt=FMT, rule=rule)


def retag(exc: Rejected, path: str) -> Rejected:
    """The same error (same class and rule) with this key's path and our format name."""
    return type(exc)(exc.message, path=path or exc.path, fmt=FMT, rule=exc.rule)


# --------------------------------------------------------------------------- fill_value

_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_HEX = re.compile(r"0x([0-9a-fA-F]+)")


def parse_fill_value(value: Any, data_type: DataType) -> Any:
    """The fill value as a numpy scalar (``str``/``bytes`` for variable-length types)."""
    dtype, kind = data_type.dtype, data_type.dtype.kind
    if data_type.vlen == "utf8" or kind == "U":
        width = None if data_type.vlen else dtype.itemsize // 4
        if isinstance(value, str) and (width is None or len(value) <= width):
            return value if width is None else np.str_(value)
    elif data_type.vlen == "bytes" or kind == "S" or data_type.name == "raw_bytes":
        raw = _base64(value)
        if raw is not None and data_type.vlen == "bytes":
            return raw
        if raw is not None and (
            len(raw) <= dtype.itemsize if kind == "S" else len(raw) == dtype.itemsize
        ):
            return np.bytes_(raw) if kind == "S" else np.frombuffer(raw, dtype=dtype)[0]
    elif kind == "V":  # core r* types: one integer 0..255 per byte
        if (
            isinstance(value, list)
            and len(value) == dtype.itemsize
            and all(is_int(b) and 0 <= b <= 255 for b in value)
        ):
            return np.frombuffer(bytes(value), dtype=dtype)[0]
    elif kind == "b":
        if isinstance(value, bool):
            return np.bool_(value)
    elif kind in "iu":
        return _int_fill(value, dtype, data_type)
    elif kind in "Mm":
        if value == "NaT" or (is_int(value) and -(2**63) <= value < 2**63):
            ticks = np.iinfo(np.int64).min if value == "NaT" else value
            return np.array(ticks, dtype=np.int64).view(dtype)[()]
    elif kind == "f":
        return _float_fill(value, dtype, data_type)
    elif kind == "c" and isinstance(value, list) and len(value) == 2:
        part = np.dtype(f"f{dtype.itemsize // 2}")
        pair = np.array([_float_fill(v, part, data_type) for v in value], dtype=part)
        return pair.view(dtype)[0]
    raise _bad("fill-value", f"fill_value {value!r} is not a valid {data_type.name} value")


def _base64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None


def _int_fill(value: Any, dtype: np.dtype[Any], data_type: DataType) -> Any:
    """Integers; an integral JSON number such as ``2.0`` is accepted, as TensorStore does."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    info = np.iinfo(dtype)
    if is_int(value) and info.min <= value <= info.max:
        return dtype.type(value)
    raise _bad(
        "fill-value",
        f"fill_value {value!r} is not an integer in "
        f"[{info.min}, {info.max}] as {data_type.name} requires",
    )


def _float_fill(value: Any, dtype: np.dtype[Any], data_type: DataType) -> Any:
    """A number, "NaN"/"Infinity"/"-Infinity", or "0x..." with the exact bit pattern."""
    if isinstance(value, str) and value in _SPECIAL_FLOATS:
        return dtype.type(_SPECIAL_FLOATS[value])
    match = _HEX.fullmatch(value) if isinstance(value, str) else None
    if match and len(match.group(1)) == 2 * dtype.itemsize:
        bits = np.array(int(match.group(1), 16), dtype=f"u{dtype.itemsize}")
        return bits.view(dtype)[()]
    if is_int(value) or isinstance(value, float):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        with np.errstate(over="ignore"):
            result = dtype.type(number)
        if math.isfinite(number) and np.isfinite(result):
            return result
    raise _bad(
        "fill-value",
        f"fill_value {value!r} is not a {data_type.name} value: use a number "
        f'in range, "NaN", "Infinity", "-Infinity" or a '
        f'{2 * dtype.itemsize}-digit "0x..." bit pattern',
    )


def fill_identity(fill: Any, data_type: DataType) -> str:
    """A canonical text for a fill value, so ``"NaN"`` and ``"0x7fc00000"`` compare equal."""
    if data_type.vlen:
        return repr(fill)
    return np.array(fill, dtype=data_type.dtype).tobytes().hex()


# --------------------------------------------------------------------------- chunk keys

#: one canonical index: no sign, no leading zero; 1000 digits keeps int() under Python's
#: 4300-digit limit (any index past 19 digits lies outside every grid anyway)
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,999}", re.ASCII)


@dataclass(frozen=True)
class ChunkKeyEncoding:
    """``default`` (``c/1/2``, ``c.1.2``, 0-d ``c``) or ``v2`` (``1.2``, ``1/2``, 0-d ``0``)."""

    name: str
    separator: str

    @classmethod
    def parse(cls, value: Any) -> ChunkKeyEncoding:
        try:
            ext = parse_extension(value, "chunk_key_encoding", rule="chunk-key-encoding")
        except CodecError as exc:
            raise _bad(exc.rule, exc.message) from exc
        if ext.name not in ("default", "v2") or not ext.must_understand:
            raise _bad(
                "chunk-key-encoding",
                f"chunk_key_encoding {ext.name!r} is not 'default' "
                "or 'v2' (must_understand=false is not allowed here by the spec)",
            )
        separator = ext.configuration.get("separator", "/" if ext.name == "default" else ".")
        if set(ext.configuration) - {"separator"} or separator not in ("/", "."):
            raise _bad(
                "chunk-key-encoding",
                "chunk_key_encoding configuration may only hold "
                f"separator '/' or '.', got {dict(ext.configuration)!r}",
            )
        return cls(ext.name, separator)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": {"separator": self.separator}}

    def key(self, position: tuple[int, ...]) -> str:
        parts = [str(p) for p in position]
        if self.name == "default":
            return self.separator.join(["c", *parts])
        return self.separator.join(parts) if parts else "0"

    def parse_key(self, key: str, ndim: int) -> tuple[int, ...] | None:
        """The grid position ``key`` names (``ndim`` indices, not checked against the grid),
        or None when ``key`` is not a chunk key of an ``ndim``-dimensional array."""
        if self.name == "v2" and ndim == 0:
            return () if key == "0" else None
        parts = key.split(self.separator)
        if self.name == "default":
            if parts[0] != "c":
                return None
            parts = parts[1:]
        if len(parts) != ndim or not all(_DECIMAL.fullmatch(p) for p in parts):
            return None
        return tuple(int(p) for p in parts)

    def looks_like_key(self, key: str) -> bool:
        """Is ``key`` chunk-shaped (see :func:`chunk_like`)? A bare ``c`` is too under the
        default encoding: the 0-d key, wrong for an array with dimensions."""
        return chunk_like(key) or (self.name == "default" and key == "c")

    def grammar(self, ndim: int) -> str:
        """This encoding's chunk keys for ``ndim`` dimensions, in words (for refusals)."""
        example = self.key((0,) * ndim)
        if ndim == 0:
            return f"the single key {example!r} (the array has 0 dimensions)"
        count = f"{ndim} {'index' if ndim == 1 else 'indices'}"
        if self.name == "default":
            layout = f"'c' followed by {count}, each after {self.separator!r}"
        elif ndim == 1:
            layout = count
        else:
            layout = f"{count} joined by {self.separator!r}"
        return f"{layout}, such as {example!r}; decimal, without sign or leading zeros"


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
        ndim = len(self.array_shape)
        position = self.key_encoding.parse_key(rel_key, ndim)
        if position is not None:
            return Classified(KeyKind.CHUNK, position, self.in_grid(position))
        if self.key_encoding.looks_like_key(rel_key):
            return bad_chunk_key(rel_key, self.key_encoding.grammar(ndim))
        return Classified(KeyKind.OTHER)

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


# --------------------------------------------------------------------------- consolidation


def consolidated_metadata(children: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The inline ``consolidated_metadata`` zarr-python 3 writes for a group.

    ``children`` maps every descendant's path relative to the group (``"a"``, ``"a/b"``)
    to that node's own ``zarr.json`` document. As zarr-python does, child groups carry an
    empty consolidated block and entries are ordered by depth, then case-folded name.
    """
    metadata: dict[str, Any] = {}
    for path in sorted(
        children, key=lambda k: (k.count("/"), unicodedata.normalize("NFKC", k).casefold())
    ):
        doc = dict(children[path])
        if doc.get("node_type") == "group":
            doc["consolidated_metadata"] = json.loads(json.dumps(_EMPTY_CONSOLIDATED))
        metadata[path] = doc
    return {"kind": "inline", "must_understand": False, "metadata": metadata}


def consolidate(
    group_doc: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """``group_doc`` with its consolidated_metadata rebuilt from ``children``."""
    return {**group_doc, "consolidated_metadata": consolidated_metadata(children)}


def consolidated_is_current(
    group_doc: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Does the stored block equal what ``children`` would produce (order ignored)?"""
    return group_doc.get("consolidated_metadata") == consolidated_metadata(children)
