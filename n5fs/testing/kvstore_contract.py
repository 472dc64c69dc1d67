"""One contract every KvStore passes, shipped so outside drivers can run it too.

A driver's test is a small subclass: a ``store`` fixture, and ``seed``/``peek`` that reach the
backend natively (os, boto3, zipfile), so reads and writes are each tested alone. A backend that
cannot do something says so with a class flag and the test skips with that reason; an ability
it lacks (:mod:`n5fs.kvstore.abilities`) skips that ability's tests.
"""

from __future__ import annotations

import abc
import errno
import threading
from typing import TYPE_CHECKING, ClassVar

import pytest

from n5fs.errors import (
    InvalidKey,
    KeyNotFound,
    NotSupported,
    ReadOnly,
    StoreUnavailable,
    VersionConflict,
    errno_of,
)
from n5fs.kvstore.abilities import (
    ConditionalWrites,
    LocalFiles,
    NameListings,
    PartWrites,
    SettableDurability,
    conditional_writes,
    has_ability,
    name_listings,
    part_writes,
)
from n5fs.kvstore.base import ByteRange, KvStore, Versioned
from n5fs.kvstore.spec import parse_spec, parse_url
from n5fs.kvstore.wrappers import ForwardingStore, ReadOnlyStore
from n5fs.testing.doubles import FaultyStore

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

KEYS = ["a", "x/0.0", "n5/0/1/2", "sp ace/ü+%=", ".zarray", "deep/a/b/c/d/e/f/attributes.json"]
BAD_KEYS = ["../x", "/abs", "a//b", "a/./b", "a/../b", "a\x00b", "", "a/"]
#: the optional abilities a store may have
ABILITIES: tuple[type, ...] = (
    LocalFiles,
    ConditionalWrites,
    SettableDurability,
    PartWrites,
    NameListings,
)
#: a time set_mtime gives (2001-09-09, with a fraction every store can keep)
MTIME = 1_000_000_000.25


