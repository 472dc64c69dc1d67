"""Chunk checks that run while a chunk is written (n5fs.gateway.commit.prevalidate) decide exactly
what the full check at commit decides.

A corpus of chunks - written by z5py and TensorStore inside the test, then spoiled
(truncated, bombs, wrong headers, trailing bytes, flipped bytes, concatenated gzip members) -
is committed through two gateways over the same metadata: one that checks while the bytes
arrive, one that only checks in full at commit. Accept/refuse, rule and message must agree
for every chunk, whether it is written sequentially, in pieces out of order, or with a
truncate in the middle; and the fast path must actually have been taken for every valid
chunk written sequentially (the ``prechecked`` counter), so the comparison is not vacuous.
The race of a metadata change between the start of a check and its commit is made
deterministic twice: in program order, and with a hook that holds a commit between the end
of its check and its commit-order hold while another thread changes the metadata.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import z5py
import zarr

from n5fs.codecs.n5_header import decode_header
from n5fs.errors import Rejected
from n5fs.formats.n5 import N5ArrayNode, N5Format
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.commit import streamcheck
from n5fs.gateway.commit.prevalidate import Prechecks
from n5fs.gateway.commit.streamcheck import passes
from n5fs.gateway.write.staging import StagedFile
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from tests.writers import tensorstore_n5

WAIT = 30.0
SHAPE, CHUNKS = (150, 70), (64, 32)  # numpy order: interior and clipped end blocks
#: dataset -> z5py compression and options (None: TensorStore writes it, with this compression)
DATASETS: dict[str, tuple[str, dict[str, Any]] | dict[str, Any]] = {
    "raw": ("raw", {}),
    "gzip": ("gzip", {"level": 5}),
    "bzip2": ("bzip2", {"level": 3}),
    "xz": ("xz", {"level": 1}),
    "zlib": {"type": "gzip", "useZlib": True},  # TensorStore
    "gzip-ts": {"type": "gzip"},  # TensorStore: full-size end blocks
    "blosc": ("blosc", {}),  # not checked while written: the full check alone decides
}
HANDLED = {"raw", "gzip", "bzip2", "xz", "zlib", "gzip-ts"}
Outcome = tuple[str, str] | None


def values() -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(12)
    ramp = np.arange(SHAPE[0] * SHAPE[1], dtype=np.uint32).reshape(SHAPE)
    return ((ramp * 7) % 50_000 + rng.integers(0, 16, SHAPE)).astype("uint16")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pre") / "data.n5"
    f = z5py.File(str(root), mode="w")
    for name, how in DATASETS.items():
        if isinstance(how, tuple):
            ds = f.create_dataset(name, shape=SHAPE, chunks=CHUNKS, dtype="uint16",
                                  compression=how[0], **how[1])  # fmt: skip
            ds[...] = values()
        else:
            tensorstore_n5(root / name, values(), list(CHUNKS), how)
    return root


def metadata(root: Path) -> dict[str, bytes]:
    """Every attributes.json, the root's first."""
    found = sorted(root.rglob("attributes.json"), key=lambda p: len(p.parts))
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in found}


def chunks(root: Path, name: str) -> dict[str, bytes]:
    folder = root / name
    return {
        f"{name}/{p.relative_to(folder).as_posix()}": p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "attributes.json"
    }


def node(root: Path, name: str) -> N5ArrayNode:
    parsed = N5Format().parse_metadata(
        "attributes.json", (root / name / "attributes.json").read_bytes()
    )
    assert isinstance(parsed, N5ArrayNode)
    return parsed


def gateway(root: Path, *, checks: bool = True, **config: Any) -> Gateway:
    gw = Gateway(MemoryStore(), GatewayConfig(**config))
    for key, data in metadata(root).items():
        gw.write_file("/" + key, data)
    if not checks:  # the full check alone, as before chunks were checked while written
        gw.committer.prechecks = None
        gw.rules.streaming = False
    return gw


# == the corpus =====================================================================================


