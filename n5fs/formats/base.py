"""The shape every format module fills in (n5, zarr2, zarr3, hdmf-zarr).

A format answers, for one folder of a store: which names are its metadata, how to parse and
validate them, and - for an array folder - what each relative key is (chunk at a grid
position, or other) and whether given chunk bytes are valid. Everything raises
:class:`~n5fs.errors.Rejected` (with ``fmt`` and ``rule`` set) and nothing else on bad input.
"""

from __future__ import annotations

import abc
import enum
import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from n5fs.errors import NotSupported, Rejected

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import numpy as np


class NodeKind(enum.Enum):
    GROUP = "group"
    ARRAY = "array"


class KeyKind(enum.Enum):
    METADATA = "metadata"
    CHUNK = "chunk"
    OTHER = "other"
    #: a name the format forbids where it stands: a chunk-like key that breaks the array's
    #: key grammar, a metadata name in a chunk folder, a node name the format reserves
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Classified:
    """What a key relative to an array folder is.

    ``position`` is the chunk's grid index in the order the metadata lists dimensions;
    ``in_grid`` is False for a chunk-shaped key outside the current grid. An INVALID key
    carries the ``rule`` it breaks and the ``message`` a user reads.
    """

    kind: KeyKind
    position: tuple[int, ...] | None = None
    in_grid: bool = True
    rule: str = ""
    message: str = ""


#: one index of a chunk-like key: any run of ASCII digits, signed or not, canonical or not
_LOOSE_INDEX = re.compile(r"[+-]?[0-9]+", re.ASCII)
#: names of writers' temporary files end in something that is never an index, so this
#: grammar leaves them alone: ``0.0.partial``, ``.0.0.XyZ123`` (rsync), ``0/0.__lock``
CHUNK_KEY_RULE = "chunk-key"


def chunk_like(rel_key: str) -> bool:
    """Does ``rel_key`` look like a chunk key of *some* array (indices separated by ``.`` or
    ``/``, optionally after v3's ``c``)? Such a key in an array folder that does not parse
    under the array's own grammar is a mistake (wrong separator, wrong number of indices, a
    sign or a leading zero), refused rather than stored as an ordinary file."""
    parts = re.split(r"[./]", rel_key)
    if parts and parts[0] == "c":
        parts = parts[1:]
    return bool(parts) and all(_LOOSE_INDEX.fullmatch(p) for p in parts)


def chunk_key_pattern(ndim: int, separator: str, index: str, *, head: str = "") -> re.Pattern[str]:
    """One regex for a whole chunk key: ``head`` (when given) and ``ndim`` indices, each
    matching ``index`` (a regex without groups), joined by ``separator``; group ``i`` holds
    index ``i``. ``fullmatch`` of it accepts exactly what splitting at ``separator`` and
    matching every part would (no index can hold the separator), at a fraction of the cost:
    an array asks it for every chunk it classifies. A head alone is a 0-d key (``c``, ``0``);
    with neither, nothing matches."""
    parts = [re.escape(head)] if head else []
    parts += [f"({index})"] * ndim
    return re.compile(re.escape(separator).join(parts) if parts else "(?!)", re.ASCII)


def bad_chunk_key(rel_key: str, grammar: str) -> Classified:
    """The INVALID answer for a chunk-like ``rel_key`` that breaks ``grammar`` (in words)."""
    return Classified(
        KeyKind.INVALID,
        rule=CHUNK_KEY_RULE,
        message=f"{rel_key[:80]!r} looks like a chunk key but this array's chunk keys are "
        f"{grammar}",
    )


@dataclass(frozen=True)
class Node(abc.ABC):
    """Parsed, validated metadata of one folder (a group or an array)."""

    fmt: ClassVar[str]
    kind: ClassVar[NodeKind]
    #: the metadata document as parsed JSON (user attributes included)
    raw: Mapping[str, Any] = field(compare=False, repr=False)

    @property
    def attributes(self) -> Mapping[str, Any]:
        """User attributes (for hdmf-zarr, links and ``zarr_dtype`` live here)."""
        return {}


