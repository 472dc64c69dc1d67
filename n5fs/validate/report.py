"""What ``n5fs validate`` found, and how far it got: the report and the progress counters.

Why a module of its own: the listing thread and the chunk workers both add findings, and the
report's order must not depend on which worker finished first. Findings are added through
:meth:`Report.add` under the report's lock; :meth:`Report.settle` sorts them once the run is
over, so two runs over one store give one report, in one order, however the work was split.

Lock discipline: ``Report._lock`` guards ``invalid``, ``skipped`` and ``chunks`` while workers
run (a leaf lock: nothing is called while it is held). ``Progress`` is written under that
lock too, and read without it by a progress bar (single int reads: a bar may lag, never tear).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from n5fs.errors import Rejected

if TYPE_CHECKING:
    from collections.abc import Iterable

    from n5fs.kvstore.tempnames import Leftover


@dataclass(frozen=True)
class Finding:
    key: str
    rule: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "rule": self.rule, "message": self.message}


def finding(key: str, exc: Exception) -> Finding:
    """A refusal keeps its rule; any other error is named by its class."""
    if isinstance(exc, Rejected):
        return Finding(key, exc.rule or "invalid", exc.message)
    return Finding(key, type(exc).__name__, str(exc))


def _order(item: Finding) -> tuple[str, str, str]:
    return (item.key, item.rule, item.message)


@dataclass
class Progress:
    """Counters the caller may read at any time (a progress bar polls them).

    ``total_chunks`` grows while the listing runs (chunks are checked as they are listed);
    ``listing_done`` says it is final."""

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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.invalid

    def add(self, invalid: Iterable[Finding] = (), skipped: Iterable[Finding] = ()) -> None:
        """Findings from any thread."""
        with self._lock:
            self.invalid.extend(invalid)
            self.skipped.extend(skipped)

    def add_chunks(
        self,
        count: int,
        nbytes: int,
        invalid: Iterable[Finding],
        skipped: Iterable[Finding],
        progress: Progress,
    ) -> None:
        """A checked batch of ``count`` chunks (``nbytes`` stored), from a worker."""
        with self._lock:
            self.chunks += count
            self.invalid.extend(invalid)
            self.skipped.extend(skipped)
            progress.done_chunks += count
            progress.done_bytes += nbytes

    def settle(self) -> None:
        """Sort the findings by key (then rule, message): the report of a finished run."""
        with self._lock:
            self.invalid.sort(key=_order)
            self.skipped.sort(key=_order)

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": {"metadata": self.metadata, "chunks": self.chunks, "other": self.other},
            "invalid": [f.to_json() for f in sorted(self.invalid, key=_order)],
            "skipped": [f.to_json() for f in sorted(self.skipped, key=_order)],
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