def spoiled(data: bytes, array: N5ArrayNode) -> Iterator[tuple[str, bytes]]:
    """The chunk, then what a broken writer, a bomb or a hand edit makes of it."""
    header = decode_header(data)
    head, payload = data[: header.size], data[header.size :]
    yield "valid", data
    yield "empty", b""
    yield "cut in the header", data[:3]
    yield "header only", head
    yield "cut in half", data[: len(data) // 2]
    yield "last byte missing", data[:-1]
    yield "one byte more", data + b"x"
    yield "zeros after", data + bytes(8)  # gzip allows them (gzip(1) pads), others refuse
    flipped = bytearray(data)
    flipped[header.size + len(payload) // 2] ^= 0x5A
    yield "flipped byte", bytes(flipped)
    yield "mode 2", b"\x00\x02" + data[2:]
    yield (
        "mode 1 (varlength) count too big",
        (b"\x00\x01" + data[2 : header.size] + (10**9).to_bytes(4, "big") + payload),
    )
    yield (
        "three dims",
        data[:2] + b"\x00\x03" + data[4 : header.size] + b"\x00\x00\x00\x01" + payload,
    )
    dims = list(header.dims)
    dims[0] -= 1
    small = data[:4] + b"".join(d.to_bytes(4, "big") for d in dims)
    decoded = array.compression.decode(payload, 1 << 30)
    yield "smaller dims, same payload", small + payload
    yield (
        "smaller dims, matching payload",
        small + array.compression.encode(decoded[: len(decoded) * dims[0] // header.dims[0]]),
    )
    yield "bomb", head + array.compression.encode(bytes(64 * len(decoded) + 4096))
    yield "short payload", head + array.compression.encode(decoded[:-2])
    if array.compression.type == "gzip" and not getattr(array.compression, "use_zlib", False):
        half = len(decoded) // 2
        members = gzip.compress(decoded[:half]) + gzip.compress(decoded[half:])
        yield "two gzip members", head + members  # legal (gzip(1) writes them)
        yield "zlib instead of gzip", head + zlib.compress(decoded)


def outcome(gw: Gateway, key: str, data: bytes, pieces: list[tuple[int, bytes]],
            between: Callable[[int], None] | None = None) -> Outcome:  # fmt: skip
    """Create, write ``pieces`` in the order given, flush: None when stored (and then the
    store holds exactly ``data``), else the refusal's rule and message."""
    fh = gw.create("/" + key, os.O_WRONLY | os.O_TRUNC)
    try:
        for i, (offset, piece) in enumerate(pieces):
            gw.write(fh, piece, offset)
            if between is not None:
                between(i)
        gw.flush(fh)
    except Rejected as exc:
        return exc.rule, exc.message
    finally:
        gw.release(fh)
    assert gw.store.get(key) == data
    return None


def sequential(data: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(off, data[off : off + size]) for off in range(0, len(data), size)]


def prechecked(gw: Gateway) -> int:
    return gw.stats()["prechecked"]


@pytest.mark.parametrize("name", list(DATASETS))
def test_checked_while_written_decides_as_the_full_check(source: Path, name: str) -> None:
    fast, full = gateway(source), gateway(source, checks=False)
    array = node(source, name)
    expected_fast = 0
    for key, data in chunks(source, name).items():
        for what, spoilt in spoiled(data, array):
            for size in (1000, 1 << 20):
                before = prechecked(fast)
                got = outcome(fast, key, spoilt, sequential(spoilt, size))
                want = outcome(full, key, spoilt, sequential(spoilt, size))
                assert got == want, (key, what, size)
                used = prechecked(fast) - before
                assert used <= (want is None), (key, what)  # a refusal is never prechecked
                if what == "valid":
                    assert want is None
                    expected_fast += name in HANDLED
                    assert used == (name in HANDLED), (key, size)
    assert full.stats()["prechecked"] == 0
    assert prechecked(fast) >= expected_fast  # (a raw chunk with a flipped byte is valid too)


@pytest.mark.parametrize("name", list(DATASETS))
def test_streaming_check_of_a_whole_chunk_accepts_only_what_the_full_check_accepts(
    source: Path, name: str
) -> None:
    """``passes`` (used at commit before the full check, and for chunks stored before their
    metadata) is sound: it never accepts what ``validate_chunk`` refuses, and it accepts
    every valid chunk of a codec it handles."""
    array = node(source, name)
    for key, data in chunks(source, name).items():
        position = tuple(int(p) for p in key.split("/")[1:])
        for what, spoilt in spoiled(data, array):
            if passes(array, position, spoilt):
                array.validate_chunk(position, spoilt)  # raises if unsound
            elif what == "valid":
                assert name not in HANDLED, key
    outside = tuple(g for g in array.grid)
    assert not passes(array, outside, next(iter(chunks(source, name).values())))


@pytest.mark.parametrize("name", sorted(HANDLED))
def test_a_header_split_across_pieces_is_read_whole(source: Path, name: str) -> None:
    """The block header may arrive in pieces of any size (the parser keeps only its bytes,
    and hands the rest of a piece to the decoder as it is): the verdict does not change."""
    array = node(source, name)
    key, data = next(iter(chunks(source, name).items()))
    position = tuple(int(p) for p in key.split("/")[1:])
    size = decode_header(data).size
    for cut in [*range(1, size + 2), 64 << 10]:
        for step in (1, 3, cut):
            parser = streamcheck.parser_for(array, position)
            assert parser is not None
            view = memoryview(data)
            end = min(cut, len(data))
            pieces = [view[i : min(i + step, end)] for i in range(0, end, step)]
            for piece in [*pieces, view[cut:]]:
                if len(piece):
                    parser.feed(piece)
            assert parser.complete(), (cut, step)
    wrong = bytearray(data)
    wrong[4:8] = (int.from_bytes(wrong[4:8], "big") + 1).to_bytes(4, "big")  # a dimension
    parser = streamcheck.parser_for(array, position)
    assert parser is not None

    def byte_by_byte() -> None:
        for i in range(len(wrong)):
            parser.feed(memoryview(wrong)[i : i + 1])

    with pytest.raises(streamcheck.Unsure):
        byte_by_byte()


@pytest.mark.parametrize("name", ["gzip", "raw", "xz"])
def test_out_of_order_writes_and_truncates_fall_back_to_the_full_check(
    source: Path, name: str
) -> None:
    fast, full = gateway(source), gateway(source, checks=False)
    array = node(source, name)
    rng = random.Random(5)
    for key, data in chunks(source, name).items():
        for what, spoilt in spoiled(data, array):
            pieces = sequential(spoilt, 700)
            if len(pieces) < 3:
                continue
            want = outcome(full, key, spoilt, pieces)
            before = prechecked(fast)
            shuffled = pieces[:]
            rng.shuffle(shuffled)
            if shuffled == pieces:  # by chance in order: that is the sequential case
                shuffled.reverse()
            assert outcome(fast, key, spoilt, shuffled) == want, (key, what)
            assert outcome(fast, key, spoilt, pieces[::-1]) == want, (key, what)

            def cut(i: int, key: str = key, middle: int = len(pieces) // 2) -> None:
                """A truncate in the middle (to 10 bytes) through a second handle."""
                if i == middle:
                    fh = fast.open("/" + key, os.O_WRONLY)
                    fast.truncate("/" + key, 10, fh)
                    fast.release(fh)

            redo = [*pieces, (10, spoilt[10:])]  # the rest again after the cut
            assert outcome(fast, key, spoilt, redo, between=cut) == want, (key, what)
            assert prechecked(fast) == before, (key, what)  # never the fast path


def test_a_truncate_to_the_size_written_keeps_the_check(source: Path) -> None:
    gw = gateway(source)
    key, data = next(iter(chunks(source, "gzip").items()))
    fh = gw.create("/" + key, os.O_WRONLY | os.O_TRUNC)
    gw.write(fh, data[:500], 0)
    gw.truncate("/" + key, 500, fh)  # no change: the check goes on
    gw.write(fh, data[500:], 500)
    gw.flush(fh)
    gw.release(fh)
    assert prechecked(gw) == 1
    assert gw.store.get(key) == data


def test_a_failing_check_falls_back_to_the_full_check(
    source: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the streaming decoder never passes a chunk: the commit checks in full."""

    def broken(self: object, data: bytes) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(streamcheck._N5Chunk, "feed", broken)
    gw = gateway(source)
    key, data = next(iter(chunks(source, "gzip").items()))
    assert outcome(gw, key, data, sequential(data, 100)) is None
    bad = data[:-5]
    assert outcome(gw, key, bad, sequential(bad, 100)) is not None
    assert prechecked(gw) == 0
    assert "chunk check failed" in caplog.text


def test_no_staging_memory_means_no_check(source: Path) -> None:
    """The queued bytes come out of the staging budget; without room the check is dropped
    (and the commit checks in full), it never takes memory the budget does not grant."""
    gw = gateway(source, staging_bytes=1 << 20)
    key, data = next(iter(chunks(source, "raw").items()))
    assert gw.budget.reserve(gw.budget.max_bytes - gw.budget.used)  # exhaust it
    assert outcome(gw, key, data, sequential(data, 1000)) is None
    assert prechecked(gw) == 0


def test_validate_off_runs_no_checks(source: Path) -> None:
    gw = gateway(source, validate="off")
    assert gw.committer.prechecks is None
    key, data = next(iter(chunks(source, "gzip").items()))
    assert outcome(gw, key, data[:-1], sequential(data[:-1], 100)) is None


# == metadata that changes under a check ================================================================


def _changed(source: Path, name: str, **changes: Any) -> bytes:
    doc = json.loads((source / name / "attributes.json").read_bytes())
    doc.update(changes)
    return json.dumps(doc).encode()


def test_metadata_changed_after_the_check_started_is_checked_against(source: Path) -> None:
    """The check passed the chunk against uint16; the dtype became uint8 before the
    commit: the commit sees the new metadata and checks in full, which refuses."""
    gw = gateway(source)
    key, data = next(iter(chunks(source, "gzip").items()))
    fh = gw.create("/" + key, os.O_WRONLY | os.O_TRUNC)
    for offset, piece in sequential(data, 1000):
        gw.write(fh, piece, offset)
    gw.write_file("/gzip/attributes.json", _changed(source, "gzip", dataType="uint8"))
    with pytest.raises(Rejected) as refused:
        gw.flush(fh)
    gw.release(fh)
    assert refused.value.rule == "decoded-size"
    assert prechecked(gw) == 0
    assert gw.store.get(key) is None


def test_metadata_changed_without_touching_the_array_keeps_the_check(source: Path) -> None:
    """User attributes live in the same attributes.json; an equal array node keeps the
    check (raw attributes are not part of a node's equality nor of a chunk's validity)."""
    gw = gateway(source)
    key, data = next(iter(chunks(source, "gzip").items()))
    fh = gw.create("/" + key, os.O_WRONLY | os.O_TRUNC)
    gw.write(fh, data, 0)
    gw.write_file("/gzip/attributes.json", _changed(source, "gzip", note="hello"))
    gw.flush(fh)
    gw.release(fh)
    assert prechecked(gw) == 1
    assert gw.store.get(key) == data


def test_metadata_commit_between_check_and_commit_order(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hold a chunk commit after its check finished (passed, against uint16) and before it
    takes the commit order; another thread changes the dtype meanwhile. The commit
    classifies inside the order, sees uint8, checks in full and refuses."""
    gw = gateway(source)
    key, data = next(iter(chunks(source, "gzip").items()))
    reached, go = threading.Event(), threading.Event()
    finish = Prechecks.finish

    def held_finish(staged: Any) -> Any:
        result = finish(staged)
        if result is not None:  # the chunk's commit (the metadata commit has no check)
            assert result.passed
            reached.set()
            assert go.wait(WAIT)
        return result

    monkeypatch.setattr(Prechecks, "finish", staticmethod(held_finish))
    fh = gw.create("/" + key, os.O_WRONLY | os.O_TRUNC)
    gw.write(fh, data, 0)
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            gw.flush(fh)
        except Rejected as exc:
            errors.append(exc)

    worker = threading.Thread(target=commit)
    worker.start()
    assert reached.wait(WAIT)
    gw.write_file("/gzip/attributes.json", _changed(source, "gzip", dataType="uint8"))
    go.set()
    worker.join(WAIT)
    assert not worker.is_alive()
    gw.release(fh)
    assert len(errors) == 1
    assert isinstance(errors[0], Rejected)
    assert prechecked(gw) == 0
    assert gw.store.get(key) is None


# == chunks copied before their metadata ================================================================


@pytest.mark.parametrize("workers", [1, 4])
def test_chunks_stored_before_their_metadata_are_judged_in_listing_order(
    source: Path, workers: int
) -> None:
    """``cp -r`` may copy chunks before the array's attributes.json; that commit then checks
    every stored chunk, on ``workers`` threads, and reports the first problem in listing
    order (a truncated chunk before a flipped one), whatever finished first."""
    gw = Gateway(MemoryStore())
    gw.committer.rules._pool.workers = workers
    gw.write_file("/attributes.json", metadata(source)["attributes.json"])
    stored = sorted(chunks(source, "gzip").items())
    assert len(stored) > 7
    for i, (key, data) in enumerate(stored):
        if i == 3:
            data = data[:-9]
        elif i == 6:
            data = data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]
        gw.write_file("/" + key, data)  # no metadata yet: plain files
    with pytest.raises(Rejected) as refused:
        gw.write_file("/gzip/attributes.json", metadata(source)["gzip/attributes.json"])
    assert refused.value.rule == "stored-chunk-invalid"
    assert f"/{stored[3][0]} is not valid" in refused.value.message
    assert gw.store.get("gzip/attributes.json") is None
    gw.store.set(stored[3][0], stored[3][1])
    gw.store.set(stored[6][0], stored[6][1])
    gw.write_file("/gzip/attributes.json", metadata(source)["gzip/attributes.json"])
    gw.close()


# == Zarr v2 ===========================================================================================

#: compressor of each array zarr-python 3 writes in Zarr v2 format (None: uncompressed)
V2: dict[str, Any] = {
    "zlib": numcodecs.Zlib(level=3),
    "gzip": numcodecs.GZip(level=5),
    "bz2": numcodecs.BZ2(level=2),
    "lzma": numcodecs.LZMA(),
    "none": None,
    "blosc": numcodecs.Blosc(),  # not checked while written: the full check alone decides
}
V2_HANDLED = {"zlib", "gzip", "bz2", "lzma", "none"}
V2_METADATA = (".zgroup", ".zarray", ".zattrs")


@pytest.fixture(scope="module")
def v2source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pre-v2") / "data.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=2)
    for name, compressor in V2.items():
        array = zarr.create_array(
            store=str(root / name),
            shape=SHAPE,
            chunks=CHUNKS,
            dtype="uint16",
            zarr_format=2,
            compressors=compressor,
            fill_value=0,
        )
        array[...] = values()
    return root


def v2_gateway(root: Path, *, checks: bool = True) -> Gateway:
    gw = Gateway(MemoryStore())
    found = sorted(
        (p for p in root.rglob("*") if p.name in V2_METADATA), key=lambda p: len(p.parts)
    )
    for path in found:
        gw.write_file("/" + path.relative_to(root).as_posix(), path.read_bytes())
    if not checks:
        gw.committer.prechecks = None
        gw.rules.streaming = False
    return gw


def v2_spoiled(data: bytes, compressor: Any, nbytes: int) -> Iterator[tuple[str, bytes]]:
    decoded = bytes(compressor.decode(data)) if compressor is not None else data
    encode = (lambda b: bytes(compressor.encode(b))) if compressor is not None else bytes
    yield "valid", data
    yield "empty", b""
    yield "cut in half", data[: len(data) // 2]
    yield "last byte missing", data[:-1]
    yield "one byte more", data + b"x"
    yield "zeros after", data + bytes(8)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x5A
    yield "flipped byte", bytes(flipped)
    yield "bomb", encode(bytes(64 * nbytes + 4096))
    yield "short", encode(decoded[:-2])
    if isinstance(compressor, numcodecs.GZip):
        yield "two gzip members", gzip.compress(decoded[:100]) + gzip.compress(decoded[100:])


@pytest.mark.parametrize("name", list(V2))
def test_zarr2_chunks_checked_while_written_decide_as_the_full_check(
    v2source: Path, name: str
) -> None:
    fast, full = v2_gateway(v2source), v2_gateway(v2source, checks=False)
    nbytes = CHUNKS[0] * CHUNKS[1] * 2
    stored = {
        f"{name}/{p.name}": p.read_bytes()
        for p in sorted((v2source / name).iterdir())
        if p.name not in V2_METADATA
    }
    assert len(stored) == 9
    for key, data in stored.items():
        for what, spoilt in v2_spoiled(data, V2[name], nbytes):
            for pieces in (sequential(spoilt, 1000), sequential(spoilt, 700)[::-1]):
                before = prechecked(fast)
                want = outcome(full, key, spoilt, pieces)
                assert outcome(fast, key, spoilt, pieces) == want, (key, what)
                used = prechecked(fast) - before
                assert used <= (want is None), (key, what)
                if what == "valid" and pieces[0][0] == 0:
                    assert want is None
                    assert used == (name in V2_HANDLED), key
    assert prechecked(full) == 0


@pytest.mark.parametrize(("name", "joins"), [("raw", 0), ("gzip", 0), ("blosc", 1)])
def test_a_file_store_gets_the_written_pieces_unjoined(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, joins: int
) -> None:
    """A chunk checked while it was written goes to a file store as the pieces it was written
    in: no joined copy of its bytes at all. One the full check decides is joined once, and
    that one value serves the check, the store and the byte cache."""
    gw = Gateway(FileStore(str(tmp_path / "store")), GatewayConfig())
    for key, data in metadata(source).items():
        gw.write_file("/" + key, data)
    joined: list[int] = []
    getvalue = StagedFile.getvalue

    def counted(self: StagedFile) -> bytes:
        joined.append(self.size)
        return getvalue(self)

    monkeypatch.setattr(StagedFile, "getvalue", counted)
    for key, data in chunks(source, name).items():
        joined.clear()
        assert outcome(gw, key, data, sequential(data, 1000)) is None
        assert len(joined) == joins, key
        assert (tmp_path / "store" / key).read_bytes() == data