class KvStoreContract(abc.ABC):
    """Subclasses provide a ``store`` fixture and implement ``seed`` and ``peek``."""

    #: the backend reopened from its spec sees the same data (not so for memory://)
    persistent: ClassVar[bool] = True
    #: how many keys the large-listing test seeds (pagination needs > 1000 on S3)
    many_keys: ClassVar[int] = 2500
    #: ``copy`` gives the copy the source's time (as ``cp -p``; S3's CopyObject does)
    copy_keeps_mtime: ClassVar[bool] = True
    #: the step in which the store keeps times (zip's DOS dates: 2 s)
    mtime_resolution: ClassVar[float] = 1e-3

    @abc.abstractmethod
    def seed(self, store: KvStore, key: str, value: bytes) -> None:
        """Put ``value`` in the backend without going through ``store``."""

    @abc.abstractmethod
    def peek(self, store: KvStore, key: str) -> bytes | None:
        """Read ``key`` from the backend without going through ``store``."""

    def seed_many(self, store: KvStore, items: Iterable[tuple[str, bytes]]) -> None:
        for key, value in items:
            self.seed(store, key, value)

    # -- reads -----------------------------------------------------------------------------------

    def test_absent_key_is_none(self, store: KvStore) -> None:
        assert store.get("nothing/here") is None
        assert store.get("nothing", ByteRange(0, 3)) is None
        assert store.stat("nothing") is None

    @pytest.mark.parametrize("key", KEYS)
    def test_seeded_value_reads_back(self, store: KvStore, key: str) -> None:
        self.seed(store, key, b"abcde")
        assert store.get(key) == b"abcde"
        info = store.stat(key)
        assert info is not None
        assert (info.key, info.size) == (key, 5)

    @pytest.mark.parametrize(
        ("byte_range", "expected"),
        [
            (ByteRange(1, 2), b"bc"),
            (ByteRange(0), b"abcdef"),
            (ByteRange(4), b"ef"),
            (ByteRange(-2), b"ef"),
            (ByteRange(-6), b"abcdef"),
            (ByteRange(-100), b"abcdef"),
            (ByteRange(3, 100), b"def"),
            (ByteRange(6), b""),
            (ByteRange(10, 2), b""),
            (ByteRange(2, 0), b""),
        ],
    )
    def test_byte_ranges(self, store: KvStore, byte_range: ByteRange, expected: bytes) -> None:
        self.seed(store, "r/obj", b"abcdef")
        assert store.get("r/obj", byte_range) == expected

    def test_empty_value(self, store: KvStore) -> None:
        store.set("empty", b"")
        assert store.get("empty") == b""
        info = store.stat("empty")
        assert info is not None
        assert info.size == 0

    # -- writes ----------------------------------------------------------------------------------

    @pytest.mark.parametrize("key", KEYS)
    def test_set_reaches_backend(self, store: KvStore, key: str) -> None:
        store.set(key, b"v1")
        store.set(key, b"value two")
        store.flush()
        assert self.peek(store, key) == b"value two"
        assert store.get(key) == b"value two"

    def test_set_parts_stores_their_concatenation(self, store: KvStore) -> None:
        """A commit hands a store that writes parts the pieces a file was written in; the
        value is their concatenation, replacing what was there. No wrapper claims the ability
        (a wrapper writes a value whole, through its own ``set``)."""
        assert part_writes(ReadOnlyStore(store)) is None
        assert part_writes(FaultyStore(store)) is None
        writer = part_writes(store)
        if writer is None:
            pytest.skip(f"{type(store).__name__} writes a value whole")
        big = bytes(range(256)) * 8192  # 2 MiB: the file store writes it in pieces
        parts: list[bytes | memoryview] = [b"head", memoryview(big)[1:], b"", memoryview(b"tail")]
        self.seed(store, "sp/k", b"old value")
        writer.set_parts("sp/k", parts)
        store.flush()
        assert self.peek(store, "sp/k") == b"head" + big[1:] + b"tail"
        assert store.get("sp/k", ByteRange(4, 3)) == big[1:4]

    # -- abilities (n5fs.kvstore.abilities) ------------------------------------------------------

    @pytest.mark.parametrize("kind", ABILITIES, ids=lambda kind: kind.__name__)
    def test_an_ability_is_claimed_only_where_its_methods_are(
        self, store: KvStore, kind: type
    ) -> None:
        """A driver has an ability exactly when it has the methods; a wrapper never has one
        its inner store lacks, and the fault double never passes on local files (a reader of
        them would go around its faults)."""
        has = has_ability(store, kind)
        if isinstance(store, ForwardingStore):  # a double under test: its inner store decides
            assert has is (kind in store.passes_on and has_ability(store.inner, kind))
        else:
            assert has is isinstance(store, kind)
        for wrapper in (
            ReadOnlyStore(store),
            FaultyStore(store),
            FaultyStore(ReadOnlyStore(store)),
        ):
            assert has or not has_ability(wrapper, kind), type(wrapper).__name__
        assert not has_ability(FaultyStore(store), LocalFiles)
        assert not has_ability(FaultyStore(store), NameListings)
        assert has_ability(ReadOnlyStore(store), LocalFiles) is has_ability(store, LocalFiles)

    def test_names_alone_are_what_a_listing_shows(self, store: KvStore) -> None:
        """:class:`NameListings`: the names of a folder's keys and sub-prefixes, as ``list``
        shows them (a store without the ability has nothing to check)."""
        names = name_listings(store)
        if names is None:
            return
        for key in ("nl/a", "nl/b.1", "nl/sub/c", "nl/sub/deep/d", "nl2/e"):
            self.seed(store, key, b"x")
        for prefix in ("", "nl/", "nl/sub/", "absent/"):
            listing = store.list(prefix)
            files, folders = names.list_names(prefix)
            named = sorted(n.decode("utf-8", "surrogateescape") for n in files)
            assert named == sorted(k.key[len(prefix) :] for k in listing.keys)
            named = sorted(n.decode("utf-8", "surrogateescape") for n in folders)
            assert named == sorted(p[len(prefix) : -1] for p in listing.prefixes)

    def test_delete(self, store: KvStore) -> None:
        self.seed(store, "d/k", b"x")
        store.delete("d/k")
        store.delete("d/k")  # absent: a no-op, like rm -f
        store.delete("never/was")
        store.flush()
        assert store.get("d/k") is None
        assert self.peek(store, "d/k") is None

    def test_put_file(self, store: KvStore, tmp_path: object) -> None:
        import pathlib

        src = pathlib.Path(str(tmp_path)) / "src.bin"
        src.write_bytes(b"from a file" * 1000)
        store.put_file("pf/obj", src)
        store.flush()
        assert self.peek(store, "pf/obj") == src.read_bytes()

    def test_copy(self, store: KvStore) -> None:
        self.seed(store, "c/src", b"payload")
        store.copy("c/src", "c/dst")
        store.flush()
        assert store.get("c/dst") == b"payload"
        assert self.peek(store, "c/dst") == b"payload"
        assert store.get("c/src") == b"payload"
        with pytest.raises(KeyNotFound):
            store.copy("c/absent", "c/x")

    def test_rename_moves_and_replaces(self, store: KvStore) -> None:
        self.seed_many(store, [("mv/src", b"new"), ("mv/dst", b"old")])
        store.rename("mv/src", "mv/dst")
        store.rename("mv/dst", "elsewhere/deep/dst")
        store.flush()
        assert store.get("mv/src") is None
        assert store.get("mv/dst") is None
        assert self.peek(store, "elsewhere/deep/dst") == b"new"
        with pytest.raises(KeyNotFound):
            store.rename("mv/absent", "mv/x")

    def test_rename_prefix(self, store: KvStore) -> None:
        self.seed_many(store, [("rp/a", b"1"), ("rp/sub/b", b"2"), ("rpx", b"3")])
        assert store.rename_prefix("rp/", "moved/here/") == 2
        store.flush()
        assert store.list("", delimiter=None).names() == ["moved/here/a", "moved/here/sub/b", "rpx"]
        assert self.peek(store, "moved/here/sub/b") == b"2"

    def test_overwrite_is_never_torn(self, store: KvStore) -> None:
        old, new = b"a" * (1 << 20), b"b" * (1 << 20) + b"b"
        store.set("t/obj", old)
        seen: list[bytes | None] = []
        done = threading.Event()

        def reader() -> None:
            while not done.is_set():
                seen.append(store.get("t/obj"))

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for i in range(6):
                store.set("t/obj", new if i % 2 == 0 else old)
        finally:
            done.set()
            thread.join()
        assert seen, "the reader never ran"
        assert all(value in (old, new) for value in seen)

    # -- times ---------------------------------------------------------------------------------

    def _set_mtime_or_skip(self, store: KvStore, key: str, mtime: float) -> None:
        try:
            store.set_mtime(key, mtime)
        except NotSupported as exc:
            pytest.skip(f"this store keeps no modification times: {exc}")

    def _mtime(self, store: KvStore, key: str) -> float:
        info = store.stat(key)
        assert info is not None, key
        return info.mtime

    def test_set_mtime_is_what_stat_reports(self, store: KvStore) -> None:
        self.seed(store, "tm/k", b"timed")
        self._set_mtime_or_skip(store, "tm/k", MTIME)
        store.flush()
        assert self._mtime(store, "tm/k") == pytest.approx(MTIME, abs=self.mtime_resolution)
        assert store.get("tm/k") == b"timed"
        assert self.peek(store, "tm/k") == b"timed"
        store.set_mtime("tm/k", MTIME + 3600)
        assert self._mtime(store, "tm/k") == pytest.approx(MTIME + 3600, abs=self.mtime_resolution)
        with pytest.raises(KeyNotFound):
            store.set_mtime("tm/absent", MTIME)
        with pytest.raises(ReadOnly):
            ReadOnlyStore(store).set_mtime("tm/k", MTIME)

    def test_set_with_mtime_stores_value_and_time(self, store: KvStore, tmp_path: Path) -> None:
        """One write with its time (``cp -a`` into a mount); a store keeping no times stores
        the value and says so."""
        kept = store.set_with_mtime("tm/w", b"with time", MTIME)
        local = tmp_path / "staged"
        local.write_bytes(b"from a file")
        assert store.put_file_with_mtime("tm/f", local, MTIME + 60) is kept
        store.flush()
        assert self.peek(store, "tm/w") == b"with time"
        assert self.peek(store, "tm/f") == b"from a file"
        if not kept:
            return
        assert self._mtime(store, "tm/w") == pytest.approx(MTIME, abs=self.mtime_resolution)
        assert self._mtime(store, "tm/f") == pytest.approx(MTIME + 60, abs=self.mtime_resolution)
        with pytest.raises(ReadOnly):
            ReadOnlyStore(store).set_with_mtime("tm/w", b"x", MTIME)

    def test_rename_keeps_mtime(self, store: KvStore) -> None:
        self.seed(store, "tm/src", b"moved")
        self._set_mtime_or_skip(store, "tm/src", MTIME)
        store.rename("tm/src", "tm/sub/dst")
        store.flush()
        assert self._mtime(store, "tm/sub/dst") == pytest.approx(MTIME, abs=self.mtime_resolution)
        assert store.get("tm/sub/dst") == b"moved"

    def test_copy_keeps_mtime(self, store: KvStore) -> None:
        if not self.copy_keeps_mtime:
            pytest.skip("this store's copy gets the time of copying")
        self.seed(store, "tm/src", b"copied")
        self._set_mtime_or_skip(store, "tm/src", MTIME)
        store.copy("tm/src", "tm/dst")
        store.flush()
        assert self._mtime(store, "tm/dst") == pytest.approx(MTIME, abs=self.mtime_resolution)
        assert self._mtime(store, "tm/src") == pytest.approx(MTIME, abs=self.mtime_resolution)
        assert self.peek(store, "tm/dst") == b"copied"

    # -- listing ---------------------------------------------------------------------------------

    def test_list_with_delimiter(self, store: KvStore) -> None:
        self.seed_many(store, [(k, b"1") for k in ("top", "g/a", "g/b", "g/sub/c", "h/d")])
        root = store.list("")
        assert [k.key for k in root.keys] == ["top"]
        assert list(root.prefixes) == ["g/", "h/"]
        g = store.list("g/")
        assert [k.key for k in g.keys] == ["g/a", "g/b"]
        assert list(g.prefixes) == ["g/sub/"]
        assert all(k.size == 1 for k in g.keys)
        assert store.list("absent/").keys == ()

    def test_list_without_delimiter(self, store: KvStore) -> None:
        self.seed_many(store, [(k, b"1") for k in ("g/a", "g/sub/c", "g/sub/deeper/d", "z")])
        assert store.list("g/", delimiter=None).names() == ["g/a", "g/sub/c", "g/sub/deeper/d"]
        assert [k.key for k in store.walk("")] == ["g/a", "g/sub/c", "g/sub/deeper/d", "z"]

    def test_list_many_keys(self, store: KvStore) -> None:
        n = self.many_keys
        names = [f"big/{i // 100}.{i % 100}" for i in range(n)]
        self.seed_many(store, [(k, b"") for k in names] + [("big/sub/x", b"")])
        listing = store.list("big/")
        assert listing.names() == sorted(names)
        assert list(listing.prefixes) == ["big/sub/"]

    def test_delete_prefix(self, store: KvStore) -> None:
        self.seed_many(store, [(k, b"1") for k in ("p/a", "p/q/b", "p/q/c", "pp/keep", "keep")])
        assert store.delete_prefix("p/") == 3
        store.flush()
        assert store.list("", delimiter=None).names() == ["keep", "pp/keep"]
        assert self.peek(store, "p/q/b") is None
        assert self.peek(store, "pp/keep") == b"1"

    def test_get_many(self, store: KvStore) -> None:
        self.seed_many(store, [(f"m/{i}", bytes([i])) for i in range(20)])
        got = store.get_many([f"m/{i}" for i in range(20)] + ["m/absent"])
        assert got["m/absent"] is None
        assert all(got[f"m/{i}"] == bytes([i]) for i in range(20))

    # -- refusals --------------------------------------------------------------------------------

    @pytest.mark.parametrize("key", BAD_KEYS)
    @pytest.mark.parametrize("op", ["get", "stat", "delete", "set"])
    def test_bad_key_refused(self, store: KvStore, key: str, op: str) -> None:
        args: tuple[object, ...] = (key, b"x") if op == "set" else (key,)
        with pytest.raises(InvalidKey) as info:
            getattr(store, op)(*args)
        assert errno_of(info.value) == errno.EINVAL

    def test_read_only_wrapper(self, store: KvStore) -> None:
        self.seed(store, "ro/k", b"kept")
        ro = ReadOnlyStore(store)
        assert ro.get("ro/k") == b"kept"
        for call in (
            lambda: ro.set("ro/k", b"x"),
            lambda: ro.delete("ro/k"),
            lambda: ro.delete_prefix("ro/"),
            lambda: ro.copy("ro/k", "ro/j"),
        ):
            with pytest.raises(ReadOnly) as info:
                call()
            assert errno_of(info.value) == errno.EROFS
        assert store.get("ro/k") == b"kept"

    def test_faults_are_typed(self, store: KvStore) -> None:
        self.seed(store, "f/k", b"v")
        faulty = FaultyStore(store)
        faulty.fail("get")
        with pytest.raises(StoreUnavailable) as info:
            faulty.get("f/k")
        assert errno_of(info.value) == errno.EIO
        assert faulty.get("f/k") == b"v"  # one fault, then the store answers again
        faulty.fail("set", times=None)
        for _ in range(2):
            with pytest.raises(StoreUnavailable):
                faulty.set("f/k", b"w")
        faulty.heal()
        faulty.set("f/k", b"w")
        assert store.get("f/k") == b"w"

    # -- conditional writes (many mounts of one bucket) -------------------------------------

    def _conditional_or_skip(self, store: KvStore) -> ConditionalWrites:
        writes = conditional_writes(store)
        if writes is None:
            pytest.skip(f"no conditional writes here: {type(store).__name__} has none")
        reason = writes.probe_conditional_writes()
        if reason is not None:
            pytest.skip(f"no conditional writes here: {reason}")
        return writes

    def test_create_only_twice_conflicts(self, store: KvStore) -> None:
        cw = self._conditional_or_skip(store)
        first = cw.set_if("cw/k", b"one", version=None)
        assert first is not None
        with pytest.raises(VersionConflict) as info:
            cw.set_if("cw/k", b"two", version=None)
        assert errno_of(info.value) == errno.EAGAIN
        assert "cw/k" in str(info.value)
        store.flush()
        assert self.peek(store, "cw/k") == b"one"

    def test_if_match_current_version_succeeds_with_a_new_one(self, store: KvStore) -> None:
        cw = self._conditional_or_skip(store)
        first = cw.set_if("cw/k", b"one", version=None)
        second = cw.set_if("cw/k", b"two", version=first)
        assert second is not None
        assert second != first
        store.flush()
        assert self.peek(store, "cw/k") == b"two"
        assert cw.get_versioned("cw/k") == Versioned(b"two", second)
        assert cw.set_if("cw/k", b"three", version=second) not in (first, second)

    def test_stale_version_conflicts_and_keeps_the_value(self, store: KvStore) -> None:
        cw = self._conditional_or_skip(store)
        first = cw.set_if("cw/k", b"one", version=None)
        cw.set_if("cw/k", b"two", version=first)
        with pytest.raises(VersionConflict) as info:
            cw.set_if("cw/k", b"three", version=first)
        assert str(first) in str(info.value)
        store.flush()
        assert store.get("cw/k") == b"two"
        assert self.peek(store, "cw/k") == b"two"

    def test_another_writers_plain_write_makes_a_version_stale(self, store: KvStore) -> None:
        cw = self._conditional_or_skip(store)
        self.seed(store, "cw/k", b"seeded")
        read = cw.get_versioned("cw/k")
        assert read is not None
        assert read.data == b"seeded"
        self.seed(store, "cw/k", b"another writer's")
        with pytest.raises(VersionConflict):
            cw.set_if("cw/k", b"mine", version=read.version)
        assert self.peek(store, "cw/k") == b"another writer's"

    def test_if_match_of_an_absent_key_conflicts(self, store: KvStore) -> None:
        cw = self._conditional_or_skip(store)
        version = cw.set_if("cw/other", b"x", version=None)
        with pytest.raises(VersionConflict) as info:
            cw.set_if("cw/absent", b"x", version=version)
        assert "cw/absent" in str(info.value)
        store.delete("cw/other")
        with pytest.raises(VersionConflict):  # deleted since it was read
            cw.set_if("cw/other", b"y", version=version)
        store.flush()
        assert self.peek(store, "cw/absent") is None
        assert self.peek(store, "cw/other") is None

    def test_read_version_is_the_listed_and_stat_etag(self, store: KvStore) -> None:
        cw = self._conditional_or_skip(store)
        self.seed_many(store, [("cw/a", b"aaa"), ("cw/b", b"bb")])
        written = cw.set_if("cw/c", b"c", version=None)
        versions = {}
        for key in ("cw/a", "cw/b", "cw/c"):
            read = cw.get_versioned(key)
            assert read is not None
            assert read.version is not None
            versions[key] = read.version
            info = store.stat(key)
            assert info is not None
            assert info.etag == read.version
        assert versions["cw/c"] == written
        assert {k.key: k.etag for k in store.list("cw/").keys} == versions
        assert {k.key: k.etag for k in store.walk("cw/")} == versions
        assert cw.get_versioned("cw/absent") is None

    def test_read_only_wrapper_refuses_conditional_writes(self, store: KvStore) -> None:
        ro = ReadOnlyStore(store)
        assert (conditional_writes(ro) is None) is (conditional_writes(store) is None)
        with pytest.raises(ReadOnly):
            ro.set_if("cw/k", b"x", version=None)
        assert isinstance(ro.probe_conditional_writes(), str)
        store.flush()
        assert self.peek(store, "cw/k") is None

    # -- specs -----------------------------------------------------------------------------------

    def test_spec_round_trips(self, store: KvStore) -> None:
        spec = store.spec
        assert parse_spec(spec.to_json()) == spec
        assert parse_spec(spec) is spec
        assert parse_url(spec.to_url()).location == spec.location

    def test_reopened_from_spec_sees_data(self, store: KvStore) -> None:
        if not self.persistent:
            pytest.skip("this backend does not outlive its store object")
        from n5fs.kvstore import open_store

        store.set("re/k", b"persisted")
        store.flush()
        with open_store(store.spec.to_json()) as again:
            assert again.get("re/k") == b"persisted"
