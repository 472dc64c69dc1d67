"""Where a file's mtime comes from on a store whose listings cannot show kept times (S3):
``kept`` asks the store per stat (what ``rsync -a`` into a mount needs), ``listing`` answers
the listing's time without a request (what a read-only stat storm needs). The store here is
a memory store that behaves as S3 does: its listings show the time of the last write, and
only ``stat`` (a HEAD) shows the time ``set_mtime`` kept."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore.base import KeyInfo, Listing
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.s3 import S3Store
from n5fs.kvstore.spec import S3Spec
from n5fs.testing.doubles import CountingStore

KEPT = 1_000_000_000.0  # 2001-09-09: what `touch -d` or `rsync -a` set


class ListsLikeS3(CountingStore):
    """Listings carry the write time, not the kept one, as S3's do (so not a plain
    CountingStore: it rewrites listings); ``stat`` calls (HEADs) are counted."""

    traits = dataclasses.replace(MemoryStore.traits, listing_mtimes=False)

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.written: dict[str, float] = {}

    def set(self, key: str, value: bytes) -> None:
        super().set(key, value)
        info = self.inner.stat(key)
        assert info is not None
        self.written[key] = info.mtime

    def list(self, prefix: str = "", delimiter: str | None = "/") -> Listing:
        listing = super().list(prefix, delimiter)
        keys = tuple(
            KeyInfo(k.key, k.size, self.written.get(k.key, k.mtime), k.etag) for k in listing.keys
        )
        return Listing(keys, listing.prefixes)


@pytest.fixture
def store() -> ListsLikeS3:
    store = ListsLikeS3(MemoryStore())
    store.set("a/f", b"data")
    store.inner.set_mtime("a/f", KEPT)
    return store


def test_a_read_write_mount_shows_the_kept_time(store: ListsLikeS3) -> None:
    gw = Gateway(store, GatewayConfig())
    assert gw.stat("/a/f").mtime == KEPT
    assert store.count("stat") == 1


def test_a_read_only_mount_answers_from_the_listing(store: ListsLikeS3) -> None:
    gw = Gateway(store, GatewayConfig(read_only=True))
    for _ in range(3):
        assert gw.stat("/a/f").mtime == store.written["a/f"] != KEPT
    fh = gw.open("/a/f", os.O_RDONLY)
    assert gw.read(fh, 4, 0) == b"data"
    gw.release(fh)
    assert store.count("stat") == 0


@pytest.mark.parametrize(
    ("read_only", "mtime", "shown"), [(True, "kept", KEPT), (False, "listing", None)]
)
def test_either_source_on_either_mount(
    store: ListsLikeS3, read_only: bool, mtime: str, shown: float | None
) -> None:
    gw = Gateway(store, GatewayConfig(read_only=read_only, mtime=mtime))
    assert gw.stat("/a/f").mtime == (store.written["a/f"] if shown is None else shown)


def test_rsync_into_a_read_write_mount_sees_the_times_it_set(store: ListsLikeS3) -> None:
    gw = Gateway(store, GatewayConfig())
    gw.write_file("/a/g", b"copied")
    gw.utimens("/a/g", KEPT + 1)
    gw.drop_caches()  # the next run of rsync, after the TTL
    assert gw.stat("/a/g").mtime == KEPT + 1


def test_an_unknown_mtime_source_is_refused() -> None:
    with pytest.raises(ValueError, match="mtime must be one of kept, listing"):
        Gateway(MemoryStore(), GatewayConfig(mtime="ctime"))


@pytest.mark.s3
def test_cp_a_onto_s3_sends_the_time_with_the_put(s3_server: Any, s3_bucket: str) -> None:
    """``cp -a`` writes, sets the time on the open file, then closes: one PUT carries the
    content and the time (no HEAD and no copy of the object after it); a time set after
    ``close()`` (``touch``, ``tar``) still takes the copy onto itself."""
    store = S3Store(S3Spec(bucket=s3_bucket, path="m/", endpoint=s3_server.endpoint))
    gw = Gateway(store, GatewayConfig())
    made: list[str] = []
    store.client.meta.events.register(
        "before-call.s3.*", lambda model, **_: made.append(model.name)
    )
    fh = gw.create("/copied")
    gw.write(fh, b"chunk bytes", 0)
    gw.utimens("/copied", KEPT)
    gw.flush(fh)
    gw.release(fh)
    assert made.count("PutObject") == 1
    assert "CopyObject" not in made
    assert "HeadObject" not in made
    gw.utimens("/copied", KEPT + 5)  # after close: the copy onto itself
    assert "CopyObject" in made
    gw.drop_caches()
    assert gw.stat("/copied").mtime == KEPT + 5
    info = store.stat("copied")
    assert info is not None
    assert (info.size, info.mtime) == (11, KEPT + 5)
    store.close()
