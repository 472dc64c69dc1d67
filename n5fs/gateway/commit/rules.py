"""The commit rules: whether a key's new bytes may be stored, given the store as it is now.
Nothing here writes; the gateway stores only what :meth:`CommitRules.check` passed (strict
mode) and records what it refused.

What a key *is* comes from :mod:`n5fs.classify`, the one classifier ``n5fs validate`` uses
too, and so do the rules on the bytes alone. What only a commit needs is here: new metadata
must not clash with the folder's other metadata, and must keep every stored chunk valid (a
structural change is refused while chunks exist; metadata written after ``cp -r`` copied the
chunks validates them; a resize re-checks the chunks on the old edge).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from n5fs.classify import Classifier, Verdict
from n5fs.detect import Detector, candidates
from n5fs.errors import Rejected
from n5fs.formats.base import ArrayNode, Format, GroupNode, KeyKind, Node
from n5fs.gateway.commit.pool import OrderedPool
from n5fs.gateway.commit.streamcheck import passes
from n5fs.kvstore.keys import basename, folder_of

if TYPE_CHECKING:
    from n5fs.gateway.commit.prevalidate import Precheck
    from n5fs.kvstore.base import KvStore
    from n5fs.workers import Workers

Loader = Callable[[], bytes]
#: the threads' name of the pool that checks stored chunks under new metadata
STORED_CHUNKS_POOL = "n5fs-stored-chunks"


class Unread:
    """The stored value of a key nobody has read yet (``None`` means read: absent)."""


UNREAD = Unread()


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


def _reject(key: str, fmt: str, rule: str, message: str) -> Rejected:
    return Rejected(message, path=key, fmt=fmt, rule=rule)


def _stored_chunk_problem(
    store: KvStore,
    key: str,
    array: ArrayNode,
    chunk_key: str,
    position: tuple[int, ...],
    in_grid: bool,
    *,
    streaming: bool,
) -> Rejected | None:
    """Why the stored chunk ``chunk_key`` breaks metadata ``key`` (None: it does not)."""
    if not in_grid:
        return _reject(
            key,
            array.fmt,
            "stored-chunk-out-of-grid",
            f"stored chunk /{chunk_key} lies outside the grid "
            f"{list(array.grid)} this metadata declares",
        )
    data = store.get(chunk_key)
    if data is None or (streaming and passes(array, position, data)):
        return None
    try:
        array.validate_chunk(position, data, path=chunk_key)
    except Rejected as exc:
        problem = _reject(
            key,
            array.fmt,
            "stored-chunk-invalid",
            f"stored chunk /{chunk_key} is not valid under this metadata: {exc.message}",
        )
        problem.__cause__ = exc
        return problem
    return None


class CommitRules:
    """Classify and validate one key's new content against the store as it is now."""

    def __init__(self, store: KvStore, detector: Detector, workers: Workers) -> None:
        self.store = store
        self.detector = detector
        self.classifier = Classifier(detector)
        self._pool = OrderedPool(workers.pool(STORED_CHUNKS_POOL, min(4, os.cpu_count() or 1)))
        #: accept a chunk in its plain case with the streaming decoders before the full
        #: check (:func:`~n5fs.gateway.commit.prevalidate.passes`: same verdict, less work)
        self.streaming = True

    # -- entry point -------------------------------------------------------------------------

    def check(
        self,
        key: str,
        load: Loader,
        *,
        pre: Precheck | None = None,
        size: int | None = None,
        stored: bytes | Unread | None = UNREAD,
    ) -> Verdict:
        """Raise Rejected unless ``load()`` may be stored at ``key``; say what the key is.

        ``load`` is called only when the bytes matter (metadata, chunks): other keys, which
        may be large files, are never read. A chunk of ``size`` bytes that a check passed
        while it was written (``pre``, :mod:`n5fs.gateway.commit.prevalidate`) is not decoded again
        when that check was made for what the key is now. ``stored`` is the key's stored value
        where the caller has read it already (a compare-and-swap commit validates against
        the version it will replace); else it comes with the folder's probe batch.

        A chunk-shaped key in a folder the detection cache calls plain is judged again with
        those folders probed afresh (one probe batch each): another mount of the store may
        have created the array after this one cached the folder, and the cache must not
        decide that a chunk goes in unvalidated.
        """
        stale = self.detector.plain_above(key)
        verdict = self.classifier.classify(key, load)
        if stale and verdict.kind is KeyKind.OTHER:
            # A chunk-shaped name in a folder this mount believes plain: another mount may
            # have made it an array since. Ask the store, never let a chunk in unchecked.
            self.detector.forget(stale)
            verdict = self.classifier.classify(key, load)
        if verdict.kind is KeyKind.METADATA:
            assert verdict.fmt is not None
            data = load()
            node = self.classifier.check(verdict, data)
            assert node is not None
            self._check_context(verdict.fmt, key, data, node, stored)
        elif verdict.kind is KeyKind.CHUNK:
            if pre is None or size is None or not pre.holds_for(verdict, size):
                self._check_chunk(verdict, load())
        elif verdict.kind is KeyKind.INVALID:
            raise verdict.refusal()
        return verdict

    def _check_chunk(self, verdict: Verdict, data: bytes) -> None:
        if not (self.streaming and passes(verdict.array, verdict.position, data)):
            self.classifier.check(verdict, data)

    # -- metadata ----------------------------------------------------------------------------

    def _check_context(
        self, fmt: Format, key: str, data: bytes, node: Node, stored: bytes | Unread | None
    ) -> None:
        name, folder = basename(key), folder_of(key)
        probes = self.detector.probe(folder)  # the stored value of a node's document too
        if isinstance(stored, Unread):
            stored = probes.get(name)
        self._check_clash(fmt, key, name, folder, data, probes)
        if isinstance(node, (ArrayNode, GroupNode)):  # defines the node (not attributes only)
            old = self._stored_node(fmt, key, name, stored)
            self._check_against_chunks(fmt, key, folder, old, node)

    def _check_clash(
        self, fmt: Format, key: str, name: str, folder: str, data: bytes, probes: dict[str, bytes]
    ) -> None:
        probes = {**probes, name: data}
        found = candidates(probes)
        if len(found) > 1:
            others = ", ".join(f.name for f in found if f.name != fmt.name)
            raise _reject(
                key,
                fmt.name,
                "format-clash",
                f"/{folder} already holds {others} metadata; one folder, one format",
            )
        fmt.check_folder(frozenset(probes), path=key)

    def _stored_node(self, fmt: Format, key: str, name: str, data: bytes | None) -> Node | None:
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
        be valid under the new metadata. They are fetched and decoded on a few threads (the
        decoders release the GIL; ``cp -r`` of an array whose metadata came last waits for
        this); the first problem in listing order is the one reported, as one by one."""
        stored = [c for c in self._chunk_keys(folder, array) if wanted(c[1])]
        streaming = self.streaming
        problems = self._pool.ordered(
            lambda c: _stored_chunk_problem(self.store, key, array, *c, streaming=streaming),
            stored,
        )
        with contextlib.closing(problems):  # the first problem stops the rest
            for problem in problems:
                if problem is not None:
                    raise problem

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
