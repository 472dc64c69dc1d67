"""What ``n5fs validate`` found, and how far it got: the report and the progress counters.

Why a module of its own: the listing thread and the chunk workers both add findings, and the
report's order must not depend on which worker finished first. Findings are added through
:meth:`Report.add` under the report's lock; :meth:`Report.settle` sorts them once the run is
over, so two runs over one store give one report, in one order, however the work was split.

Two kinds of finding, kept apart because they mean opposite things about the data:
``invalid`` (the bytes were read and break their format) and ``unreadable`` (validate could
not read or decode the key because of a store fault: an I/O error, a backend that kept
failing, a container that cannot yield the bytes, a key gone since it was listed). An
unreadable key was not checked, so a report with one is never "valid"
(:attr:`Report.ok`); the CLI's exit codes keep the two apart as well.

Lock discipline: ``Report._lock`` guards ``invalid``, ``unreadable`` and ``chunks`` while
workers run (a leaf lock: nothing is called while it is held). ``Progress`` is written under
that lock too, and read without it by a progress bar (single int reads: a bar may lag, never
tear).
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
    """A refusal keeps its rule; any other error is named by its class, and its message is
    the error's whole text (an unreadable key's only explanation: nothing is cut)."""
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
    """What one run found.

    ``metadata`` and ``chunks`` count the keys that were read and judged (valid or invalid:
    an unreadable key is in neither count, so "checked" never includes a key that was not
    read); ``other`` the keys validate does not judge. ``invalid``: keys whose bytes break
    their format. ``unreadable``: keys (or, for a failed search for leftovers, a prefix)
    that could not be checked at all."""

    metadata: int = 0
    chunks: int = 0
    other: int = 0
    invalid: list[Finding] = field(default_factory=list)
    unreadable: list[Finding] = field(default_factory=list)
    #: what interrupted writers left (temp files, uploads): reported, not judged invalid
    leftovers: list[Leftover] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Was everything checked and found valid? False as soon as one key is invalid or
        could not be read: data that was not read is never called valid."""
        return not self.invalid and not self.unreadable

    def add(self, invalid: Iterable[Finding] = (), unreadable: Iterable[Finding] = ()) -> None:
        """Findings from any thread."""
        with self._lock:
            self.invalid.extend(invalid)
            self.unreadable.extend(unreadable)

    def add_chunks(
        self,
        count: int,
        nbytes: int,
        invalid: list[Finding],
        unreadable: list[Finding],
        progress: Progress,
    ) -> None:
        """A batch of ``count`` chunks (``nbytes`` stored) a worker is done with, one finding
        at most per chunk: the progress counts them all, ``chunks`` the ones it could read."""
        with self._lock:
            self.chunks += count - len(unreadable)
            self.invalid.extend(invalid)
            self.unreadable.extend(unreadable)
            progress.done_chunks += count
            progress.done_bytes += nbytes

    def settle(self) -> None:
        """Sort the findings by key (then rule, message): the report of a finished run."""
        with self._lock:
            self.invalid.sort(key=_order)
            self.unreadable.sort(key=_order)

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": {"metadata": self.metadata, "chunks": self.chunks, "other": self.other},
            "invalid": [f.to_json() for f in sorted(self.invalid, key=_order)],
            "unreadable": [f.to_json() for f in sorted(self.unreadable, key=_order)],
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
