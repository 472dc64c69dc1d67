"""The fsck of chunked array stores: every metadata file and every chunk, checked in parallel.

Memory stays bounded: chunk bytes are fetched inside the workers and at most ``2 * jobs``
chunks are in flight. Keys that are neither metadata nor chunks (README files, temp files of
writers) are counted, not judged. A store fault on one key is reported as skipped, not fatal.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from n5fs.detect import Detector, Folder, FolderKind
from n5fs.errors import N5fsError, Rejected
from n5fs.formats.base import ArrayNode, KeyKind
from n5fs.formats.registry import METADATA_NAMES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from n5fs.kvstore.base import KeyInfo, KvStore


@dataclass(frozen=True)
class Finding:
    key: str
    rule: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "rule": self.rule, "message": self.message}


@dataclass
class Progress:
    """Counters the caller may read at any time (a progress bar polls them)."""

    total_chunks: int = 0
    done_chunks: int = 0
    done_bytes: int = 0
    listing_done: bool = False


@dataclass
class Report:
    metadata: int = 0
    chunks: int = 0
    other: int = 0
    invalid: list[Finding] = field(default_factory=list)
    skipped: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.invalid

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": {"metadata": self.metadata, "chunks": self.chunks, "other": self.other},
            "invalid": [f.to_json() for f in sorted(self.invalid, key=lambda f: f.key)],
            "skipped": [f.to_json() for f in sorted(self.skipped, key=lambda f: f.key)],
        }


def _finding(key: str, exc: Exception) -> Finding:
    if isinstance(exc, Rejected):
        return Finding(key, exc.rule or "invalid", exc.message)
    return Finding(key, type(exc).__name__, str(exc))


class Validator:
    """Checks one store. ``progress`` is updated as work proceeds, from worker threads."""

    def __init__(self, store: KvStore, *, jobs: int | None = None) -> None:
        self.store = store
        self.detector = Detector(store)
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.progress = Progress()
        self.report = Report()
        self._lock = threading.Lock()

    def run(self, prefix: str = "") -> Report:
        chunk_jobs: deque[tuple[ArrayNode, str, KeyInfo]] = deque()
        for folder in self.detector.walk(prefix, on_error=self._folder_failed):
            self._check_folder(folder, chunk_jobs)
        self.progress.total_chunks = len(chunk_jobs)
        self.progress.listing_done = True
        self._check_chunks(chunk_jobs)
        return self.report

    # -- folders and metadata ----------------------------------------------------------------

    def _folder_failed(self, prefix: str, exc: Exception) -> None:
        # The folder's own metadata is broken (or formats clash): report it, keep walking.
        key = getattr(exc, "path", "") or prefix or "<root>"
        with self._lock:
            self.report.invalid.append(_finding(key, exc))

    def _check_folder(
        self, folder: Folder, chunk_jobs: deque[tuple[ArrayNode, str, KeyInfo]]
    ) -> None:
        listing = self.store.list(folder.prefix)
        keys = list(listing.keys)
        if folder.kind is FolderKind.ARRAY:
            keys = list(self.store.list(folder.prefix, delimiter=None).keys)
        for info in keys:
            self._classify(folder, info, chunk_jobs)

    def _classify(
        self, folder: Folder, info: KeyInfo, chunk_jobs: deque[tuple[ArrayNode, str, KeyInfo]]
    ) -> None:
        rel = info.key[len(folder.prefix) :]
        array = folder.array
        if array is not None:
            what = array.classify(rel)
            if what.kind is KeyKind.CHUNK:
                if not what.in_grid:
                    self.report.invalid.append(
                        Finding(
                            info.key,
                            "out-of-grid",
                            f"chunk key {rel!r} lies outside the grid {list(array.grid)}",
                        )
                    )
                else:
                    chunk_jobs.append((array, rel, info))
                return
            if what.kind is KeyKind.METADATA:
                self._check_metadata(folder, info)
                return
            self.report.other += 1
            return
        if "/" not in rel and rel in METADATA_NAMES and folder.format is not None:
            self._check_metadata(folder, info)
        else:
            self.report.other += 1

    def _check_metadata(self, folder: Folder, info: KeyInfo) -> None:
        fmt = folder.format
        assert fmt is not None
        self.report.metadata += 1
        rel = info.key[len(folder.prefix) :]
        try:
            data = self._fetch(info.key)
            fmt.parse_metadata(rel, data, path=info.key)
        except Rejected as exc:
            self.report.invalid.append(_finding(info.key, exc))
        except N5fsError as exc:
            self.report.skipped.append(_finding(info.key, exc))

    def _fetch(self, key: str) -> bytes:
        data = self.store.get(key)
        if data is None:
            raise N5fsError("vanished while validating")
        return data

    # -- chunks --------------------------------------------------------------------------------

    def _check_chunks(self, jobs: deque[tuple[ArrayNode, str, KeyInfo]]) -> None:
        if not jobs:
            return
        with ThreadPoolExecutor(self.jobs, thread_name_prefix="n5fs-validate") as pool:
            pending: set[Future[None]] = set()
            while jobs or pending:
                while jobs and len(pending) < 2 * self.jobs:
                    pending.add(pool.submit(self._check_chunk, *jobs.popleft()))
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()

    def _check_chunk(self, array: ArrayNode, rel: str, info: KeyInfo) -> None:
        finding: Finding | None = None
        skipped = False
        try:
            data = self._fetch(info.key)
            position = array.classify(rel).position
            assert position is not None
            array.validate_chunk(position, data, path=info.key)
        except Rejected as exc:
            finding = _finding(info.key, exc)
        except N5fsError as exc:
            finding, skipped = _finding(info.key, exc), True
        with self._lock:
            self.report.chunks += 1
            self.progress.done_chunks += 1
            self.progress.done_bytes += info.size
            if finding is not None:
                (self.report.skipped if skipped else self.report.invalid).append(finding)


def validate_store(
    store: KvStore,
    prefix: str = "",
    *,
    jobs: int | None = None,
    on_start: Callable[[Validator], None] | None = None,
) -> Report:
    """Validate everything under ``prefix``; ``on_start`` gets the validator (for progress)."""
    validator = Validator(store, jobs=jobs)
    if on_start is not None:
        on_start(validator)
    return validator.run(prefix)


def iter_arrays(detector: Detector, prefix: str = "") -> Iterator[Folder]:
    yield from (f for f in detector.walk(prefix) if f.kind is FolderKind.ARRAY)
