"""Zarr v2: ``.zarray``, ``.zgroup``, ``.zattrs`` and consolidated ``.zmetadata``; chunk keys.

Rules follow the Zarr v2 storage specification. Where writers differ and the spec allows it we
accept both: extra ``.zarray`` keys are ignored ("SHOULD be ignored by implementations"), a
missing or null ``dimension_separator`` means ``"."``, ``filters`` may be null or a list, a bare
JSON ``NaN``/``Infinity`` token is taken for a float fill value as well as the spec's strings.

Structural fields (a change reinterprets stored chunks): dtype, chunks, compressor, filters,
order and dimension_separator. ``fill_value`` is *not* structural: v2 chunks always hold every
element, so the fill value only says what a *missing* chunk reads as; ``shape`` may change
(resize). v2 chunks are always full size, edge chunks included.

The dtype and fill_value parsers are in :mod:`n5fs.formats.zarr2_fields`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from n5fs.codecs import jsondoc
from n5fs.codecs.limits import CodecError
from n5fs.codecs.v2_pipeline import V2Pipeline
from n5fs.errors import InvalidKey, Rejected
from n5fs.formats.base import (
    ArrayNode,
    AttrsNode,
    Classified,
    Format,
    GroupNode,
    KeyKind,
    Node,
    NodeKind,
    bad_chunk_key,
    chunk_key_pattern,
    chunk_like,
)
from n5fs.formats.consolidation import ZarrV2Consolidation
from n5fs.formats.zarr2_fields import _bad, _is_int, parse_dtype, parse_fill_value
from n5fs.kvstore.keys import check_key

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

NODE_NAMES = (".zarray", ".zgroup", ".zattrs")
METADATA_NAMES = frozenset((*NODE_NAMES, ".zmetadata"))
# fmt: off
ZARRAY_KEYS = ("zarr_format", "shape", "chunks", "dtype", "compressor", "fill_value", "order",
               "filters")
# fmt: on
_INDEX = re.compile(r"0|[1-9][0-9]*", re.ASCII)
#: zarr-python 3 copies this key into sub-group entries of a v2 .zmetadata (never the files)
_ZP3_GROUP_EXTRA = frozenset({"consolidated_metadata"})


def located(exc: Rejected, *, path: str, fmt: str) -> Rejected:
    """The same error (same class and rule) with the key and format filled in."""
    return type(exc)(exc.message, path=exc.path or path, fmt=exc.fmt or fmt, rule=exc.rule)


def load_json(data: bytes) -> Any:
    """Parse a metadata document; duplicate object keys are refused (readers disagree on them)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise _bad("json", f"duplicate key {key!r} in a JSON object")
            out[key] = value
        return out

    try:
        return jsondoc.load_json(data, what="the document", object_pairs_hook=unique)
    except CodecError as exc:
        raise _bad(exc.rule, exc.message) from exc


def _json_object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise _bad("json-object", f"{what} must be a JSON object, got {type(doc).__name__}")
    return doc


