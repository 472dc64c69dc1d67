"""The shape every format module fills in (n5, zarr2, zarr3, hdmf-zarr).

A format answers, for one folder of a store: which names are its metadata, how to parse and
validate them, and - for an array folder - what each relative key is (chunk at a grid
position, or other) and whether given chunk bytes are valid. Everything raises
:class:`~n5fs.errors.Rejected` (with ``fmt`` and ``rule`` set) and nothing else on bad input.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from n5fs.errors import Rejected

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np


class NodeKind(enum.Enum):
    GROUP = "group"
    ARRAY = "array"


class KeyKind(enum.Enum):
    METADATA = "metadata"
    CHUNK = "chunk"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Classified:
    """What a key relative to an array folder is.

    ``position`` is the chunk's grid index in the order the metadata lists dimensions;
    ``in_grid`` is False for a chunk-shaped key outside the current grid.
    """

    kind: KeyKind
    position: tuple[int, ...] | None = None
    in_grid: bool = True


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

    @property
    def grid(self) -> tuple[int, ...]:
        """Number of chunks along each dimension."""
        return tuple(-(-s // c) if c else 0 for s, c in zip(self.shape, self.chunks, strict=True))

    @abc.abstractmethod
    def classify(self, rel_key: str) -> Classified:
        """What ``rel_key`` (relative to the array folder) is under this array's grammar."""

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
        return len(position) == len(self.grid) and all(
            0 <= p < g for p, g in zip(position, self.grid, strict=True)
        )


@dataclass(frozen=True)
class AttrsNode(Node):
    """A metadata file that only carries attributes (v2 ``.zattrs``)."""

    kind: ClassVar[NodeKind] = NodeKind.GROUP


class Format(abc.ABC):
    """One format's rules for a folder. Instances are stateless singletons."""

    name: ClassVar[str]
    #: relative names detection probes for this format (read all at once)
    probe_names: ClassVar[frozenset[str]]
    #: metadata names this format owns in any folder of its hierarchy
    metadata_names: ClassVar[frozenset[str]]
    #: a more general format this one refines (hdmf-zarr refines zarr2)
    refines: ClassVar[str | None] = None

    @abc.abstractmethod
    def matches(self, probes: Mapping[str, bytes]) -> bool:
        """Do the fetched probe files (absent names missing) look like this format?"""

    @abc.abstractmethod
    def parse_metadata(self, name: str, data: bytes, *, path: str = "") -> Node:
        """Parse and validate metadata file ``name`` (e.g. ``.zarray``); raise Rejected."""

    def node_from_probes(self, probes: Mapping[str, bytes], *, path: str = "") -> Node | None:
        """The folder's node (array before group) from its probe files, or None."""
        for name in sorted(self.probe_names):
            if name in probes:
                node = self.parse_metadata(name, probes[name], path=path)
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
