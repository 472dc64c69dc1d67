"""What killed writers leave in an S3 store, and how a later mount finds and removes it.

Two kinds of leftovers: incomplete multipart uploads (a writer died between
CreateMultipartUpload and its completion or abort; the upload stays in the bucket, invisible to
listings and billed) and the scratch objects of conditional-write probes that died mid-probe
(:mod:`~n5fs.kvstore.s3.conditional`). ``validate`` reports both; ``sweep`` removes those whose
writer is gone.

Why apart from :mod:`~n5fs.kvstore.s3.store`: the store sends requests; this module decides. Which
upload belongs to which writer comes from the local journals
(:class:`~n5fs.kvstore.s3.uploads.UploadJournal`), whether it may go from
:func:`~n5fs.kvstore.s3.uploads.upload_is_dead`, and a journal line of a dead writer is dropped
once its upload is gone from the server. The store hands in its requests as callables
(list objects, list uploads, abort one), so nothing here speaks boto3.

State and locks: the uploads behind each leftover reported (``_reported``: :meth:`S3Leftovers.
abort` aborts the very uploads that were listed; one leftover stands for every upload of its
key begun in the same second), guarded by ``_lock``, a leaf lock held for table work only,
never around a request.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from n5fs.kvstore.keys import check_prefix
from n5fs.kvstore.s3.conditional import SCRATCH_START, scratch_leftover
from n5fs.kvstore.s3.uploads import Upload, UploadJournal, leftover_of, owners_of
from n5fs.kvstore.tempnames import Leftover, Liveness, liveness

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping


def _by_path(found: Iterable[Leftover]) -> tuple[Leftover, ...]:
    return tuple(sorted(found, key=lambda lo: (lo.path, lo.mtime)))


class S3Leftovers:
    """The leftovers under one store's ``prefix`` (an object-name prefix, ``""`` or ending
    ``/``) in ``bucket``. ``objects(prefix)`` yields pages of ListObjectsV2 under a store
    prefix; ``uploads(full_prefix)`` yields the ListMultipartUploads items under an
    object-name prefix; ``abort(upload, key)`` aborts one (an upload gone already is fine)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        journal: UploadJournal,
        *,
        objects: Callable[[str], Iterable[Mapping[str, Any]]],
        uploads: Callable[[str], Iterable[Mapping[str, Any]]],
        abort: Callable[[Upload, str], None],
    ) -> None:
        self._bucket = bucket
        self._prefix = prefix
        self._journal = journal
        self._objects = objects
        self._uploads = uploads
        self._abort = abort
        self._lock = threading.Lock()
        #: the uploads behind each leftover reported (remove aborts them)
        self._reported: dict[Leftover, list[Upload]] = {}

    def find(self, prefix: str = "") -> tuple[Leftover, ...]:
        """The incomplete multipart uploads under ``prefix`` (``dead`` as
        :func:`~n5fs.kvstore.s3.uploads.upload_is_dead` decides), and the scratch objects of
        interrupted probes (:mod:`~n5fs.kvstore.s3.conditional`)."""
        return _by_path(self._scan_uploads(prefix)[0] + self.scratch_objects(prefix))

    def scratch_objects(self, prefix: str) -> tuple[Leftover, ...]:
        """Probe scratch objects under ``prefix``: one LIST, at the root only."""
        start = SCRATCH_START
        if not start.startswith(check_prefix(prefix)):
            return ()
        found = []
        for page in self._objects(start):
            for obj in page.get("Contents", ()):
                rel = obj["Key"][len(self._prefix) :]
                mtime = obj["LastModified"].timestamp()
                leftover = scratch_leftover(rel, int(obj["Size"]), mtime)
                if leftover is not None:
                    found.append(leftover)
        return tuple(found)

    def _scan_uploads(self, prefix: str) -> tuple[tuple[Leftover, ...], frozenset[Upload]]:
        """The leftovers under ``prefix``, and every upload the server listed there."""
        check_prefix(prefix)
        owners = owners_of(self._journal.writers())
        found: dict[Leftover, list[Upload]] = {}
        present: list[Upload] = []
        for item in self._uploads(self._prefix + prefix):
            upload = Upload(self._bucket, item["Key"], item["UploadId"])
            present.append(upload)
            path = upload.key[len(self._prefix) :]
            leftover = leftover_of(upload, item["Initiated"].timestamp(), path, owners)
            found.setdefault(leftover, []).append(upload)
        with self._lock:
            self._reported.update(found)
        return _by_path(found), frozenset(present)

    def abort(self, leftover: Leftover) -> None:
        """Abort the upload(s) behind ``leftover``, and drop them from dead writers' journals."""
        with self._lock:
            uploads = self._reported.pop(leftover, None)
        if uploads is None:  # reported by another store object: find it again
            full = self._prefix + leftover.path
            uploads = [
                Upload(self._bucket, item["Key"], item["UploadId"])
                for item in self._uploads(full)
                if item["Key"] == full and item["Initiated"].timestamp() == leftover.mtime
            ]
        for upload in uploads:
            self._abort(upload, leftover.path)
        self._prune_journals(lambda upload: upload in uploads)

    def sweep(self, prefix: str, remove: Callable[[Leftover], None]) -> tuple[Leftover, ...]:
        """``remove`` the leftovers of dead writers under ``prefix``; then drop the journal
        lines of dead writers whose uploads under ``prefix`` are gone from the server."""
        leftovers, present = self._scan_uploads(prefix)
        removed = []
        for leftover in leftovers + self.scratch_objects(prefix):
            if leftover.dead:
                remove(leftover)
                removed.append(leftover)
        under = self._prefix + prefix
        self._prune_journals(
            lambda up: up.bucket == self._bucket and up.key.startswith(under) and up not in present
        )
        return tuple(removed)

    def _prune_journals(self, gone: Callable[[Upload], bool]) -> None:
        """Drop the uploads ``gone`` accepts from the journals of dead writers."""
        for writer, uploads in self._journal.writers().items():
            stale = {upload for upload in uploads if gone(upload)}
            if stale and liveness(writer) is Liveness.DEAD:
                self._journal.drop(writer, stale)