@dataclass(frozen=True)
class GroupNode(Node):
    kind: ClassVar[NodeKind] = NodeKind.GROUP


@dataclass(frozen=True)
class ArrayNode(Node):
    """An array's metadata plus the key grammar and chunk rules it implies."""

    kind: ClassVar[NodeKind] = NodeKind.ARRAY

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, ...]:
        """Array shape in the metadata's dimension order."""

    @property
    @abc.abstractmethod
    def chunks(self) -> tuple[int, ...]:
        """Chunk (N5: block; v3 sharded: shard) shape in the metadata's dimension order."""

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype[Any]:
        """numpy dtype of one element (structured for v2 records)."""

    @functools.cached_property
    def grid(self) -> tuple[int, ...]:
        """Number of chunks along each dimension.

        Computed once per node (the classifier and every chunk check ask, several times per
        chunk): ``cached_property`` keeps it in the instance ``__dict__`` (nodes are not slotted),
        outside the dataclass fields, so it takes no part in ``==``, ``hash`` or ``repr``; a
        node is immutable, so the answer never goes stale (``dataclasses.replace`` makes a new
        node with its own cache). Two threads asking first may both compute it: the same tuple."""
        return tuple(-(-s // c) if c else 0 for s, c in zip(self.shape, self.chunks, strict=True))

    @abc.abstractmethod
    def classify(self, rel_key: str) -> Classified:
        """What ``rel_key`` (relative to the array folder) is under this array's grammar:
        METADATA, CHUNK (with its position; ``in_grid`` False outside the grid), INVALID for
        a :func:`chunk_like` key that does not parse (see :func:`bad_chunk_key`), else OTHER."""

    @abc.abstractmethod
    def chunk_key(self, position: tuple[int, ...]) -> str:
        """The relative key of the chunk at ``position``."""

    @abc.abstractmethod
    def validate_chunk(self, position: tuple[int, ...], data: bytes, *, path: str = "") -> None:
        """Raise Rejected unless ``data`` is a valid chunk at ``position``."""

    @abc.abstractmethod
    def decode_chunk(self, position: tuple[int, ...], data: bytes) -> np.ndarray[Any, Any]:
        """The chunk's values, shaped like the (possibly clipped N5) chunk at ``position``."""

    @abc.abstractmethod
    def encode_chunk(self, position: tuple[int, ...], values: np.ndarray[Any, Any]) -> bytes:
        """Bytes a conforming writer would store for ``values`` at ``position``."""

    @abc.abstractmethod
    def structural(self) -> Mapping[str, Any]:
        """The fields whose change would reinterpret stored chunks (dtype, chunks, codecs...)."""

    def codec_summary(self) -> str:
        """One short line for humans, e.g. ``gzip(level=5)``."""
        return ""

    def in_grid(self, position: tuple[int, ...]) -> bool:
        """Is ``position`` a chunk of the grid? (Asked for every chunk: a plain loop, as a
        generator in ``all()`` costs more than the comparisons.)"""
        grid = self.grid
        if len(position) != len(grid):
            return False
        for p, g in zip(position, grid, strict=True):  # noqa: SIM110
            if not 0 <= p < g:
                return False
        return True


@dataclass(frozen=True)
class AttrsNode(Node):
    """A metadata file that only carries attributes (v2 ``.zattrs``)."""

    kind: ClassVar[NodeKind] = NodeKind.GROUP


class Consolidation(abc.ABC):
    """How a format keeps consolidated metadata true: which documents above a metadata key
    consolidate it, and what such a document becomes when one entry changes."""

    @abc.abstractmethod
    def documents(self, key: str) -> list[str]:
        """Keys of the documents that may consolidate metadata key ``key``, nearest first."""

    @abc.abstractmethod
    def updated(
        self, doc_key: str, doc: Mapping[str, Any], key: str, entry: Any | None
    ) -> dict[str, Any] | None:
        """``doc`` with ``key``'s entry set to ``entry`` (None: removed), or None when ``doc``
        holds no consolidated metadata (a plain group document)."""

    @abc.abstractmethod
    def stale_entries(
        self, doc_key: str, doc: Mapping[str, Any], stored: Mapping[str, Any]
    ) -> list[str]:
        """Entries of ``doc`` that disagree with ``stored`` (every metadata key below the
        document's folder -> its parsed JSON): missing, extra or different, in words."""

    @abc.abstractmethod
    def serialize(self, doc: Mapping[str, Any]) -> bytes:
        """The bytes to store, as the format's reference writer lays them out."""


class Format(abc.ABC):
    """One format's rules for a folder. Instances are stateless singletons."""

    name: ClassVar[str]
    #: relative names detection probes for this format (read all at once)
    probe_names: ClassVar[frozenset[str]]
    #: metadata names this format owns in any folder of its hierarchy
    metadata_names: ClassVar[frozenset[str]]
    #: a more general format this one refines (hdmf-zarr refines zarr2)
    refines: ClassVar[str | None] = None
    #: the TensorStore driver that opens this format's arrays
    tensorstore_driver: ClassVar[str]
    #: inside a hierarchy of this format every folder is a group, metadata or not (N5)
    implicit_groups: ClassVar[bool] = False
    #: how this format keeps consolidated metadata true (None: it has none)
    consolidation: ClassVar[Consolidation | None] = None

    def claims(self, name: str, context: str | None, load: Callable[[], bytes]) -> bool:
        """Is file ``name`` this format's metadata, in a folder whose hierarchy is of format
        ``context`` (the nearest folder at or above it with a format; None when none has)?
        ``load`` gives the file's content for formats whose names alone cannot tell (N5's
        ``attributes.json`` is an ordinary file outside an N5 hierarchy)."""
        return name in self.metadata_names

    def check_folder(self, names: frozenset[str], *, path: str = "") -> None:
        """Refuse metadata files that cannot stand together in one folder (``names``: the
        metadata names present), e.g. Zarr v2's ``.zarray`` beside ``.zgroup``."""

    def node_name_problem(self, name: str) -> str | None:
        """Why ``name`` may not name a node (group or array folder) of this format, or None."""
        return None

    def links(self, node: Node | None) -> dict[str, str]:
        """Same-store links of a group: link name -> target key prefix (hdmf-zarr only)."""
        return {}

    def link_update(self, node: Node | None, name: str, target: str | None) -> tuple[str, bytes]:
        """The metadata file (relative name) and new content that add link ``name`` ->
        ``target`` (a store path) or, with ``target`` None, remove it."""
        raise NotSupported(f"{self.name} has no links; symlinks exist only as hdmf-zarr links")

    @abc.abstractmethod
    def matches(self, probes: Mapping[str, bytes]) -> bool:
        """Do the fetched probe files (absent names missing) look like this format?"""

    @abc.abstractmethod
    def parse_metadata(self, name: str, data: bytes, *, path: str = "") -> Node:
        """Parse and validate metadata file ``name`` (e.g. ``.zarray``); raise Rejected."""

    def node_from_probes(self, probes: Mapping[str, bytes], *, path: str = "") -> Node | None:
        """The folder's node (array before group) from its probe files, or None. ``path`` is
        the folder's prefix (``""`` or ``"a/b/"``); an error names the metadata key."""
        for name in sorted(self.probe_names):
            if name in probes:
                node = self.parse_metadata(name, probes[name], path=path + name)
                if isinstance(node, (ArrayNode, GroupNode)) and not isinstance(node, AttrsNode):
                    return node
        return None

    def check_change(self, old: Node, new: Node, *, chunks_exist: bool, path: str = "") -> None:
        """Refuse a metadata change that would reinterpret stored chunks."""
        if not chunks_exist or not isinstance(old, ArrayNode):
            return
        if not isinstance(new, ArrayNode):
            raise self.rejected(
                path, "structural-change", "an array with stored chunks cannot become a group"
            )
        before, after = old.structural(), new.structural()
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if changed:
            raise self.rejected(
                path,
                "structural-change",
                f"changing {', '.join(changed)} would reinterpret the stored chunks; "
                "delete the chunks first or write a new array",
            )

    def rejected(self, path: str, rule: str, message: str) -> Rejected:
        return Rejected(message, path=path, fmt=self.name, rule=rule)
