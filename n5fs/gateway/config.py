"""The gateway's settings: one value per mount, read when the gateway is built and never
changed afterwards (so no lock guards it). The CLI's ``-o`` options and the TOML config map
onto these fields; ``docs/semantics.md`` says what each one means for a user."""

from __future__ import annotations

from dataclasses import dataclass

#: the ``consistency`` settings (see :class:`GatewayConfig`)
CONSISTENCY = ("ttl", "strict")
#: the ``mtime`` settings (see :class:`GatewayConfig`)
MTIME_SOURCES = ("kept", "listing", "head")


@dataclass
class GatewayConfig:
    validate: str = "strict"
    read_only: bool = False
    #: bytes of object data kept in memory (the LRU); read-ahead windows come on top
    cache_bytes: int = 256 << 20
    #: seconds a listing, stat or detection answer is trusted (others may write the store)
    ttl: float = 5.0
    #: one open file's staged writes spill to a temp file past this size
    spill_bytes: int = 64 << 20
    #: staged writes of all open files together hold at most this much memory (then spill)
    staging_bytes: int = 256 << 20
    #: a write or truncate past this size answers EFBIG
    max_file_size: int = 1 << 40
    tmp_dir: str | None = None
    #: objects up to this size are fetched whole (and cached); larger ones by range. Chunks
    #: are read whole by every reader, and a 4 MiB chunk plus its header must not become a
    #: series of ranged GETs on S3.
    small_object: int = 16 << 20
    readahead: int = 8 << 20
    max_rejections: int = 10_000
    #: list ``/.n5fs`` in the root folder (``-o show_control``); it is reachable either way
    show_control: bool = False
    #: keys one flat listing of an array may read (stores that prefer them: S3, zip); the
    #: folders of a larger array's chunk tree past that are listed one by one; 0: never
    flat_list_keys: int = 100_000
    #: when a commit to a local file store is on disk (``-o durable=``): ``fsync`` at the
    #: next ``fsync()`` or unmount, as on a local filesystem; ``commit`` before ``close()``
    #: returns (two fsyncs per file, the larger part of the write path's cost)
    durable: str = "fsync"
    #: metadata commits as compare-and-swap where the store honours conditional writes
    #: (``auto``: probed at mount; ``off``: last-writer-wins, one writing mount per hierarchy)
    conditional: str = "auto"
    #: a file's mtime on a store whose listings cannot carry the kept one (S3): ``kept``
    #: shows the times n5fs mounts kept, from the listings (S3: one GET per folder where a
    #: time was kept, none elsewhere: what ``rsync -a`` into the mount needs), ``listing``
    #: answers the listing's own time (no request), ``head`` asks the store per stat (one HEAD
    #: per file: times other tools kept too); None: kept on read-write mounts, listing on
    #: read-only ones (``-o mtime=``)
    mtime: str | None = None
    #: what other mounts' commits this mount sees when (``-o consistency=``): ``ttl`` trusts
    #: listings and detection for ``ttl`` seconds; ``strict`` asks the store on every lookup
    #: and checks an array's metadata is current before each chunk commit
    consistency: str = "ttl"

    def __post_init__(self) -> None:
        if self.mtime not in (None, *MTIME_SOURCES):
            raise ValueError(f"mtime must be one of {', '.join(MTIME_SOURCES)}")
        if self.consistency not in CONSISTENCY:
            raise ValueError(f"consistency must be one of {', '.join(CONSISTENCY)}")
