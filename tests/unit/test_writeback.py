"""Write-back: writes acknowledged from a local journal, uploaded behind, replayed after a
crash. Races are made deterministic with gates on the inner store's calls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from n5fs.errors import ReadOnly, StoreUnavailable, UploadsPending
from n5fs.kvstore.abilities import write_back
from n5fs.kvstore.base import ByteRange
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.kvstore.wrappers import ReadOnlyStore
from n5fs.kvstore.writeback import Journal, WriteBackStore, journal_root
from n5fs.testing.doubles import CountingStore, FaultyStore

pytestmark = pytest.mark.debug_locks


def is_doc(key: str) -> bool:
    return key.endswith(".zarray")


def make(inner, state: Path, **kw) -> WriteBackStore:
    journal = Journal.open(journal_root(state), inner.spec.to_url())
    return WriteBackStore(inner, journal, write_through=is_doc, **kw)


def in_thread(fn, *args):
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_set_returns_before_the_upload_and_reads_see_it(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate("set", "a/0", when="before")
    store = make(inner, tmp_path)
    store.set("a/0", b"hello world")
    assert inner.inner.get("a/0") is None  # not in the store yet
    assert store.get("a/0") == b"hello world"
    assert store.get("a/0", ByteRange(6, 5)) == b"world"
    assert store.stat("a/0").size == 11
    assert [k.key for k in store.list("a/").keys] == ["a/0"]
    assert store.list("").prefixes == ("a/",)
    assert [k.key for k in store.walk("")] == ["a/0"]
    assert not store.nothing_at("a/0")
    assert store.writeback_report()["writeback_pending_files"] == 1
    gate.release()
    store.flush()
    assert inner.inner.get("a/0") == b"hello world"
    assert store.journal.pending_on_disk() == 0
    report = store.writeback_report()
    assert report["writeback_pending_files"] == 0
    assert report["writeback_uploaded"] == 1
    store.close()


def test_a_later_write_of_a_key_in_flight_lands_last(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    landed: list[bytes | None] = []
    inner.hook("set", lambda call: landed.append(inner.inner.get("k")), key="k", when="after")
    gate = inner.gate("set", "k", when="after")  # v1 is stored, its upload not yet ended
    store = make(inner, tmp_path)
    store.set("k", b"v1")
    gate.wait_reached()
    store.set("k", b"v2")
    assert store.get("k") == b"v2"
    gate.release()
    store.flush()
    assert inner.inner.get("k") == b"v2"
    assert landed == [b"v1", b"v2"]
    assert store.journal.pending_on_disk() == 0
    store.close()


def test_a_replaced_write_not_yet_started_is_never_uploaded(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate("set", "blocker", when="before")
    store = make(inner, tmp_path, uploaders=1)
    store.set("blocker", b"x")
    gate.wait_reached()
    store.set("k", b"v1")
    store.set("k", b"v2")
    gate.release()
    store.flush()
    assert inner.inner.get("k") == b"v2"
    assert inner.count("set", "k") == 1
    store.close()


def test_a_delete_lands_after_the_upload_in_flight_of_its_key(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate("set", "k", when="before")
    store = make(inner, tmp_path)
    store.set("k", b"v1")
    gate.wait_reached()
    store.delete("k")  # journaled: it returns at once, and the key is gone for readers
    assert store.get("k") is None
    assert store.stat("k") is None
    assert [k.key for k in store.list("").keys] == []
    assert inner.count("delete", "k") == 0  # not sent while the upload is in flight
    gate.release()
    store.flush()
    assert [c.op for c in inner.calls_of(("set", "delete"), "k")] == ["set", "delete"]
    assert inner.inner.get("k") is None
    store.close()


def test_a_document_delete_is_synchronous_after_its_folder(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    inner.inner.set("a/.zarray", b"{}")
    store = make(inner, tmp_path)
    store.delete("a/0")
    store.delete("a/.zarray")  # the chunk's delete lands first, then this one, at once
    assert [c.key for c in inner.calls_of("delete")] == ["a/0", "a/.zarray"]
    assert inner.inner.get("a/.zarray") is None
    store.close()


def test_a_delete_of_a_pending_write_drops_it(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate("set", "blocker", when="before")
    store = make(inner, tmp_path, uploaders=1)
    store.set("blocker", b"x")
    gate.wait_reached()
    store.set("k", b"v1")
    store.delete("k")  # never stored: no KeyNotFound either
    assert store.get("k") is None
    gate.release()
    store.flush()
    assert inner.count("set", "k") == 0
    assert inner.inner.get("k") is None
    store.close()


def test_a_document_waits_for_the_pending_writes_of_its_folder(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate("set", "a/0/0", when="before")
    store = make(inner, tmp_path)
    store.set("a/0/0", b"chunk")
    store.set("b/0", b"other array")
    gate.wait_reached()
    thread, out = in_thread(store.set, "a/.zarray", b"{}")
    thread.join(0.2)
    assert thread.is_alive()  # the barrier: a/0/0 first
    assert inner.count("set", "a/.zarray") == 0
    gate.release()
    thread.join(10)
    assert "error" not in out
    order = [c.key for c in inner.calls_of("set") if c.key.startswith("a/")]
    assert order == ["a/0/0", "a/.zarray"]
    assert inner.inner.get("a/.zarray") == b"{}"  # written through: stored on return
    store.close()


def test_fsync_answers_a_failed_upload_and_nothing_is_dropped(tmp_path: Path) -> None:
    faulty = FaultyStore(MemoryStore())
    faulty.fail("set", times=None)
    store = make(faulty, tmp_path)
    store.set("k", b"value")
    with pytest.raises(UploadsPending, match="stay journaled"):
        store.flush_key("k")
    assert store.get("k") == b"value"
    report = store.writeback_report()
    assert report["writeback_failing"] == 1
    assert report["writeback_pending_files"] == 1
    faulty.heal()
    store.flush_key("k")  # tried again at once, not after its back-off
    assert faulty.inner.get("k") == b"value"
    store.close()


def test_a_full_journal_makes_writes_synchronous(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate("set", "big", when="before")
    store = make(inner, tmp_path, limit=10_000, room_wait=0.1)
    store.set("big", b"x" * 9_000)
    gate.wait_reached()
    store.set("small", b"y" * 2_000)  # no room: written in this thread, now
    assert inner.inner.get("small") == b"y" * 2_000
    gate.release()
    store.close()
    assert inner.inner.get("big") == b"x" * 9_000


def test_refused_names_are_refused_before_they_are_journaled(tmp_path: Path) -> None:
    store = make(ReadOnlyStore(MemoryStore()), tmp_path)
    with pytest.raises(ReadOnly):
        store.set("k", b"v")
    assert store.journal.pending_on_disk() == 0
    store.close()


def test_a_journaled_file_is_renamed_inside_the_journal(tmp_path: Path) -> None:
    inner = CountingStore(MemoryStore())
    gate = inner.gate(("set", "delete", "rename", "copy"), when="before", times=None)
    store = make(inner, tmp_path)
    store.set("a/.tmp123", b"bytes")
    store.rename("a/.tmp123", "a/0")  # a writer's temp file over its chunk: no round trip
    assert store.get("a/0") == b"bytes"
    assert store.get("a/.tmp123") is None
    assert [k.key for k in store.list("a/").keys] == ["a/0"]
    assert not gate.reached or all(c.op != "rename" for c in gate.reached)
    gate.release()
    store.flush()
    assert inner.inner.get("a/0") == b"bytes"
    assert inner.inner.get("a/.tmp123") is None
    assert inner.count("rename") == 0
    store.close()


def test_a_stored_file_is_renamed_in_the_store(tmp_path: Path) -> None:
    base = MemoryStore()
    base.set("src", b"old")
    inner = CountingStore(base)
    store = make(inner, tmp_path)
    store.rename("src", "dst")
    assert base.get("dst") == b"old"
    assert base.get("src") is None
    store.close()


def test_a_folder_whose_keys_are_all_deleted_is_not_listed(tmp_path: Path) -> None:
    base = MemoryStore()
    base.set("a/d/0", b"1")
    base.set("a/d/1", b"1")
    base.set("a/keep/0", b"1")
    inner = CountingStore(base)
    gate = inner.gate("delete", when="before", times=None)
    store = make(inner, tmp_path)
    store.delete("a/d/0")
    store.delete("a/d/1")
    assert store.list("a/").prefixes == ("a/keep/",)
    store.set("a/d/2", b"new")
    assert store.list("a/").prefixes == ("a/d/", "a/keep/")
    gate.release()
    store.close()


def test_listing_merges_pending_keys_and_folders(tmp_path: Path) -> None:
    base = MemoryStore()
    base.set("a/stored", b"1")
    inner = CountingStore(base)
    gate = inner.gate("set", when="before", times=None)
    store = make(inner, tmp_path)
    store.set("a/new", b"22")
    store.set("a/sub/deep", b"333")
    listing = store.list("a/")
    assert [(k.key, k.size) for k in listing.keys] == [("a/new", 2), ("a/stored", 1)]
    assert listing.prefixes == ("a/sub/",)
    assert [k.key for k in store.walk("a/")] == ["a/new", "a/stored", "a/sub/deep"]
    gate.release()
    store.close()


def test_write_back_is_an_ability_of_the_wrapper_only(tmp_path: Path) -> None:
    inner = MemoryStore()
    assert write_back(inner) is None
    store = make(inner, tmp_path)
    assert write_back(store) is store
    store.close()


def test_two_live_journals_of_one_source_take_separate_folders(tmp_path: Path) -> None:
    root = journal_root(tmp_path)
    first = Journal.open(root, "memory://x")
    second = Journal.open(root, "memory://x")
    assert first.folder != second.folder
    first.close()
    second.close()
    assert not any(root.glob("*-*"))  # emptied folders go


def test_a_damaged_entry_is_set_aside_not_uploaded(tmp_path: Path) -> None:
    root = journal_root(tmp_path)
    journal = Journal.open(root, "memory://x")
    entry = journal.append("k", value=b"abcdef")
    good = journal.append("g", value=b"good")
    os.close(journal._lock_fd)  # the mount died: its lock is free
    with open(entry.path, "r+b") as f:
        f.seek(entry.offset)
        f.write(b"X")
    again = Journal.open(root, "memory://x")
    assert [(e.key, e.size) for e in again.replayed] == [("g", 4)]
    assert Journal.read(again.replayed[0]) == b"good"
    assert any((root / "damaged").iterdir())
    assert good.path.name in {e.path.name for e in again.replayed}
    again.close()


CRASHER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from n5fs.kvstore.file import FileStore
    from n5fs.kvstore.writeback import Journal, WriteBackStore, journal_root
    from n5fs.testing.doubles import FaultyStore

    inner = FaultyStore(FileStore(sys.argv[1]))
    inner.fail("set", times=None)  # the network is down: nothing lands
    journal = Journal.open(journal_root(Path(sys.argv[2])), inner.spec.to_url())
    store = WriteBackStore(inner, journal)
    for i in range(50):
        store.set(f"a/{i}", bytes([i]) * (100 + i))
    print("accepted", flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_kill_9_loses_nothing_accepted(tmp_path: Path) -> None:
    data, state = tmp_path / "data", tmp_path / "state"
    data.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", CRASHER, str(data), str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert "accepted" in run.stdout, run.stderr
    assert run.returncode == -9
    inner = FileStore(str(data))
    assert inner.get("a/0") is None  # nothing reached the store
    store = make(inner, state)
    assert store.writeback_report()["writeback_replayed"] == 50
    assert store.get("a/7") == bytes([7]) * 107  # readable before it lands
    store.flush()
    for i in range(50):
        assert inner.get(f"a/{i}") == bytes([i]) * (100 + i)
    store.close()
    assert not any(journal_root(state).glob("*-*"))


def test_an_unreachable_store_at_close_keeps_the_journal(tmp_path: Path) -> None:
    faulty = FaultyStore(MemoryStore())
    faulty.fail("set", error=StoreUnavailable, times=None)
    store = make(faulty, tmp_path)
    store.set("k", b"v")
    store.close()  # one attempt failed: said in the log, kept on disk
    again = Journal.open(journal_root(tmp_path), faulty.spec.to_url())
    assert [(e.key, Journal.read(e)) for e in again.replayed] == [("k", b"v")]
    again.close()


def test_a_temp_file_renamed_at_once_is_never_uploaded_under_its_temp_name(
    tmp_path: Path,
) -> None:
    inner = CountingStore(MemoryStore())
    store = make(inner, tmp_path, delay=30.0)  # no upload starts unless waited for
    store.set("a/0.123.partial", b"chunk")
    store.rename("a/0.123.partial", "a/0")
    store.flush()  # waited for: uploaded now, delay or not
    assert inner.inner.get("a/0") == b"chunk"
    assert inner.count("set", "a/0.123.partial") == 0
    assert inner.count("rename") == 0
    store.close()


def test_readers_of_local_files_and_names_never_go_around_the_journal(tmp_path: Path) -> None:
    from n5fs.kvstore.abilities import local_files, name_listings

    inner = FileStore(str(tmp_path / "data"))
    assert local_files(inner) is not None
    store = make(inner, tmp_path / "state")
    assert local_files(store) is None
    assert name_listings(store) is None
    store.close()


@pytest.mark.parametrize("seed", range(3))
def test_threads_writing_deleting_and_renaming_end_where_a_model_says(
    tmp_path: Path, seed: int
) -> None:
    """8 threads, each on its own keys, set, delete and rename at random while uploads run
    (no delay, 4 uploaders, so jobs are replaced in flight); after flush the store holds
    exactly what each thread's sequence says, and so does every read before it."""
    import random

    inner = MemoryStore()
    store = make(inner, tmp_path, delay=0.0, uploaders=4)
    models: list[dict[str, bytes]] = [{} for _ in range(8)]
    wrong: list[str] = []

    def work(n: int) -> None:
        rng = random.Random(seed * 100 + n)
        model = models[n]
        for i in range(250):
            key = f"t{n}/k{rng.randrange(6)}"
            op = rng.random()
            if op < 0.6:
                value = b"%d-%d" % (n, i)
                store.set(key, value)
                model[key] = value
            elif op < 0.8:
                store.delete(key)
                model.pop(key, None)
            elif key in model:
                dst = f"t{n}/k{rng.randrange(6)}"
                if dst != key:
                    store.rename(key, dst)
                    model[dst] = model.pop(key)
            probe = f"t{n}/k{rng.randrange(6)}"
            if store.get(probe) != model.get(probe):
                wrong.append(probe)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    store.flush()
    assert wrong == []
    expected = {k: v for model in models for k, v in model.items()}
    held = {info.key: inner.get(info.key) for info in inner.list("", delimiter=None).keys}
    assert held == expected
    assert store.journal.pending_on_disk() == 0
    store.close()