# --- .zarray --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayMeta:
    """What a valid ``.zarray`` says, parsed."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    order: str
    separator: str
    fill: np.ndarray[Any, Any] = field(compare=False, repr=False)
    pipeline: V2Pipeline = field(compare=False, repr=False)


def _int_list(doc: dict[str, Any], key: str, minimum: int) -> tuple[int, ...]:
    value = doc[key]
    if not isinstance(value, list) or not all(_is_int(n) and n >= minimum for n in value):
        raise _bad(key, f"{key} must be a list of integers >= {minimum}, got {value!r:.60}")
    return tuple(value)


def parse_zarray(doc: Any) -> ArrayMeta:
    """Check every required key of a ``.zarray`` document and that the keys agree."""
    doc = _json_object(doc, ".zarray")
    missing = [k for k in ZARRAY_KEYS if k not in doc]
    if missing:
        raise _bad("missing-key", f".zarray lacks required key(s) {', '.join(missing)}")
    if not _is_int(doc["zarr_format"]) or doc["zarr_format"] != 2:
        raise _bad("zarr-format", f"zarr_format must be 2, got {doc['zarr_format']!r:.20}")
    shape, chunks = _int_list(doc, "shape", 0), _int_list(doc, "chunks", 1)
    if len(shape) != len(chunks):
        raise _bad(
            "shape-chunks-length",
            f"shape has {len(shape)} dimensions, chunks {len(chunks)}: they must agree",
        )
    dtype = parse_dtype(doc["dtype"])
    fill = parse_fill_value(doc["fill_value"], dtype)
    if doc["order"] not in ("C", "F"):
        raise _bad("order", f"order must be 'C' or 'F', got {doc['order']!r:.20}")
    separator = doc.get("dimension_separator") or "."
    if separator not in (".", "/"):
        raise _bad(
            "dimension-separator", f"dimension_separator must be '.' or '/', got {separator!r:.20}"
        )
    pipeline = V2Pipeline(doc["compressor"], doc["filters"], dtype)
    return ArrayMeta(shape, chunks, dtype, doc["order"], separator, fill, pipeline)


#: hdmf-zarr's reference class, a plain ``dict`` subclass: NWB object references are pickled
#: as it. Allowed in every v2 object array, not only inside a known hdmf-zarr hierarchy: ``cp
#: -r`` copies a folder's files in inode order, so a reference chunk can land before any
#: hdmf-zarr mark of its hierarchy (real NWB copies failed that way). Never unpickled here;
#: its reconstruction runs no code beyond importing ``hdmf_zarr.utils`` in a reader.
REFERENCE_PICKLE_GLOBALS = frozenset({"hdmf_zarr.utils.ZarrReference"})


# --- nodes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Zarr2ArrayNode(ArrayNode):
    """A v2 array; ``attrs`` is its ``.zattrs`` when the folder's probes included one."""

    fmt: ClassVar[str] = "zarr2"
    #: globals a pickle chunk may name beyond the plain value types of
    #: :data:`~n5fs.codecs.pickle_check.SAFE_PICKLE_GLOBALS` (a writer's own value classes)
    pickle_globals: ClassVar[frozenset[str]] = REFERENCE_PICKLE_GLOBALS
    meta: ArrayMeta
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.meta.chunks

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.meta.dtype

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self.attrs

    @functools.cached_property
    def chunk_nbytes(self) -> int:
        """Bytes of one decoded chunk (every v2 chunk, edge ones too); once per node, as
        :attr:`grid` (every chunk check asks)."""
        return math.prod(self.chunks) * self.dtype.itemsize

    def classify(self, rel_key: str) -> Classified:
        if rel_key in METADATA_NAMES:
            return Classified(KeyKind.METADATA)
        position = self._position(rel_key)
        if position is not None:
            return Classified(KeyKind.CHUNK, position, self.in_grid(position))
        if chunk_like(rel_key):
            return bad_chunk_key(rel_key, self.key_grammar())
        return Classified(KeyKind.OTHER)

    def key_grammar(self) -> str:
        """This array's chunk keys, in words (for a refused key's message)."""
        if not self.chunks:
            return "just '0' (the array has no dimensions)"
        sep, ndim = self.meta.separator, len(self.chunks)
        return (
            f"{ndim} unsigned integer{'s' if ndim > 1 else ''} without leading zeros"
            f"{f' joined by {sep!r}' if ndim > 1 else ''} (e.g. {sep.join(['0'] * ndim)!r})"
        )

    @functools.cached_property
    def _key_pattern(self) -> re.Pattern[str]:
        """Canonical chunk keys (no sign, no leading zeros); a 0-d array's one key is ``0``."""
        ndim = len(self.chunks)
        return chunk_key_pattern(
            ndim, self.meta.separator, _INDEX.pattern, head="" if ndim else "0"
        )

    def _position(self, rel_key: str) -> tuple[int, ...] | None:
        """Grid position of a canonical chunk key, else None."""
        match = self._key_pattern.fullmatch(rel_key)
        return None if match is None else tuple(map(int, match.groups()))

    def chunk_key(self, position: tuple[int, ...]) -> str:
        return self.meta.separator.join(map(str, position)) if position else "0"

    def _check_position(self, position: tuple[int, ...], path: str) -> None:
        if not self.in_grid(position):
            raise Rejected(
                f"chunk {position} lies outside the grid {self.grid} of shape "
                f"{self.shape} / chunks {self.chunks}",
                path=path,
                fmt=self.fmt,
                rule="out-of-grid",
            )

    def validate_chunk(self, position: tuple[int, ...], data: bytes, *, path: str = "") -> None:
        self._check_position(position, path)
        try:
            if self.meta.pipeline.is_object:
                self.meta.pipeline.check_objects(
                    data, math.prod(self.chunks), pickle_globals=self.pickle_globals
                )
            else:
                self.meta.pipeline.decode(data, self.chunk_nbytes)
        except Rejected as exc:
            raise located(exc, path=path, fmt=self.fmt) from exc

    def decode_chunk(self, position: tuple[int, ...], data: bytes) -> np.ndarray[Any, Any]:
        """The full chunk (read-only unless object), laid out in the array's order."""
        self._check_position(position, "")
        try:
            if self.meta.pipeline.is_object:
                flat = self.meta.pipeline.decode_objects(data, math.prod(self.chunks))
            else:
                buf = self.meta.pipeline.decode(data, self.chunk_nbytes)
                flat = np.frombuffer(buf, dtype=self.dtype)
        except Rejected as exc:
            raise located(exc, path="", fmt=self.fmt) from exc
        order: Any = self.meta.order
        return flat.reshape(self.chunks, order=order)

    def encode_chunk(self, position: tuple[int, ...], values: np.ndarray[Any, Any]) -> bytes:
        """Values smaller than a chunk (an edge) are padded with the fill value, as v2 stores."""
        self._check_position(position, "")
        values = np.asarray(values, dtype=self.dtype)
        if values.ndim != len(self.chunks) or any(
            v > c for v, c in zip(values.shape, self.chunks, strict=True)
        ):
            raise Rejected(
                f"values of shape {values.shape} do not fit chunks {self.chunks}",
                fmt=self.fmt,
                rule="chunk-shape",
            )
        order: Any = self.meta.order
        fill = (
            self.meta.pipeline.object_fill(self.meta.fill[()])
            if self.dtype.hasobject
            else self.meta.fill
        )
        full = np.full(self.chunks, fill, dtype=self.dtype, order=order)
        full[tuple(slice(0, n) for n in values.shape)] = values
        return self.meta.pipeline.encode(full)

    def structural(self) -> Mapping[str, Any]:
        compressor, filters = self.meta.pipeline.configs()
        return {
            "dtype": self.dtype,
            "chunks": self.chunks,
            "compressor": compressor,
            "filters": filters,
            "order": self.meta.order,
            "dimension_separator": self.meta.separator,
        }

    def codec_summary(self) -> str:
        return self.meta.pipeline.summary()


