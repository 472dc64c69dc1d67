"""Which format lives in each folder of a store: TensorStore's "auto" algorithm, extended.

Single-file step: a source that names an object is probed by its trailing bytes (a zip's
end-of-central-directory record) and becomes a base store for the zip adapter. Directory step:
every format declares the relative names it probes; a folder's probes are fetched at once
(in parallel on S3) and every format is asked. Unlike TensorStore, groups are detected too, and
every folder of a hierarchy knows whether it is a group, an array, a chunk folder of an array,
or plain. Results are cached until a metadata key under the folder changes (``invalidate``).

Where the owner keeps folder listings (the gateway), it hands the detector ``listed``: the
files a fresh listing of a folder holds (:class:`Listed`), and the bytes it already holds of
them. Only the probe names listed and not held are fetched (on S3 a folder without metadata
then costs no request, not five GETs), and the answer expires when
that listing would (:meth:`~n5fs.singleflight.LoadingCache.cap`): another writer's new
metadata is seen no later than through the listing itself. The owner patches or drops a
listing before it invalidates the detector for a change of its own (a detection that began
in between is grounded by the invalidation; one that begins after sees the patched listing).
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from n5fs.errors import DetectionFailed, InvalidSource, Rejected
from n5fs.formats.base import ArrayNode, Format, GroupNode, Node, chunk_like
from n5fs.formats.registry import FORMATS, METADATA_NAMES, PROBE_NAMES, get_format
from n5fs.kvstore.base import ByteRange, KvStore
from n5fs.kvstore.keys import basename, dir_prefix, folder_of, parent, split_path
from n5fs.kvstore.registry import open_spec
from n5fs.kvstore.spec import StoreSpec, ZipSpec, parse_spec
from n5fs.locking import LEAF, ranked_lock
from n5fs.singleflight import LoadingCache

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Iterator, Mapping

log = logging.getLogger(__name__)

#: the end-of-central-directory record is 22 bytes plus a comment of up to 64 KiB
ZIP_TAIL = 65_535 + 22
_EOCD = b"PK\x05\x06"


@dataclass(frozen=True)
class Listed:
    """What the owner's fresh listing of a folder says (``Detector(listed=...)``): the names
    of the files it holds, the time (on the detector's clock) until which it is fresh, and
    the bytes the owner already holds of some of them at the version listed."""

    files: Container[str]
    until: float
    held: Mapping[str, bytes] = field(default_factory=dict)


class FolderKind(enum.Enum):
    GROUP = "group"
    ARRAY = "array"
    CHUNKS = "chunks"
    PLAIN = "plain"


@dataclass(frozen=True)
class Folder:
    """What one folder (``""`` or ``"a/b/"``) is.

    ``node`` is the parsed metadata (None for an implicit group, e.g. an N5 folder without
    ``attributes.json``); ``array_prefix`` names the owning array of a CHUNKS folder.
    """

    prefix: str
    kind: FolderKind
    fmt: str | None = None
    node: Node | None = None
    array_prefix: str | None = None

    @property
    def array(self) -> ArrayNode | None:
        return self.node if isinstance(self.node, ArrayNode) else None

    @property
    def format(self) -> Format | None:
        return get_format(self.fmt) if self.fmt else None


# -- single-file step ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenedSource:
    """An opened source: the spec actually used, its store, and the container it came in."""

    spec: StoreSpec
    store: KvStore
    container: str | None = None


def looks_like_zip(tail: bytes) -> bool:
    """Does this object tail hold an end-of-central-directory record?"""
    return _EOCD in tail


def open_source(source: object, *, read_only: bool = False) -> OpenedSource:
    """Open a source; a source naming a zip object becomes the zip adapter over it."""
    spec = parse_spec(source)
    container = "zip" if isinstance(spec, ZipSpec) else None
    if container is None and spec.path and not spec.path.endswith("/"):
        spec, container = _single_file_step(spec)
    store = open_spec(spec)
    if read_only:
        from n5fs.kvstore.wrappers import ReadOnlyStore

        store = ReadOnlyStore(store)
    return OpenedSource(spec, store, container)


def _single_file_step(spec: StoreSpec) -> tuple[StoreSpec, str | None]:
    head, leaf = split_path(spec.path)
    if not leaf:
        return spec, None
    with open_spec(spec.with_path(head)) as holder:
        if holder.stat(leaf) is None:
            return spec, None  # not an object: a folder (prefix), detected below
        tail = holder.get(leaf, ByteRange(-ZIP_TAIL)) or b""
    if looks_like_zip(tail):
        return ZipSpec(base=spec), "zip"
    raise InvalidSource(
        f"{spec.to_url()} is a single object, not a folder, and not a zip archive "
        "(no end-of-central-directory record in its last 64 KiB)"
    )


# -- directory step ------------------------------------------------------------------------------


def candidates(probes: Mapping[str, bytes]) -> list[Format]:
    """Formats whose probes match; a refining format (hdmf-zarr) hides the one it refines."""
    found = [fmt for fmt in FORMATS if fmt.matches(probes)]
    refined = {fmt.refines for fmt in found if fmt.refines}
    return [fmt for fmt in found if fmt.name not in refined]


def _refined_by(fmt: Format, context: Format | None) -> Format:
    """Inside a hierarchy of a format that refines ``fmt`` (hdmf-zarr over Zarr v2), a folder
    without the refining marks of its own still belongs to the refined hierarchy."""
    if context is not None and context.refines == fmt.name:
        return context
    return fmt


def _ambiguous(prefix: str, found: list[Format], probes: Mapping[str, bytes]) -> DetectionFailed:
    names = ", ".join(
        f"{f.name} ({', '.join(sorted(f.probe_names & probes.keys()))})" for f in found
    )
    where = prefix or "the root"
    return DetectionFailed(f"{where}: several formats match: {names}; remove the stray metadata")


class Detector:
    """Folder kinds of one store, cached; ``invalidate`` after every metadata change.

    ``ttl`` (seconds, None = forever) bounds how long an answer may be stale when someone
    else writes the store; ``clock`` is injectable so tests never sleep. ``listed(prefix)``,
    where given: what a fresh listing of the folder says (:class:`Listed`), or None when no
    fresh one is cached; it must never send a request (module docstring).

    Concurrency: the folders :meth:`forget` sends to the store are a table under ``_lock``
    (a leaf lock, held for one table operation); a folder leaves it once a detection probed
    the store and no ``forget`` of it came meanwhile. The answers live in a
    :class:`~n5fs.singleflight.LoadingCache`, so threads that
    ask about one folder share one detection, a detection that began before an
    ``invalidate`` of its folder is never stored (a folder cached as plain after its array was
    created would let chunks in unvalidated), and failed detections (format clash, broken
    metadata) are cached as negative entries until the folder's metadata changes.
    """

    def __init__(
        self,
        store: KvStore,
        *,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        listed: Callable[[str], Listed | None] | None = None,
    ) -> None:
        self.store = store
        self._listed = listed
        #: folders whose next detection probes the store, not the listings (:meth:`forget`),
        #: each with the number of the ``forget`` that asked
        self._from_store: dict[str, int] = {}
        self._asked = 0
        self._lock = ranked_lock("detection: folders to probe", LEAF)
        self._cache: LoadingCache[Folder] = LoadingCache(
            ttl, clock=clock, negative=(DetectionFailed, Rejected)
        )

    def folder(self, prefix: str) -> Folder:
        """What the folder at ``prefix`` is. Raises DetectionFailed when formats clash and
        Rejected when its metadata is invalid."""
        prefix = dir_prefix(prefix)
        return self._cache.load(prefix, lambda: self._detect(prefix))

    def _detect(self, prefix: str) -> Folder:
        above = self.folder(parent(prefix.rstrip("/"))) if prefix else None
        if above is not None and above.kind in (FolderKind.ARRAY, FolderKind.CHUNKS):
            owner = above.array_prefix if above.kind is FolderKind.CHUNKS else above.prefix
            return Folder(prefix, FolderKind.CHUNKS, above.fmt, array_prefix=owner)
        probes = self._detection_probes(prefix)
        found = candidates(probes)
        if len(found) > 1:
            raise _ambiguous(prefix, found, probes)
        context = above.format if above is not None else None
        if found:
            fmt = _refined_by(found[0], context)
        elif context is not None and context.implicit_groups:
            fmt = context  # N5: every folder of the hierarchy is a group
        else:
            return Folder(prefix, FolderKind.PLAIN)
        # A metadata file that is there but does not parse makes the folder an invalid node
        # (Rejected, cached as a negative entry), never "no array here".
        fmt.check_folder(frozenset(probes), path=prefix)
        node = fmt.node_from_probes(probes, path=prefix)
        if isinstance(node, ArrayNode):
            return Folder(prefix, FolderKind.ARRAY, fmt.name, node)
        return Folder(
            prefix, FolderKind.GROUP, fmt.name, node if isinstance(node, GroupNode) else None
        )

    def probe(self, prefix: str) -> dict[str, bytes]:
        """The probe files present in the folder, fetched from the store in one batch (what
        a commit validates against: never a listing's guess)."""
        return self._fetch(prefix, sorted(PROBE_NAMES))

    def _fetch(self, prefix: str, names: list[str]) -> dict[str, bytes]:
        if not names:
            return {}
        got = self.store.get_many([prefix + name for name in names])
        return {name: value for name in names if (value := got.get(prefix + name)) is not None}

    def _detection_probes(self, prefix: str) -> dict[str, bytes]:
        """The probes a detection of ``prefix`` goes by: those a fresh listing holds (their
        bytes from the owner where it holds them), the answer then capped to expire with
        that listing; all of them from the store where no listing is known, or where
        :meth:`forget` asked for the store."""
        with self._lock:
            asked = self._from_store.get(prefix)
        if asked is not None:  # kept until a store probe that no later forget overtook
            probes = self.probe(prefix)
            with self._lock:
                if self._from_store.get(prefix) == asked:
                    del self._from_store[prefix]
            return probes
        known = None if self._listed is None else self._listed(prefix)
        if known is None:
            return self.probe(prefix)
        self._cache.cap(prefix, known.until)
        listed = [name for name in sorted(PROBE_NAMES) if name in known.files]
        held = {name: known.held[name] for name in listed if name in known.held}
        fetched = self._fetch(prefix, [name for name in listed if name not in held])
        return {name: probes[name] for probes in (held, fetched) for name in probes}

    def owner(self, key: str) -> Folder:
        """The folder that gives ``key`` its meaning (its array for a chunk key)."""
        folder = self.folder(parent(key))
        if folder.kind is FolderKind.CHUNKS and folder.array_prefix is not None:
            return self.folder(folder.array_prefix)
        return folder

    def invalidate(self, key: str) -> int:
        """Forget answers a change of ``key`` could alter; returns how many were dropped.

        Only metadata names matter: the folder holding one and every folder below it (their
        kind derives from it). Other keys change nothing detection knows.
        """
        if basename(key) not in METADATA_NAMES:
            return 0
        folder = folder_of(key)
        return self._cache.invalidate_prefix(folder)

    def plain_above(self, key: str) -> list[str]:
        """The folders above ``key`` that this cache answers "plain" and below which ``key``
        is chunk-shaped (its path relative to the folder is indices only): the folders that
        would hold ``key`` as a chunk had another writer made them arrays meanwhile."""
        out = []
        prefix = parent(key)
        while True:
            folder = dir_prefix(prefix)
            if not chunk_like(key[len(folder) :]):
                break
            cached = self._cache.get(folder)
            if cached is not None and cached.kind is FolderKind.PLAIN:
                out.append(folder)
            if not prefix:
                break
            prefix = parent(prefix)
        return out

    def forget(self, folders: Iterable[str]) -> None:
        """Drop the cached answers of exactly ``folders``: each is detected afresh next time,
        by probes of the store (not by the owner's listings, which may be as old as the
        answer: a commit asks this when the answer may be stale)."""
        for folder in folders:
            with self._lock:
                self._asked += 1
                self._from_store[dir_prefix(folder)] = self._asked
            self._cache.invalidate(folder)

    def clear(self) -> None:
        self._cache.clear()

    def walk(
        self, prefix: str = "", *, on_error: Callable[[str, Exception], None] | None = None
    ) -> Iterator[Folder]:
        """Every group, array and plain folder from ``prefix`` down (not into chunk folders).

        A folder whose detection fails is reported to ``on_error`` (or raises) and skipped.
        """
        try:
            folder = self.folder(prefix)
        except (DetectionFailed, Rejected) as exc:
            if on_error is None:
                raise
            on_error(prefix, exc)
            return
        yield folder
        if folder.kind is FolderKind.ARRAY:
            return
        for sub in self.store.list(dir_prefix(prefix)).prefixes:
            yield from self.walk(sub, on_error=on_error)


def node_spec(source: StoreSpec, folder: Folder) -> dict[str, Any]:
    """The TensorStore spec that opens the array in ``folder``."""
    assert folder.format is not None
    base = source.path
    joined = base + ("/" if base and not base.endswith("/") else "") + folder.prefix
    return {
        "driver": folder.format.tensorstore_driver,
        "kvstore": source.with_path(joined).to_json(),
    }
