"""The fsck of chunked array stores: every metadata file and every chunk, checked in parallel.

Chunks go to the workers in batches: a batch is one ``store.get_many`` (a network store runs it
on its own pool, so many requests are in flight per worker) followed by the checks, and the
cost of a future, a lock and a thread wake-up is paid per batch, not per chunk: for 16x16
chunks on a local disk that overhead was most of the time (scripts/bench_validate.py --store).

Memory stays bounded: chunk bytes are fetched inside the workers, and a running batch holds at
most :data:`BATCH_BYTES` of them (or one larger chunk), so ``jobs`` batches hold bytes at any
time; at most ``jobs`` more wait, as keys. Only the listing grows with the store (one small
record per chunk, so the progress bar knows the total). Keys that are neither metadata nor
chunks (README files, temp files of writers) are counted, not judged. A store fault on one key
is reported as skipped, not fatal.

What each key is comes from :mod:`n5fs.classify`, the classifier the mount's commits use, so
``validate`` and the mount give one verdict per key: a key the mount would refuse is reported
here, and a key it would store unjudged is counted as other. Consolidated documents are checked
against the metadata stored below them (``stale-consolidated``).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from n5fs.classify import Classifier, Verdict
from n5fs.detect import Detector, Folder, FolderKind
from n5fs.errors import N5fsError, Rejected
from n5fs.formats.base import ArrayNode, KeyKind
from n5fs.formats.registry import CONSOLIDATIONS
from n5fs.kvstore.spec import ZipSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from n5fs.kvstore.base import KeyInfo, KvStore
    from n5fs.kvstore.spec import StoreSpec
    from n5fs.kvstore.tempnames import Leftover

#: a batch stops growing at this many stored bytes (or at one chunk, if that is larger): the
#: per-batch overhead only matters for small chunks, and each worker holds one batch's bytes
BATCH_BYTES = 4 << 20
#: ... or at this many chunks
BATCH_CHUNKS = 256
#: drivers whose reads are local; every other driver (s3, plugins) pays a round trip per read
LOCAL_DRIVERS = frozenset({"file", "memory"})
#: workers per CPU on a remote store (at least :data:`REMOTE_JOBS_MIN`): they mostly wait
REMOTE_JOBS_PER_CPU = 2
REMOTE_JOBS_MIN = 8


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
    #: what interrupted writers left (temp files, uploads): reported, not judged invalid
    leftovers: list[Leftover] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.invalid

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": {"metadata": self.metadata, "chunks": self.chunks, "other": self.other},
            "invalid": [f.to_json() for f in sorted(self.invalid, key=lambda f: f.key)],
            "skipped": [f.to_json() for f in sorted(self.skipped, key=lambda f: f.key)],
            "leftovers": [
                {
                    "path": left.path,
                    "what": left.what,
                    "size": left.size,
                    "writer": left.writer,
                    "writer_gone": left.dead,
                }
                for left in self.leftovers
            ],
        }


@dataclass(frozen=True, slots=True)
class ChunkJob:
    """One listed chunk: the array that judges it, its key, grid position and stored size."""

    array: ArrayNode
    key: str
    position: tuple[int, ...]
    size: int


def is_remote(spec: StoreSpec) -> bool:
    """Does every read cross a network? A zip archive is as remote as the store holding it."""
    while isinstance(spec, ZipSpec) and spec.base is not None:
        spec = spec.base
    return spec.driver not in LOCAL_DRIVERS


def default_jobs(store: KvStore) -> int:
    """CPUs for a local store (the work is decoding); more for a remote one, whose workers
    mostly wait (a zip's reads, unlike S3's ``get_many``, are one round trip after another)."""
    cpus = os.cpu_count() or 1
    if is_remote(store.spec):
        return max(REMOTE_JOBS_MIN, REMOTE_JOBS_PER_CPU * cpus)
    return cpus


def batches(jobs: deque[ChunkJob], workers: int) -> Iterator[list[ChunkJob]]:
    """Consume ``jobs`` as runs of neighbouring chunks, small enough that every worker gets
    several batches (a few large chunks must still spread over all workers)."""
    most = max(1, min(BATCH_CHUNKS, len(jobs) // (4 * workers)))
    batch: list[ChunkJob] = []
    size = 0
    while jobs:
        job = jobs.popleft()
        if batch and (len(batch) >= most or size + job.size > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(job)
        size += job.size
    if batch:
        yield batch


def _finding(key: str, exc: Exception) -> Finding:
    if isinstance(exc, Rejected):
        return Finding(key, exc.rule or "invalid", exc.message)
    return Finding(key, type(exc).__name__, str(exc))


class Validator:
    """Checks one store. ``progress`` is updated as work proceeds, from worker threads.

    ``jobs`` is the number of worker threads (default: :func:`default_jobs`).
    """

    def __init__(self, store: KvStore, *, jobs: int | None = None) -> None:
        self.store = store
        self.detector = Detector(store)
        self.classifier = Classifier(self.detector)
        #: parsed metadata documents by key: what consolidated documents are checked against
        self._documents: dict[str, Any] = {}
        self.jobs = max(1, jobs or default_jobs(store))
        self.progress = Progress()
        self.report = Report()
        self._lock = threading.Lock()

    def run(self, prefix: str = "") -> Report:
        chunk_jobs: deque[ChunkJob] = deque()
        for folder in self.detector.walk(prefix, on_error=self._folder_failed):
            self._check_folder(folder, chunk_jobs)
        self._check_consolidated()
        self.progress.total_chunks = len(chunk_jobs)
        self.progress.listing_done = True
        self._check_chunks(chunk_jobs)
        self._find_leftovers(prefix)
        return self.report

    def _find_leftovers(self, prefix: str) -> None:
        try:
            self.report.leftovers = list(self.store.leftovers(prefix))
        except N5fsError as exc:
            self.report.skipped.append(Finding(prefix or "<root>", "leftovers", str(exc)))

    # -- folders and metadata ----------------------------------------------------------------

    def _folder_failed(self, prefix: str, exc: Exception) -> None:
        # The folder's own metadata is broken (or formats clash): report it, keep walking.
        key = getattr(exc, "path", "") or prefix or "<root>"
        with self._lock:
            self.report.invalid.append(_finding(key, exc))

    def _check_folder(self, folder: Folder, chunk_jobs: deque[ChunkJob]) -> None:
        # An array's chunks may sit in sub-folders (N5, "/" separators): list it all, once.
        delimiter = None if folder.kind is FolderKind.ARRAY else "/"
        for info in self.store.list(folder.prefix, delimiter=delimiter).keys:
            self._classify(info, chunk_jobs)

    def _classify(self, info: KeyInfo, chunk_jobs: deque[ChunkJob]) -> None:
        verdict = self.classifier.classify(info.key, lambda: self._fetch(info.key))
        if verdict.kind is KeyKind.CHUNK:
            assert verdict.array is not None
            assert verdict.position is not None
            chunk_jobs.append(ChunkJob(verdict.array, info.key, verdict.position, info.size))
        elif verdict.kind is KeyKind.METADATA:
            self._check_metadata(verdict)
        elif verdict.kind is KeyKind.INVALID:
            self.report.invalid.append(Finding(info.key, verdict.rule, verdict.message))
        else:
            self.report.other += 1

    def _check_metadata(self, verdict: Verdict) -> None:
        self.report.metadata += 1
        try:
            node = self.classifier.check(verdict, self._fetch(verdict.key))
        except Rejected as exc:
            self.report.invalid.append(_finding(verdict.key, exc))
        except N5fsError as exc:
            self.report.skipped.append(_finding(verdict.key, exc))
        else:
            if node is not None:
                self._documents[verdict.key] = node.raw

    def _check_consolidated(self) -> None:
        """Every consolidated document against the metadata stored below it."""
        for doc_key, doc in sorted(self._documents.items()):
            folder = doc_key.rpartition("/")[0]
            below = {
                key[len(folder) + 1 if folder else 0 :]: value
                for key, value in self._documents.items()
                if not folder or key.startswith(folder + "/")
            }
            for consolidation in CONSOLIDATIONS:
                stale = consolidation.stale_entries(doc_key, doc, below)
                if stale:
                    self.report.invalid.append(
                        Finding(
                            doc_key,
                            "stale-consolidated",
                            "consolidated metadata disagrees with the stored metadata: "
                            + "; ".join(stale[:5])
                            + (f"; and {len(stale) - 5} more" if len(stale) > 5 else ""),
                        )
                    )

    def _fetch(self, key: str) -> bytes:
        data = self.store.get(key)
        if data is None:
            raise N5fsError("vanished while validating")
        return data

    # -- chunks --------------------------------------------------------------------------------

    def _check_chunks(self, jobs: deque[ChunkJob]) -> None:
        if not jobs:
            return
        with ThreadPoolExecutor(self.jobs, thread_name_prefix="n5fs-validate") as pool:
            pending: set[Future[None]] = set()
            for batch in batches(jobs, self.jobs):
                if len(pending) >= 2 * self.jobs:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()
                pending.add(pool.submit(self._check_batch, batch))
            for future in pending:
                future.result()

    def _check_batch(self, batch: list[ChunkJob]) -> None:
        fetched = self._fetch_batch([job.key for job in batch])
        invalid: list[Finding] = []
        skipped: list[Finding] = []
        for job in batch:
            verdict = _judge(job, fetched.pop(job.key))
            if verdict is not None:
                (skipped if verdict.skipped else invalid).append(verdict.finding)
        with self._lock:
            self.report.chunks += len(batch)
            self.report.invalid += invalid
            self.report.skipped += skipped
            self.progress.done_chunks += len(batch)
            self.progress.done_bytes += sum(job.size for job in batch)

    def _fetch_batch(self, keys: list[str]) -> dict[str, bytes | N5fsError]:
        """One ``get_many``; if it fails (one key's fault fails them all), each key alone, so
        only the faulty key is skipped."""
        try:
            got = self.store.get_many(keys)
            return {key: _present(got.get(key)) for key in keys}
        except N5fsError:
            return {key: self._get_alone(key) for key in keys}

    def _get_alone(self, key: str) -> bytes | N5fsError:
        try:
            return _present(self.store.get(key))
        except N5fsError as exc:
            return exc


def _present(data: bytes | None) -> bytes | N5fsError:
    return N5fsError("vanished while validating") if data is None else data


@dataclass(frozen=True, slots=True)
class ChunkVerdict:
    finding: Finding
    #: the chunk could not be judged (store fault), as opposed to judged invalid
    skipped: bool


def _judge(job: ChunkJob, data: bytes | N5fsError) -> ChunkVerdict | None:
    """None for a valid chunk."""
    if isinstance(data, N5fsError):
        return ChunkVerdict(_finding(job.key, data), skipped=True)
    try:
        job.array.validate_chunk(job.position, data, path=job.key)
    except Rejected as exc:
        return ChunkVerdict(_finding(job.key, exc), skipped=False)
    except N5fsError as exc:
        return ChunkVerdict(_finding(job.key, exc), skipped=True)
    return None


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

