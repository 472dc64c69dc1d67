"""The S3 times index on its own (:mod:`n5fs.kvstore.s3.times`), over index objects kept in a
dict: which listed entries take a kept time, what a flush writes, and what it does when the
write fails or another writer got there first."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

from n5fs.errors import StoreUnavailable, VersionConflict
from n5fs.kvstore.base import KeyInfo
from n5fs.kvstore.s3.headers import format_mtime
from n5fs.kvstore.s3.times import INDEX_NAME, KeptTimes, parse, render
from tests.mounting import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

KEPT = 1_000_000_000.0


class Objects:
    """Index objects with versions, compare-and-swap as S3's ``If-Match`` does."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, str]] = {}
        self.requests: list[str] = []
        self.fail_writes = 0
        self._n = 0

    def read_index(self, key: str) -> tuple[bytes, str] | None:
        self.requests.append(f"GET {key}")
        return self.data.get(key)

    def write_index(self, key: str, data: bytes, version: str | None) -> str:
        self.requests.append(f"PUT {key}")
        if self.fail_writes:
            self.fail_writes -= 1
            raise StoreUnavailable("the endpoint is away")
        current = self.data.get(key)
        if (current[1] if current else None) != version:
            raise VersionConflict(key)
        self._n += 1
        etag = f'"e{self._n}"'
        self.data[key] = (data, etag)
        return etag

    def delete_index(self, key: str) -> None:
        self.requests.append(f"DELETE {key}")
        self.data.pop(key, None)

    def entries(self, folder: str) -> dict[str, float]:
        held = self.data.get(folder + INDEX_NAME)
        return {} if held is None else {n: e.mtime for n, e in parse(held[0]).items()}


@pytest.fixture
def objects() -> Objects:
    return Objects()


@pytest.fixture
def times(objects: Objects) -> Iterator[KeptTimes]:
    kept = KeptTimes(objects, format_mtime, delay=3600)  # written only when flushed here
    kept.shown = True
    yield kept
    kept.close()


def listed(times: KeptTimes, objects: Objects, folder: str, *infos: KeyInfo) -> list[float]:
    held = objects.data.get(folder + INDEX_NAME)
    indexes = {} if held is None else {folder: held[1]}
    return [i.mtime for i in times.listed(list(infos), indexes, whole=folder)]


def test_an_entry_applies_only_to_the_bytes_it_was_set_on(
    times: KeptTimes, objects: Objects
) -> None:
    times.kept("d/f", KEPT, '"abc"', 4)
    same, other_bytes, other_size = (
        KeyInfo("d/f", 4, 5.0, '"abc"'),
        KeyInfo("d/f", 4, 5.0, '"def"'),
        KeyInfo("d/f", 5, 5.0, '"abc"'),
    )
    for info, shown in ((same, KEPT), (other_bytes, 5.0), (other_size, 5.0)):
        assert listed(times, objects, "d/", info) == [shown]
    times.flush()
    assert objects.entries("d/") == {"f": KEPT}
    fresh = KeptTimes(objects, format_mtime)
    fresh.shown = True
    assert listed(fresh, objects, "d/", KeyInfo("d/f", 4, 5.0, "abc")) == [KEPT]  # unquoted
    fresh.close()


def test_listings_show_nothing_kept_unless_asked(times: KeptTimes, objects: Objects) -> None:
    times.kept("d/f", KEPT, '"abc"', 4)
    times.shown = False
    assert listed(times, objects, "d/", KeyInfo("d/f", 4, 5.0, '"abc"')) == [5.0]


def test_a_time_set_and_renamed_away_before_the_flush_costs_no_request(
    times: KeptTimes, objects: Objects
) -> None:
    """rsync's temp file: its entry is noted, then removed, before any index was written."""
    times.kept("d/.f.XYZ", KEPT, '"abc"', 4)
    times.removed("d/.f.XYZ")
    times.flush()
    assert objects.requests == []


def test_a_failed_write_is_tried_again(times: KeptTimes, objects: Objects) -> None:
    objects.fail_writes = 1
    times.kept("d/f", KEPT, '"abc"', 4)
    times.flush()
    assert objects.entries("d/") == {}
    assert listed(times, objects, "d/", KeyInfo("d/f", 4, 5.0, '"abc"')) == [KEPT]  # still ours
    times.flush()
    assert objects.entries("d/") == {"f": KEPT}


def test_a_refused_write_reads_the_other_writer_s_index_and_merges(objects: Objects) -> None:
    a, b = KeptTimes(objects, format_mtime), KeptTimes(objects, format_mtime)
    a.kept("d/f", KEPT, '"abc"', 4)
    b.kept("d/g", KEPT + 1, '"def"', 4)
    a.flush()
    b.flush()  # created blind, refused, read, merged
    assert objects.entries("d/") == {"f": KEPT, "g": KEPT + 1}
    a.close()
    b.close()
    index = f"d/{INDEX_NAME}"
    assert objects.requests == [f"PUT {index}", f"PUT {index}", f"GET {index}", f"PUT {index}"]


def test_removing_every_entry_deletes_the_index(times: KeptTimes, objects: Objects) -> None:
    times.kept("d/f", KEPT, '"abc"', 4)
    times.flush()
    times.removed("d/f")
    times.flush()
    assert objects.data == {}


def test_a_removed_prefix_drops_the_edits_below_it(times: KeptTimes, objects: Objects) -> None:
    times.kept("d/e/f", KEPT, '"abc"', 4)
    times.kept("x/f", KEPT, '"abc"', 4)
    times.drop_under("d/")
    times.flush()
    assert set(objects.data) == {f"x/{INDEX_NAME}"}


def test_an_index_that_is_not_one_shows_no_time(times: KeptTimes, objects: Objects) -> None:
    objects.data[f"d/{INDEX_NAME}"] = (b"not json", '"e0"')
    assert listed(times, objects, "d/", KeyInfo("d/f", 4, 5.0, '"abc"')) == [5.0]
    assert parse(render({}, format_mtime)) == {}


def test_the_flusher_writes_without_being_asked(objects: Objects) -> None:
    before = set(threading.enumerate())
    times = KeptTimes(objects, format_mtime, delay=0.01)
    times.kept("d/f", KEPT, '"abc"', 4)
    wait_until(lambda: objects.entries("d/") == {"f": KEPT}, "the flusher writes the index")
    times.close()
    assert not [t for t in threading.enumerate() if t.name == "n5fs-s3-times" and t not in before]


def test_chunks_rewritten_beside_timed_files_cost_no_index_write(
    times: KeptTimes, objects: Objects
) -> None:
    times.kept("d/f", KEPT, '"abc"', 4)
    times.flush()
    listed(times, objects, "d/", KeyInfo("d/f", 4, 5.0, '"abc"'))
    before = list(objects.requests)
    times.removed("d/0")  # a plain write of a key the index does not name
    times.flush()
    assert objects.requests == before
