"""Write-back: writes acknowledged once journaled on local disk, uploaded behind.

- :mod:`~n5fs.kvstore.writeback.journal`: the entries on disk (durable before acknowledged;
  replayed by the next mount of the same source);
- :mod:`~n5fs.kvstore.writeback.pending`: the table of accepted, not uploaded writes (one
  leaf condition) and the waits on it;
- :mod:`~n5fs.kvstore.writeback.uploader`: the threads that upload;
- :mod:`~n5fs.kvstore.writeback.store`: the wrapper a mount writes through.

Lock order: the pending table's condition is a leaf; nothing here calls the inner store while
holding it, so callers may hold any lock of theirs when they call the wrapper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from n5fs.kvstore.state import state_home
from n5fs.kvstore.writeback.journal import Journal, journal_root
from n5fs.kvstore.writeback.store import DEFAULT_LIMIT, WriteBackStore

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from n5fs.kvstore.base import KvStore

__all__ = ["DEFAULT_LIMIT", "Journal", "WriteBackStore", "journal_root", "open_write_back"]


def open_write_back(
    store: KvStore,
    *,
    write_through: Callable[[str], bool],
    limit: int = DEFAULT_LIMIT,
    state: Path | None = None,
) -> WriteBackStore:
    """``store`` behind a journal of its own source (taken from n5fs's persistent state, or
    ``state``); what an earlier mount of the source left journaled is uploaded first."""
    root = journal_root(state_home() if state is None else state)
    journal = Journal.open(root, store.spec.to_url())
    return WriteBackStore(store, journal, write_through=write_through, limit=limit)
