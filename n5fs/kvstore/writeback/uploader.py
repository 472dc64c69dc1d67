"""The threads that upload journaled writes: enough in flight to cover a round trip.

A value is read from its journal entry, written to the inner store with the store's own
checks (on S3: retries, the integrity check of every PUT), and its entry settled in the
journal only after the store acknowledged it. A failed attempt leaves the entry where it is and the job backs off
(:mod:`~n5fs.kvstore.writeback.pending`); nothing accepted is ever dropped here.

State: the threads themselves, started once and joined by :meth:`Uploader.close`; everything
they share lives in :class:`~n5fs.kvstore.writeback.pending.Pending`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from n5fs.kvstore.writeback.journal import Entry
    from n5fs.kvstore.writeback.pending import Job, Pending

log = logging.getLogger(__name__)

__all__ = ["UPLOADERS", "Uploader"]

#: uploads in flight at once: at a 50 ms round trip, 16 keep ~300 small PUTs a second going,
#: without crowding the reads of the same mount out of the endpoint
UPLOADERS = 16


class Uploader:
    """``threads`` workers taking jobs from ``pending`` and sending them with ``send``."""

    def __init__(
        self,
        pending: Pending,
        send: Callable[[Entry], None],
        remove: Callable[[Entry], None],
        *,
        threads: int = UPLOADERS,
        where: str = "",
    ) -> None:
        self._pending = pending
        self._send = send
        self._remove = remove
        self._where = where
        self._threads = [
            threading.Thread(target=self._run, name=f"n5fs-upload-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        pending = self._pending
        while True:
            job = pending.take(idle=5.0)
            if job is None:
                if pending.closed:
                    return
                continue
            error = self._attempt(job)
            if pending.finished(job, error):
                self._remove(job.entry)
                pending.released(job)

    def _attempt(self, job: Job) -> BaseException | None:
        entry = job.entry
        try:
            self._send(entry)
        except Exception as exc:  # noqa: BLE001 (kept on the job, reported, retried)
            if job.attempts in (0, 4) or job.attempts % 20 == 19:
                log.warning(
                    "upload of /%s to %s failed (attempt %d; it stays journaled and is tried "
                    "again): %s",
                    entry.key,
                    self._where,
                    job.attempts + 1,
                    exc,
                )
            return exc
        if job.attempts:
            log.info("upload of /%s landed after %d failed attempts", entry.key, job.attempts)
        return None

    def close(self) -> None:
        """Stop taking jobs; wait for the attempts in flight (each bounded by the store's own
        timeouts)."""
        self._pending.close()
        for thread in self._threads:
            thread.join()
