"""The commit rules: what a key is under its folder's format, and whether its bytes may be
stored there. Nothing here writes; the gateway stores only what :meth:`CommitRules.check`
passed (strict mode) and records what it refused.

Metadata is recognised by name and context: ``zarr.json`` is always Zarr v3; ``.zarray``,
``.zgroup``, ``.zattrs``, ``.zmetadata`` are Zarr v2 (hdmf-zarr inside an hdmf hierarchy or
when they carry its reserved attributes); ``attributes.json`` is N5 inside an N5 hierarchy or
when it carries N5 keys, and an ordinary file elsewhere.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from n5fs.codecs.jsondoc import load_json
from n5fs.detect import Detector, Folder, FolderKind, candidates
from n5fs.errors import DetectionFailed, Rejected
from n5fs.formats.base import ArrayNode, Format, KeyKind, Node
from n5fs.formats.hdmf import is_hdmf_attrs
from n5fs.formats.n5 import present_dataset_keys
from n5fs.formats.registry import METADATA_NAMES, get_format
from n5fs.kvstore.keys import basename, dir_prefix, parent

if TYPE_CHECKING:
    from n5fs.kvstore.base import KvStore

#: metadata larger than this is refused before parsing (a JSON document, not a data file)
MAX_METADATA_BYTES = 64 << 20
#: files whose content defines a node (the others add attributes or consolidate)
PRIMARY_METADATA = frozenset({".zarray", ".zgroup", "attributes.json", "zarr.json"})
_ZARR2_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata"})

Loader = Callable[[], bytes]


class Mode(str, enum.Enum):
    STRICT = "strict"  # refuse invalid content: nothing reaches the store
    WARN = "warn"  # store it, log and record the rejection
    OFF = "off"  # a plain gateway


@dataclass(frozen=True)
class Rejection:
    """One refused (or, in warn mode, flagged) commit, as ``/.n5fs/rejections`` lists it."""

    time: float
    path: str
    fmt: str
    rule: str
    message: str
    stored: bool = False

    @classmethod
    def of(cls, key: str, exc: Rejected, *, stored: bool = False) -> Rejection:
        return cls(time.time(), "/" + key, exc.fmt, exc.rule, exc.message, stored)

    def to_json_line(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Verdict:
    kind: KeyKind
    fmt: str | None = None


OTHER = Verdict(KeyKind.OTHER)


def _reject(key: str, fmt: str, rule: str, message: str) -> Rejected:
    return Rejected(message, path=key, fmt=fmt, rule=rule)


class CommitRules:
    """Classify and validate one key's new content against the store as it is now."""

    def __init__(self, store: KvStore, detector: Detector) -> None:
        self.store = store
        self.detector = detector

    # -- entry point -------------------------------------------------------------------------

    def check(self, key: str, load: Loader) -> Verdict:
        """Raise Rejected unless ``load()`` may be stored at ``key``; say what the key is.

        ``load`` is called only when the bytes matter (metadata, chunks): other keys, which
        may be large files, are never read.
        """
        name = basename(key)
        folder = dir_prefix(parent(key))
        fmt = self.metadata_format(key, load)
        if fmt is not None:
            self._check_metadata(fmt, key, name, folder, load())
            return Verdict(KeyKind.METADATA, fmt.name)
        owner = self._owner(key)
        array = owner.array if owner is not None else None
        if owner is None or array is None:
            return OTHER
        what = array.classify(key[len(owner.prefix) :])
        if what.kind is not KeyKind.CHUNK or what.position is None:
            return OTHER
        if not what.in_grid:
            raise _reject(
                key,
                owner.fmt or "",
                "out-of-grid",
                f"chunk position {list(what.position)} lies outside the grid "
                f"{list(array.grid)} of the array at /{owner.prefix}",
            )
        array.validate_chunk(what.position, load(), path=key)
        return Verdict(KeyKind.CHUNK, owner.fmt)

    def metadata_format(self, key: str, load: Loader) -> Format | None:
        """The format whose metadata ``key`` is, or None for an ordinary file."""
        name = basename(key)
        if name not in METADATA_NAMES:
            return None
        context = self._context(dir_prefix(parent(key)))
        if name == "zarr.json":
            return get_format("zarr3")
        if name == "attributes.json":
            if context == "n5" or self._has_n5_keys(load):
                return get_format("n5")
            return None
        if name in _ZARR2_NAMES:
            if context == "hdmf-zarr" or (name == ".zattrs" and self._has_hdmf_marks(load)):
                return get_format("hdmf-zarr")
            return get_format("zarr2")
        return None

    # -- context -----------------------------------------------------------------------------

    def _folder(self, prefix: str) -> Folder | None:
        try:
            return self.detector.folder(prefix)
        except (DetectionFailed, Rejected):
            return None  # the store is already inconsistent there; judge the new key alone

    def _context(self, prefix: str) -> str | None:
        """The format of the folder, or of the nearest ancestor that has one."""
        while True:
            folder = self._folder(prefix)
            if folder is not None and folder.fmt:
                return folder.fmt
            if not prefix:
                return None
            prefix = dir_prefix(parent(prefix.rstrip("/")))

    def _owner(self, key: str) -> Folder | None:
        try:
            return self.detector.owner(key)
        except (DetectionFailed, Rejected):
            return None

    @staticmethod
    def _has_n5_keys(load: Loader) -> bool:
        try:
            doc = load_json(load())
        except Rejected:
            return False
        return isinstance(doc, dict) and ("n5" in doc or bool(present_dataset_keys(doc)))

    @staticmethod
    def _has_hdmf_marks(load: Loader) -> bool:
        try:
            return is_hdmf_attrs(load_json(load()))
        except Rejected:
            return False

    # -- metadata ----------------------------------------------------------------------------

    def _check_metadata(self, fmt: Format, key: str, name: str, folder: str, data: bytes) -> None:
        if len(data) > MAX_METADATA_BYTES:
            raise _reject(
                key,
                fmt.name,
                "metadata-size",
                f"metadata file of {len(data)} bytes exceeds {MAX_METADATA_BYTES}",
            )
        where = self._folder(folder)
        if where is not None and where.kind is FolderKind.CHUNKS:
            raise _reject(
                key,
                fmt.name,
                "metadata-in-chunks",
                f"/{folder} is a chunk folder of the array at /{where.array_prefix}; "
                "it cannot hold metadata",
            )
        node = fmt.parse_metadata(name, data, path=key)
        self._check_clash(fmt, key, name, folder, data)
        if name in PRIMARY_METADATA:
            old = self._stored_node(fmt, key, name)
            self._check_against_chunks(fmt, key, folder, old, node)

    def _check_clash(self, fmt: Format, key: str, name: str, folder: str, data: bytes) -> None:
        probes = self.detector.probe(folder)
        probes[name] = data
        found = candidates(probes)
        if len(found) > 1:
            others = ", ".join(f.name for f in found if f.name != fmt.name)
            raise _reject(
                key,
                fmt.name,
                "format-clash",
                f"/{folder} already holds {others} metadata; one folder, one format",
            )
        if {".zarray", ".zgroup"} <= probes.keys():
            raise _reject(
                key, fmt.name, "array-and-group", f"/{folder} cannot hold both .zarray and .zgroup"
            )

    def _stored_node(self, fmt: Format, key: str, name: str) -> Node | None:
        data = self.store.get(key)
        if data is None:
            return None
        try:
            return fmt.parse_metadata(name, data, path=key)
        except Rejected:
            return None  # the stored file was already broken: nothing to keep consistent with

    def _check_against_chunks(
        self, fmt: Format, key: str, folder: str, old: Node | None, new: Node
    ) -> None:
        old_array = old if isinstance(old, ArrayNode) else None
        new_array = new if isinstance(new, ArrayNode) else None
        if old_array is None and new_array is None:
            return
        same = old_array is not None and new_array is not None
        if same and old_array.structural() == new_array.structural():  # type: ignore[union-attr]
            if old_array.shape != new_array.shape:  # type: ignore[union-attr]
                self._check_edges(key, folder, old_array, new_array)  # type: ignore[arg-type]
            return
        if old_array is not None:
            fmt.check_change(
                old_array, new, chunks_exist=self._has_chunks(folder, old_array), path=key
            )
            if new_array is None:
                return
        assert new_array is not None
        self._check_existing_chunks(key, folder, new_array, lambda position: True)

    def _chunk_keys(self, folder: str, array: ArrayNode) -> list[tuple[str, tuple[int, ...], bool]]:
        """Stored keys under ``folder`` that are chunk keys of ``array``: (key, position, in grid)."""
        out: list[tuple[str, tuple[int, ...], bool]] = []
        for info in self.store.list(folder, delimiter=None).keys:
            what = array.classify(info.key[len(folder) :])
            if what.kind is KeyKind.CHUNK and what.position is not None:
                out.append((info.key, what.position, what.in_grid))
        return out

    def _has_chunks(self, folder: str, array: ArrayNode) -> bool:
        return bool(self._chunk_keys(folder, array))

    def _check_existing_chunks(
        self, key: str, folder: str, array: ArrayNode, wanted: Callable[[tuple[int, ...]], bool]
    ) -> None:
        """Chunk-shaped keys already stored (``cp -r`` may copy chunks before metadata) must
        be valid under the new metadata."""
        for chunk_key, position, in_grid in self._chunk_keys(folder, array):
            if not wanted(position):
                continue
            if not in_grid:
                raise _reject(
                    key,
                    array.fmt,
                    "stored-chunk-out-of-grid",
                    f"stored chunk /{chunk_key} lies outside the grid "
                    f"{list(array.grid)} this metadata declares",
                )
            data = self.store.get(chunk_key)
            if data is None:
                continue
            try:
                array.validate_chunk(position, data, path=chunk_key)
            except Rejected as exc:
                raise _reject(
                    key,
                    array.fmt,
                    "stored-chunk-invalid",
                    f"stored chunk /{chunk_key} is not valid under this metadata: {exc.message}",
                ) from exc

    def _check_edges(self, key: str, folder: str, old: ArrayNode, new: ArrayNode) -> None:
        """A resize keeps every stored chunk valid: re-check the chunks on the old edge (an N5
        end block written clipped becomes an interior block when the array grows)."""
        edges = [
            g - 1 if s % c else -1 for g, s, c in zip(old.grid, old.shape, old.chunks, strict=True)
        ]
        self._check_existing_chunks(
            key,
            folder,
            new,
            lambda position: (
                any(p == e for p, e in zip(position, edges, strict=False)) and new.in_grid(position)
            ),
        )
