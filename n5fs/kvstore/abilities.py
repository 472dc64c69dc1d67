"""What a caller may ask of a store beyond the :class:`~n5fs.kvstore.base.KvStore` contract:
facts about it (:class:`StoreTraits`) and optional abilities (the protocols below).

Every store has the contract's methods (get, set, list, stat, rename_prefix, ...), and two
kinds of extras, kept apart on purpose:

- a *fact* is a plain value that changes how a caller plans its work but adds no call: whether
  a listing shows the kept mtimes, whether a ``stat`` is cheaper than a listing, whether
  ``rename_prefix`` is one atomic step. The facts of a store are one frozen
  :class:`StoreTraits`, its ``traits`` attribute (a driver's is its class's; a wrapper's is
  its inner store's, changed where the wrapper changes it: a read-only wrapper is not
  writable). They are data, not protocols, because every store answers them and no code
  path calls anything through them.
- an *ability* is a set of methods only some stores have: :class:`LocalFiles` (keys kept as
  files of a local folder), :class:`ConditionalWrites` (compare-and-swap by version),
  :class:`SettableDurability` (when a write is on disk can be chosen), :class:`PartWrites`
  (a value written from its pieces, never joined), :class:`ListedTimes` (listings that can
  show kept mtimes, at a price the caller chooses to pay), :class:`WriteBack` (writes
  acknowledged from a local journal, durable in the store when asked). Each is a runtime-checkable


show kept mtimes, at a price the caller chooses to pay), :class:`NameListings` (listings of
names alone, where a size costs a call per key). Each is a runtime-checkable
  :class:`typing.Protocol`, and a driver has one exactly when it has the methods: nothing
  on :class:`~n5fs.kvstore.base.KvStore` stands in for them.

Ask for an ability through its function here (:func:`local_files`,
:func:`conditional_writes`, :func:`settable_durability`, :func:`part_writes`,
:func:`listed_times`, :func:`name_listings`, :func:`write_back`), which answers
the store as that protocol, or None; never by ``isinstance`` on a store of unknown kind.
Why: a wrapper (:class:`~n5fs.kvstore.wrappers.ForwardingStore`, the test doubles) carries
the methods of every ability it passes on, whatever it wraps, so ``isinstance`` would claim
for it what its inner store may lack. The functions ask
:meth:`~n5fs.kvstore.base.KvStore.has_ability`, which a wrapper answers for its inner store
(and only for the abilities it passes on: a test double that injects faults into ``get``
does not pass on :class:`LocalFiles`, whose readers would go around it).

Where a rename of a prefix is atomic it stays a fact (``StoreTraits.atomic_prefix_rename``):
every store moves a prefix (``rename_prefix``, key by key by default), and the fact only
tells whether a crash can leave the move half done.

Invariant: a store that has an ability through these functions has its methods, and they do
what the protocol says; no function here does I/O or holds state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from n5fs.kvstore.base import KvStore, Versioned

__all__ = [
    "ConditionalWrites",
    "Durability",
    "ListedTimes",
    "LocalFiles",
    "NameListings",
    "PartWrites",
    "SettableDurability",
    "StoreTraits",
    "WriteBack",
    "conditional_writes",
    "has_ability",
    "listed_times",
    "local_files",
    "name_listings",
    "part_writes",
    "settable_durability",
    "write_back",
]


# == facts ============================================================================================


@dataclass(frozen=True, slots=True)
class StoreTraits:
    """What a store is like, for callers that plan around it. The defaults are a store that
    keeps nothing special: writable, listings with the kept mtimes, nothing else."""

    #: changes are accepted (a read-only wrapper's are refused with ReadOnly)
    writable: bool = True
    #: ``rename_prefix`` moves a whole folder in one atomic step (a directory on disk)
    atomic_prefix_rename: bool = False
    #: ``list`` reports the mtimes ``set_mtime`` kept (S3 listings carry only LastModified:
    #: there ``stat`` must be asked, or the listings, where the store has :class:`ListedTimes`)
    listing_mtimes: bool = True
    #: a prefix can exist with nothing under it (a directory on disk)
    empty_prefixes: bool = False
    #: ``stat`` of one key costs less than listing its folder (a local disk: a few ``lstat``
    #: calls against a ``scandir`` and a ``stat`` per entry). A lookup of a file in a folder
    #: not listed yet then asks ``stat``; on S3 one LIST answers every lookup of the folder,
    #: cheaper than a HEAD per key
    cheap_stat: bool = False
    #: one ``walk`` of a whole array costs less than listing its folders one by one (a LIST
    #: request per folder on S3; a scan of every key per folder in memory): the gateway then
    #: answers every folder of an array's chunk tree from one walk. A directory on disk lists
    #: a folder with one ``scandir``, cheaper than walking the tree.
    flat_listing_preferred: bool = False
    #: a write costs a network round trip or more (S3): worth acknowledging from a local
    #: journal and uploading behind (:mod:`n5fs.kvstore.writeback`)
    remote_writes: bool = False
    #: a read or a listing costs a network round trip (S3): the gateway starts the requests
    #: it can foresee beside the one a caller waits for, not one after another
    remote_reads: bool = False
    #: other writers may share this store (S3, and the memory store that stands for it in
    #: tests): a mount that finds no :class:`ConditionalWrites` in force warns. A local
    #: directory or a zip answers no quietly.
    shared_versions: bool = False


# == abilities =======================================================================================


@runtime_checkable
class LocalFiles(Protocol):
    """Keys kept as files of a directory on this machine (the file store), for readers that
    ``pread`` them through the page cache instead of copying them through ``get``."""

    def local_path(self, key: str) -> str | None:
        """A path holding ``key``'s bytes; None where there is no such file. The file may be
        replaced or removed at any time: a reader opens it and keeps the descriptor (old bytes
        stay readable, as on a local filesystem), and treats a failed open as "ask ``get``"."""
        ...

    def local_folder(self, prefix: str) -> str | None:
        """A directory whose entries are the keys directly below ``prefix`` (``""`` or
        ``"a/b/"``), no link on its path, for readers of many keys of one folder: they open it
        once and each file relative to it (``openat`` with ``O_NOFOLLOW``). None where a link
        is on the way (each key then goes to :meth:`local_path` or ``get``)."""
        ...


@runtime_checkable
class ConditionalWrites(Protocol):
    """Writes that happen only if the key is still at the version read (S3's ``If-Match``,
    the memory store): what lets many mounts of one bucket commit metadata safely."""

    def get_versioned(self, key: str) -> Versioned | None:
        """The value and its version, read together (one request on S3); None when absent."""
        ...

    def set_if(self, key: str, value: bytes, *, version: str | None) -> str | None:
        """Store ``value`` only if ``key`` is at ``version`` now (``None``: only if absent),
        atomically with the check; return the new version. Raises VersionConflict when
        another writer got there first (S3: a 412 or 409 to ``If-Match``/``If-None-Match``)."""
        ...

    def probe_conditional_writes(self) -> str | None:
        """None when :meth:`set_if` is honoured here, else why not (the mount logs it, ``n5fs
        status`` shows it, and commits fall back to plain writes). S3 asks the endpoint: a
        second create-only PUT of a scratch key must fail."""
        ...


class Durability(str, enum.Enum):
    """When a write of a store with :class:`SettableDurability` is on disk (atomic either
    way)."""

    #: every set/put_file is durable before it returns
    COMMIT = "commit"
    #: sets are durable at the next ``flush`` (a mount's fsync, unmount)
    FSYNC = "fsync"


@runtime_checkable
class SettableDurability(Protocol):
    """A store whose writes can be made durable one by one or at the next ``flush`` (the file
    store; a mount's ``-o durable=`` chooses)."""

    def set_durability(self, durability: Durability) -> None:
        """Writes from now on are durable as ``durability`` says."""
        ...


@runtime_checkable
class PartWrites(Protocol):
    """A store that writes a value from its pieces as they are (the file store: one ``write``
    per piece), where joining them first would copy every byte once more."""

    def set_parts(self, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """Store the concatenation of ``parts`` atomically under ``key``."""
        ...


@runtime_checkable
class ListedTimes(Protocol):
    """A store whose listings do not show kept mtimes by themselves (``listing_mtimes`` is
    False) but can be asked to, for less than a ``stat`` per key (S3: the times n5fs kept,
    from one hidden index object per folder, :mod:`n5fs.kvstore.s3.times`)."""

    def show_kept_times(self, on: bool) -> None:
        """From now on ``list`` and ``walk`` show the kept times they can (``on``), or
        only the store's own (no request more)."""
        ...


@runtime_checkable
class WriteBack(Protocol):
    """A store that acknowledges writes from a local journal and uploads them behind
    (:mod:`n5fs.kvstore.writeback`): durability is asked for, key by key or all at once."""

    def flush_key(self, key: str) -> None:
        """Return once the accepted write of ``key`` is in the store (a file's ``fsync``);
        raises :class:`~n5fs.errors.UploadsPending` when it could not land."""
        ...

    def writeback_report(self) -> dict[str, int]:
        """Pending files and bytes, the oldest one's age, failures (``stats.json``)."""
        ...


@runtime_checkable
class NameListings(Protocol):
    """A store that lists the names under a prefix for much less than :meth:`list`, which
    also gives each key's size and mtime (a directory on disk: one ``scandir`` tells each
    entry's kind; its size is one ``stat`` more per entry, several times the ``scandir``)."""

    def list_names(self, prefix: str) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """The names (relative to ``prefix``, ``""`` or ``"a/b/"``) of the keys directly
        below ``prefix`` and of its sub-prefixes, in no particular order: the keys and
        prefixes ``list(prefix)`` shows, without their sizes and times (``stat`` of a key
        answers those). Each name is its UTF-8 bytes (``surrogateescape``: a file name's own
        bytes): a million names as ``bytes`` hold half what they hold as ``str``, and the
        caller keeps them as bytes."""
        ...


# == asking =========================================================================================


def has_ability(store: KvStore, kind: type) -> bool:
    """Does ``store`` have the ability ``kind`` (one of the protocols above), through every
    wrapper around it? The typed functions below are the usual way to ask."""
    return store.has_ability(kind)


def local_files(store: KvStore) -> LocalFiles | None:
    """``store`` as :class:`LocalFiles`, None where its keys are no local files."""
    return store if isinstance(store, LocalFiles) and store.has_ability(LocalFiles) else None


def conditional_writes(store: KvStore) -> ConditionalWrites | None:
    """``store`` as :class:`ConditionalWrites`, None where it has no conditional writes."""
    if isinstance(store, ConditionalWrites) and store.has_ability(ConditionalWrites):
        return store
    return None


def settable_durability(store: KvStore) -> SettableDurability | None:
    """``store`` as :class:`SettableDurability`, None where its durability is not a choice."""
    if isinstance(store, SettableDurability) and store.has_ability(SettableDurability):
        return store
    return None


def part_writes(store: KvStore) -> PartWrites | None:
    """``store`` as :class:`PartWrites`, None where a value is written whole (``set``)."""
    return store if isinstance(store, PartWrites) and store.has_ability(PartWrites) else None


def listed_times(store: KvStore) -> ListedTimes | None:
    """``store`` as :class:`ListedTimes`, None where its listings cannot be asked for them."""
    return store if isinstance(store, ListedTimes) and store.has_ability(ListedTimes) else None


def write_back(store: KvStore) -> WriteBack | None:
    """``store`` as :class:`WriteBack`, None where writes are acknowledged by the store."""
    return store if isinstance(store, WriteBack) and store.has_ability(WriteBack) else None


def name_listings(store: KvStore) -> NameListings | None:
    """``store`` as :class:`NameListings`, None where a listing brings sizes anyway."""
    return store if isinstance(store, NameListings) and store.has_ability(NameListings) else None
