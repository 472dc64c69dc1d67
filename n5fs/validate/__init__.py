"""``n5fs validate``: every metadata file and every chunk of a store, checked in parallel.

:mod:`.validator` walks, lists (:mod:`.localscan` on local files) and classifies;
:mod:`.chunks` reads and judges chunks (:mod:`.check`) on a bounded pool of threads, or of
worker processes (:mod:`.procs`), while the listing goes on; :mod:`.report` holds what was
found, in an order that does not depend on the workers.
"""

from __future__ import annotations

from n5fs.validate.chunks import BATCH_BYTES, BATCH_CHUNKS, ChunkChecker, ChunkJob
from n5fs.validate.report import Finding, Progress, Report
from n5fs.validate.validator import Validator, default_jobs, is_remote, validate_store

__all__ = [
    "BATCH_BYTES",
    "BATCH_CHUNKS",
    "ChunkChecker",
    "ChunkJob",
    "Finding",
    "Progress",
    "Report",
    "Validator",
    "default_jobs",
    "is_remote",
    "validate_store",
]
