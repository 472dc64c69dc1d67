"""The fsck of chunked array stores: every metadata file and every chunk, checked in parallel.

The caller's thread walks the folders, lists each array once (flat: its chunks may sit in
sub-folders; on local files by names only, as they are scanned, :mod:`.localscan`) and
classifies every key; chunks go to :class:`~n5fs.validate.chunks.ChunkChecker` as they are
listed, so reads and decoding on the workers (threads, or processes for a large run on local
files) overlap the listing. Only counters
and findings grow with the store; chunk bytes stay within the checker's bounded window. Keys
that are neither metadata nor chunks (README files, temp files of writers) are counted, not
judged. A store fault on one key (it cannot be read, or is gone since it was listed) makes
that key ``unreadable``, not fatal and never valid: the run goes on, and its report is not
:attr:`~n5fs.validate.report.Report.ok`. A fault that stops the walk itself (a listing that
keeps failing), or a worker process that dies, ends the run with the error: nothing is
reported for keys never listed or never checked.

What each key is comes from :mod:`n5fs.classify`, the classifier the mount's commits use, so
``validate`` and the mount give one verdict per key: a key the mount would refuse is reported
here, and a key it would store unjudged is counted as other. Consolidated documents are checked
against the metadata stored below them (``stale-consolidated``).

Findings are sorted by key when the run ends (:meth:`Report.settle`): the report does not
depend on which worker finished first.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from n5fs.classify import Classifier, Verdict
from n5fs.detect import Detector, Folder, FolderKind
from n5fs.errors import N5fsError, Rejected
from n5fs.formats.base import KeyKind
from n5fs.formats.registry import CONSOLIDATIONS
from n5fs.kvstore.abilities import local_files
from n5fs.kvstore.spec import ZipSpec
from n5fs.validate.check import STORE_FAULTS, VANISHED
from n5fs.validate.chunks import PROCESSES_AFTER, UNKNOWN_SIZE, ChunkChecker, ChunkJob
from n5fs.validate.localscan import scan_keys
from n5fs.validate.report import Finding, Progress, Report, finding

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from n5fs.kvstore.base import KvStore
    from n5fs.kvstore.spec import StoreSpec

#: drivers whose reads are local; every other driver (s3, plugins) pays a round trip per read
LOCAL_DRIVERS = frozenset({"file", "memory"})
#: workers per CPU on a remote store (at least :data:`REMOTE_JOBS_MIN`): they mostly wait
REMOTE_JOBS_PER_CPU = 2
REMOTE_JOBS_MIN = 8


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


class Validator:
    """Checks one store. ``progress`` is updated as work proceeds, from worker threads.

    ``jobs`` is the number of workers (default: :func:`default_jobs`); ``processes_after``
    the number of chunks after which a store with local files goes on in worker processes
    (None: threads only; see :mod:`.chunks`). ``run`` is called once, from one thread.
    """

    def __init__(
        self,
        store: KvStore,
        *,
        jobs: int | None = None,
        processes_after: int | None = PROCESSES_AFTER,
    ) -> None:
        self.store = store
        self.processes_after = processes_after
        self.detector = Detector(store)
        self.classifier = Classifier(self.detector)
        #: parsed metadata documents by key: what consolidated documents are checked against
        self._documents: dict[str, Any] = {}
        self.jobs = max(1, jobs or default_jobs(store))
        self.progress = Progress()
        self.report = Report()

    def run(self, prefix: str = "") -> Report:
        checker = ChunkChecker(
            self.store,
            self.report,
            self.progress,
            self.jobs,
            processes_after=self.processes_after,
        )
        with checker as chunks:
            for folder in self.detector.walk(prefix, on_error=self._folder_failed):
                self._check_folder(folder, chunks)
            chunks.flush()
            self.progress.listing_done = True
            # Work of this thread that needs no chunk: done while the workers finish.
            self._check_consolidated()
            self._find_leftovers(prefix)
            chunks.finish()
        self.report.settle()
        return self.report

    def _find_leftovers(self, prefix: str) -> None:
        """Leftovers are reported, not judged; a store that cannot list them makes the
        prefix unreadable (under rule ``leftovers``): that part of the run was not done."""
        try:
            self.report.leftovers = list(self.store.leftovers(prefix))
        except STORE_FAULTS as exc:
            self.report.add(unreadable=[Finding(prefix or "<root>", "leftovers", str(exc))])

    # -- folders and metadata ----------------------------------------------------------------

    def _folder_failed(self, prefix: str, exc: Exception) -> None:
        # The folder's own metadata is broken (or formats clash): report it, keep walking.
        key = getattr(exc, "path", "") or prefix or "<root>"
        self.report.add(invalid=[finding(key, exc)])

    def _check_folder(self, folder: Folder, chunks: ChunkChecker) -> None:
        # An array's chunks may sit in sub-folders (N5, "/" separators): list it all, once,
        # page by page where the store pages (chunks are checked while the next page comes).
        if folder.kind is FolderKind.ARRAY:
            for key, size in self._walk(folder.prefix):
                self._classify(key, size, folder, chunks)
        else:
            for info in self.store.list(folder.prefix, delimiter="/").keys:
                self._classify(info.key, info.size, folder, chunks)

    def _walk(self, prefix: str) -> Iterator[tuple[str, int]]:
        """Every key below ``prefix`` with its size; on local files, names only, as they are
        scanned (:mod:`.localscan`: no ``stat`` per key, no listing held whole)."""
        local = local_files(self.store)
        directory = None if local is None else local.local_folder(prefix)
        if directory is not None:
            for key in scan_keys(self.store, directory, prefix):
                yield key, UNKNOWN_SIZE
            return
        for info in self.store.walk(prefix):
            yield info.key, info.size

    def _classify(self, key: str, size: int, folder: Folder, chunks: ChunkChecker) -> None:
        # The folder being walked is this validator's detector's answer (nothing invalidates
        # it during a run): the classifier need not look it up again for the folder's keys.
        try:
            verdict = self.classifier.classify(key, lambda: self._fetch(key), folder=folder)
        except Rejected:  # a verdict on bytes, never a fault: not reported as unreadable
            raise
        except STORE_FAULTS as exc:
            # Classifying reads the store only for a name whose format depends on its content
            # (an attributes.json outside an N5 hierarchy) or a folder not detected yet (a
            # chunk sub-folder): a fault there leaves this key unchecked, not the run ended.
            self.report.add(unreadable=[finding(key, exc)])
            return
        if verdict.kind is KeyKind.CHUNK:
            array = verdict.array  # asked once: an isinstance check against an ABC each time
            assert array is not None
            assert verdict.position is not None
            chunks.add(ChunkJob(array, key, verdict.position, size))
        elif verdict.kind is KeyKind.METADATA:
            self._check_metadata(verdict)
        elif verdict.kind is KeyKind.INVALID:
            self.report.add(invalid=[Finding(key, verdict.rule, verdict.message)])
        else:
            self.report.other += 1

    def _check_metadata(self, verdict: Verdict) -> None:
        """Counted as checked only once read; one that cannot be read is unreadable."""
        try:
            node = self.classifier.check(verdict, self._fetch(verdict.key))
        except Rejected as exc:
            self.report.metadata += 1
            self.report.add(invalid=[finding(verdict.key, exc)])
        except STORE_FAULTS as exc:
            self.report.add(unreadable=[finding(verdict.key, exc)])
        else:
            self.report.metadata += 1
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
                    message = (
                        "consolidated metadata disagrees with the stored metadata: "
                        + "; ".join(stale[:5])
                        + (f"; and {len(stale) - 5} more" if len(stale) > 5 else "")
                    )
                    self.report.add(invalid=[Finding(doc_key, "stale-consolidated", message)])

    def _fetch(self, key: str) -> bytes:
        data = self.store.get(key)
        if data is None:
            raise N5fsError(VANISHED)
        return data


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