@dataclass(frozen=True)
class Zarr2GroupNode(GroupNode):
    fmt: ClassVar[str] = "zarr2"
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self.attrs


@dataclass(frozen=True)
class Zarr2AttrsNode(AttrsNode):
    """A ``.zattrs`` document: the user attributes of the folder's group or array."""

    fmt: ClassVar[str] = "zarr2"

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self.raw


@dataclass(frozen=True)
class Zarr2ConsolidatedNode(Node):
    """A ``.zmetadata``: every entry parsed and validated, keyed as in the document."""

    fmt: ClassVar[str] = "zarr2"
    kind: ClassVar[NodeKind] = NodeKind.GROUP
    entries: Mapping[str, Node] = field(default_factory=dict, compare=False, repr=False)


# --- the format -----------------------------------------------------------------------------


class Zarr2Format(Format):
    """Zarr v2 rules for one folder; subclasses (hdmf-zarr) swap the node classes."""

    name: ClassVar[str] = "zarr2"
    probe_names: ClassVar[frozenset[str]] = frozenset(NODE_NAMES)
    metadata_names: ClassVar[frozenset[str]] = METADATA_NAMES
    tensorstore_driver: ClassVar[str] = "zarr"
    consolidation = ZarrV2Consolidation()
    array_node: ClassVar[type[Zarr2ArrayNode]] = Zarr2ArrayNode
    group_node: ClassVar[type[Zarr2GroupNode]] = Zarr2GroupNode
    attrs_node: ClassVar[type[Zarr2AttrsNode]] = Zarr2AttrsNode
    consolidated_node: ClassVar[type[Zarr2ConsolidatedNode]] = Zarr2ConsolidatedNode

    def claims(self, name: str, context: str | None, load: Callable[[], bytes]) -> bool:
        """``.zarray``, ``.zgroup``, ``.zattrs`` and ``.zmetadata`` are Zarr v2's in any folder:
        no other format uses these names (hdmf-zarr, which refines Zarr v2, claims them too
        inside its hierarchy, and the more specific claim wins)."""
        return name in METADATA_NAMES

    def matches(self, probes: Mapping[str, bytes]) -> bool:
        """A ``.zarray`` or ``.zgroup`` is there. Presence decides, not validity: a folder whose
        ``.zarray`` does not parse (or says ``zarr_format: 3``) is an invalid Zarr v2 node,
        reported as such, never a plain folder whose chunks nobody checks."""
        return ".zarray" in probes or ".zgroup" in probes

    def check_folder(self, names: frozenset[str], *, path: str = "") -> None:
        """A folder is an array or a group, never both."""
        if {".zarray", ".zgroup"} <= names:
            raise self.rejected(
                path,
                "array-and-group",
                "a folder cannot hold both .zarray and .zgroup: it is an array or a group",
            )

    def parse_metadata(self, name: str, data: bytes, *, path: str = "") -> Node:
        try:
            return self.parse_document(name, load_json(data), path=path)
        except Rejected as exc:
            raise located(exc, path=path, fmt=self.name) from exc

    def parse_document(self, name: str, doc: Any, *, path: str = "") -> Node:
        """Validate an already-parsed metadata document named ``name``."""
        try:
            if name == ".zarray":
                return self.array_node(raw=doc, meta=parse_zarray(doc))
            if name == ".zgroup":
                return self.group_node(raw=self._zgroup(doc))
            if name == ".zattrs":
                return self.attrs_node(raw=self.check_attributes(_json_object(doc, ".zattrs")))
            if name == ".zmetadata":
                return self.consolidated_node(raw=doc, entries=self._consolidated(doc, path))
        except Rejected as exc:
            raise located(exc, path=path, fmt=self.name) from exc
        raise self.rejected(path, "unknown-metadata", f"{name!r} is not a Zarr v2 metadata name")

    def check_attributes(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Hook for formats that reserve attribute names (hdmf-zarr); plain v2 allows any."""
        return attrs

    def node_from_probes(self, probes: Mapping[str, bytes], *, path: str = "") -> Node | None:
        """The folder's array (before group) node with its ``.zattrs`` attached, or None.

        ``path`` is the folder's prefix; an error names the metadata key (``a/b/.zgroup``).
        """
        folder = path.rstrip("/")

        def parse(name: str) -> Node:
            return self.parse_metadata(name, probes[name], path=f"{folder}/{name}".lstrip("/"))

        found = next((name for name in (".zarray", ".zgroup") if name in probes), None)
        node = parse(found) if found else None
        if not isinstance(node, (Zarr2ArrayNode, Zarr2GroupNode)) or ".zattrs" not in probes:
            return node
        return dataclasses.replace(node, attrs=parse(".zattrs").raw)

    @staticmethod
    def _zgroup(doc: Any, extra: frozenset[str] = frozenset()) -> dict[str, Any]:
        group = _json_object(doc, ".zgroup")
        if (
            not set(group) - extra == {"zarr_format"}
            or not _is_int(group["zarr_format"])
            or group["zarr_format"] != 2
        ):
            raise _bad(
                "zgroup",
                f'.zgroup must be exactly {{"zarr_format": 2}}, got {json.dumps(group)[:80]}',
            )
        return group

    def _consolidated(self, doc: Any, path: str) -> dict[str, Node]:
        doc = _json_object(doc, ".zmetadata")
        version, entries = doc.get("zarr_consolidated_format"), doc.get("metadata")
        if not _is_int(version) or version != 1 or not isinstance(entries, dict):
            raise _bad(
                "consolidated",
                '.zmetadata must hold "zarr_consolidated_format": 1 and a "metadata" object',
            )
        nodes: dict[str, Node] = {}
        for key, value in entries.items():
            leaf = key.rpartition("/")[2]
            try:
                check_key(key)
            except InvalidKey as exc:
                raise _bad("consolidated", f".zmetadata entry {key!r:.60}: {exc}") from exc
            if leaf not in NODE_NAMES:
                raise _bad(
                    "consolidated",
                    f".zmetadata entry {key!r:.60} is not a .zarray, .zgroup or .zattrs key",
                )
            try:
                nodes[key] = (
                    self.group_node(raw=self._zgroup(value, _ZP3_GROUP_EXTRA))
                    if leaf == ".zgroup"
                    else self.parse_document(leaf, value)
                )
            except Rejected as exc:
                raise type(exc)(f".zmetadata entry {key!r}: {exc.message}", rule=exc.rule) from exc
        _check_tree(nodes)
        return nodes


def _check_tree(nodes: Mapping[str, Node]) -> None:
    """A folder is an array or a group, and nothing lives under an array."""
    kinds: dict[str, str] = {}
    for key in nodes:
        folder, _, leaf = key.rpartition("/")
        if leaf == ".zattrs":
            continue
        if kinds.setdefault(folder, leaf) != leaf:
            raise _bad(
                "consolidated",
                f".zmetadata holds both .zarray and .zgroup for {folder or 'the root'!r}",
            )
    for key in nodes:
        folder = key.rpartition("/")[0]
        parent = folder
        while parent:
            parent = parent.rpartition("/")[0]
            if kinds.get(parent) == ".zarray":
                raise _bad(
                    "consolidated",
                    f".zmetadata entry {key!r} lies inside the array {parent or 'at the root'!r}",
                )
