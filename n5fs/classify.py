"""What a key is: the one answer that both the commit path and ``n5fs validate`` use.

``classify(key)`` says whether a key is metadata of a format, a chunk of an array at a grid
position, an ordinary file, or a name the format forbids where it stands (with the rule);
``check(verdict, data)`` then says whether given bytes may be that. Before this module the
mount and the fsck each decided "what is this key" on their own and disagreed (an
``attributes.json`` inside a Zarr folder was "other" to one and "invalid" to the other).

How a key is judged, in order:

1. A metadata name (one some format declares) is metadata of the format that *claims* it in
   this folder's context (:meth:`~n5fs.formats.base.Format.claims`; a refining format such as
   hdmf-zarr wins over the one it refines). Metadata inside an array's chunk folder, and a
   node whose folder name the format forbids (Zarr v3's reserved names), are INVALID.
2. Below an array, the array's key grammar decides: CHUNK inside the grid, INVALID outside it
   or when the key looks like a chunk key but breaks the grammar, else OTHER (temp files of
   real writers, READMEs).
3. Under a folder whose own metadata is broken, a chunk-like name is INVALID: no grammar can
   judge it, and storing it unvalidated would break the strict-mode invariant.
4. Everything else is OTHER and stored as it is.

Nothing here writes or caches; the detector it asks owns the cached folder answers (see
:mod:`n5fs.detect` for their lock discipline), so a Classifier is safe on any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.detect import Detector, Folder, FolderKind
from n5fs.errors import DetectionFailed, Rejected
from n5fs.formats.base import ArrayNode, Format, KeyKind, Node, chunk_like
from n5fs.formats.registry import FORMATS, METADATA_NAMES
from n5fs.kvstore.keys import basename, folder_of

if TYPE_CHECKING:
    from collections.abc import Callable

#: metadata larger than this is refused before parsing (a JSON document, not a data file)
MAX_METADATA_BYTES = 64 << 20
#: folders whose keys the array's key grammar judges
_BELOW_ARRAY = (FolderKind.ARRAY, FolderKind.CHUNKS)


@dataclass(frozen=True)
class Verdict:
    """What ``key`` is. ``folder``: for METADATA the folder holding it (None when that
    folder's own detection failed), for CHUNK the array's folder. INVALID carries the rule."""

    key: str
    kind: KeyKind
    fmt: Format | None = None
    folder: Folder | None = None
    position: tuple[int, ...] | None = None
    rule: str = ""
    message: str = ""

    @property
    def array(self) -> ArrayNode | None:
        return self.folder.array if self.folder is not None else None

    @property
    def fmt_name(self) -> str:
        return self.fmt.name if self.fmt is not None else ""

    def refusal(self) -> Rejected:
        return Rejected(self.message, path=self.key, fmt=self.fmt_name, rule=self.rule)


def _invalid(key: str, fmt: Format | None, rule: str, message: str) -> Verdict:
    return Verdict(key, KeyKind.INVALID, fmt, rule=rule, message=message)


class Classifier:
    """Classifies keys of one store against what its detector knows now."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector

    # -- what a key is -------------------------------------------------------------------------

    def classify(
        self, key: str, load: Callable[[], bytes], *, folder: Folder | None = None
    ) -> Verdict:
        """What ``key`` is. ``load`` gives the key's content; it is called only for a name whose
        format depends on it (an ``attributes.json`` outside an N5 hierarchy).

        ``folder``: the detector's answer for a folder, which a caller that walks folder by
        folder (validate) has just had; used, instead of asking the detector again, when it
        is the key's own folder. The verdict is the same either way: this saves a cache
        lookup (a lock, a clock read) per key, a quarter of the cost of classifying a chunk."""
        head, _, name = key.rpartition("/")
        # dir_prefix(head) without its check: the detector checks the prefix (same InvalidKey)
        prefix = head if not head or head.endswith("/") else head + "/"
        broken: Exception | None = None
        if folder is None or folder.prefix != prefix:
            folder, broken = self._folder(prefix)
        fmt = self.metadata_format(key, load) if name in METADATA_NAMES else None
        if fmt is not None:
            return self._metadata(key, fmt, prefix, folder)
        if folder is not None and folder.kind in _BELOW_ARRAY:
            return self._below_array(key, folder)
        if broken is not None and chunk_like(name):
            return _invalid(
                key,
                None,
                "node-invalid",
                f"/{prefix} has invalid metadata, so no chunk key can be judged there "
                f"({broken}); fix the metadata first",
            )
        return Verdict(key, KeyKind.OTHER)

    def metadata_format(self, key: str, load: Callable[[], bytes]) -> Format | None:
        """The format whose metadata ``key`` is, or None for an ordinary file."""
        name = basename(key)
        context = self.context(folder_of(key))
        claimants = [fmt for fmt in FORMATS if fmt.claims(name, context, load)]
        refined = {fmt.refines for fmt in claimants if fmt.refines}
        claimants = [fmt for fmt in claimants if fmt.name not in refined]
        if not claimants:
            return None
        return self._refinement(claimants[0], key, load) or claimants[0]

    def _refinement(self, fmt: Format, key: str, load: Callable[[], bytes]) -> Format | None:
        """A format refining ``fmt`` that the key's folder, with this content, matches.

        ``cp -r`` copies a folder's files in any order: a ``.zarray`` may arrive after the
        ``.zattrs`` whose hdmf-zarr marks make the array hdmf-zarr, in a folder that is not a
        node yet (so it gave no context). Judge it as the folder will be once it lands, as
        detection then will. A folder that already is a node gave its format as context."""
        refining = [other for other in FORMATS if other.refines == fmt.name]
        prefix = folder_of(key)
        folder, _ = self._folder(prefix)
        if not refining or (folder is not None and folder.fmt):
            return None
        probes = self.detector.probe(prefix)
        probes[basename(key)] = load()
        return next((other for other in refining if other.matches(probes)), None)

    def context(self, prefix: str) -> str | None:
        """The format of the folder, or of the nearest ancestor that has one."""
        while True:
            folder, _ = self._folder(prefix)
            if folder is not None and folder.fmt:
                return folder.fmt
            if not prefix:
                return None
            prefix = folder_of(prefix.rstrip("/"))

    def _folder(self, prefix: str) -> tuple[Folder | None, Exception | None]:
        try:
            return self.detector.folder(prefix), None
        except (DetectionFailed, Rejected) as exc:
            return None, exc  # the store is already inconsistent there

    def _metadata(self, key: str, fmt: Format, prefix: str, folder: Folder | None) -> Verdict:
        if folder is not None and folder.kind is FolderKind.CHUNKS:
            return _invalid(
                key,
                fmt,
                "metadata-in-chunks",
                f"/{prefix} is a chunk folder of the array at /{folder.array_prefix}; "
                "it cannot hold metadata",
            )
        problem = self._node_name_problem(fmt, prefix)
        if problem is not None:
            return _invalid(key, fmt, "node-name", problem)
        return Verdict(key, KeyKind.METADATA, fmt, folder)

    def _node_name_problem(self, fmt: Format, prefix: str) -> str | None:
        """Names of the folders between the nearest ancestor node of ``fmt`` and ``prefix``
        become node names when metadata lands in ``prefix``; the format may forbid some."""
        names: list[str] = []
        while prefix:
            names.append(basename(prefix.rstrip("/")))
            prefix = folder_of(prefix.rstrip("/"))
            folder, _ = self._folder(prefix)
            if folder is not None and folder.fmt == fmt.name and folder.node is not None:
                break
        else:
            return None  # no node of this format above: ``prefix`` is a root, which has no name
        for name in names:
            problem = fmt.node_name_problem(name)
            if problem is not None:
                return f"node name {name!r}: {problem}"
        return None

    def _below_array(self, key: str, folder: Folder) -> Verdict:
        owner: Folder | None = folder
        if folder.kind is FolderKind.CHUNKS and folder.array_prefix is not None:
            owner, _ = self._folder(folder.array_prefix)
        array = owner.array if owner is not None else None
        if owner is None or array is None:
            return Verdict(key, KeyKind.OTHER)
        fmt = owner.format
        what = array.classify(key[len(owner.prefix) :])
        if what.kind is KeyKind.INVALID:
            return _invalid(key, fmt, what.rule, f"{what.message} (array at /{owner.prefix})")
        if what.kind is not KeyKind.CHUNK or what.position is None:
            return Verdict(key, KeyKind.OTHER)
        if not what.in_grid:
            return _invalid(
                key,
                fmt,
                "out-of-grid",
                f"chunk position {list(what.position)} lies outside the grid "
                f"{list(array.grid)} of the array at /{owner.prefix}",
            )
        return Verdict(key, KeyKind.CHUNK, fmt, owner, what.position)

    # -- may these bytes be that ---------------------------------------------------------------

    def check(self, verdict: Verdict, data: bytes) -> Node | None:
        """Raise Rejected unless ``data`` may be stored as what ``verdict`` says; metadata
        returns its parsed node. Rules about the rest of the store (chunks already stored
        under new metadata, format clashes in one folder) are the commit's own."""
        if verdict.kind is KeyKind.INVALID:
            raise verdict.refusal()
        if verdict.kind is KeyKind.METADATA:
            assert verdict.fmt is not None
            if len(data) > MAX_METADATA_BYTES:
                raise _invalid(
                    verdict.key,
                    verdict.fmt,
                    "metadata-size",
                    f"metadata file of {len(data)} bytes exceeds {MAX_METADATA_BYTES}",
                ).refusal()
            return verdict.fmt.parse_metadata(basename(verdict.key), data, path=verdict.key)
        if verdict.kind is KeyKind.CHUNK:
            array = verdict.array
            assert array is not None
            assert verdict.position is not None
            array.validate_chunk(verdict.position, data, path=verdict.key)
        return None
