"""The staging buffer behaves like a file (holes read as zeros, truncate both ways, spill) and
loads nothing it will not use: the base is fetched by range for reads, and whole only at commit;
memory stays within one shared budget; sparse files stay sparse; EFBIG past max_size."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from n5fs.errors import FileTooLarge, errno_of
from n5fs.gateway.write.staging import FETCH_PIECE, StagedFile, StagingBudget
from n5fs.kvstore.file import FileStore

GiB = 1 << 30


@dataclass
class Base:
    """A stored object of ``size`` bytes: zeros except ``marks``, built on demand (a 1 GiB
    base costs nothing), recording every fetch."""

    size: int
    marks: dict[int, bytes] = field(default_factory=dict)
    fetches: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, data: bytes) -> Base:
        return cls(len(data), {0: data})

    def fetch(self, offset: int, length: int) -> bytes:
        self.fetches.append((offset, length))
        length = max(0, min(length, self.size - offset))
        out = bytearray(length)
        for at, data in self.marks.items():
            lo, hi = max(at, offset), min(at + len(data), offset + length)
            if lo < hi:
                out[lo - offset : hi - offset] = data[lo - at : hi - at]
        return bytes(out)

    def fetched(self) -> int:
        return sum(length for _, length in self.fetches)


def staged(base: Base | None = None, **kw: object) -> StagedFile:
    kw.setdefault("budget", StagingBudget(64 << 20))
    return StagedFile(base, **kw)  # type: ignore[arg-type]


# == a bytearray model ============================================================================

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 300), st.binary(min_size=1, max_size=90)),
        # in order at the end: the overlay keeps such writes by reference, as pieces
        st.tuples(st.just("append"), st.just(0), st.binary(min_size=1, max_size=90)),
        st.tuples(st.just("truncate"), st.integers(0, 400), st.just(b"")),
        st.tuples(st.just("read"), st.integers(0, 400), st.integers(0, 120)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(
    initial=st.none() | st.binary(max_size=200),
    steps=ops,
    spill=st.sampled_from([64, 1 << 20]),
    budget=st.sampled_from([0, 100, 1 << 20]),
)
def test_staged_file_matches_a_bytearray(
    initial: bytes | None, steps: list, spill: int, budget: int
) -> None:
    base = Base.of(initial) if initial is not None else None
    shared = StagingBudget(budget)
    f = StagedFile(base, budget=shared, spill_bytes=spill)
    model = bytearray(initial or b"")
    from_base = [True] * len(model)  # which bytes the base still provides
    for op, n, arg in steps:
        before = len(base.fetches) if base else 0
        if op == "append":
            op, n = "write", len(model)
        if op == "write":
            model[len(model) : n] = bytes(max(0, n - len(model)))
            from_base[len(from_base) : n] = [False] * max(0, n - len(from_base))
            model[n : n + len(arg)] = arg
            from_base[n : n + len(arg)] = [False] * len(arg)
            assert f.write(arg, n) == len(arg)
        elif op == "truncate":
            del model[n:], from_base[n:]
            model.extend(bytes(n - len(model)))
            from_base.extend([False] * (n - len(from_base)))
            f.truncate(n)
        else:
            assert f.read(arg, n) == bytes(model[n : n + arg])
        assert f.size == len(model)
        assert shared.used <= budget
        if base is not None:
            new = base.fetches[before:]
            assert op == "read" or not new  # writes and truncates fetch nothing
            for offset, length in new:  # reads fetch exactly the untouched bytes they need
                assert length > 0
                assert all(from_base[offset : offset + length])
            if op == "read":
                assert sum(n for _, n in new) == sum(from_base[n : n + arg])
    parts = f.parts()
    if parts is not None:
        assert b"".join(parts) == bytes(model)
    assert f.getvalue() == bytes(model)
    path = f.spill_path()
    if path is not None:
        with open(path, "rb") as spilled:
            assert spilled.read() == bytes(model)
    assert f.read(7, 3) == bytes(model[3:10])
    f.close()
    assert shared.used == 0


def test_in_order_writes_are_kept_by_reference_and_joined_only_on_demand() -> None:
    """``cp`` writes in order from 0: the bytes FUSE handed over are the staged bytes (no
    copy into a buffer) and :meth:`StagedFile.parts` gives them back unjoined."""
    pieces = [bytes([i]) * (1 << 20) for i in range(4)] + [b"tail"]
    f = staged()
    for piece in pieces:
        f.write(piece, f.size)
    parts = f.parts()
    assert parts is not None
    assert [part.obj for part in parts] == pieces
    assert all(part.obj is piece for part, piece in zip(parts, pieces, strict=True))
    assert f.getvalue() == b"".join(pieces)
    f.write(b"X", 5)  # out of order: the pieces become one buffer, content unchanged
    parts = f.parts()
    assert parts is not None
    assert len(parts) == 1
    assert bytes(parts[0]) == b"".join(pieces)[:5] + b"X" + b"".join(pieces)[6:]


def test_many_small_in_order_writes_are_copied_into_one_buffer() -> None:
    """Each kept piece costs an object header the budget does not count: past a few small
    ones the overlay copies them into one buffer."""
    f = staged()
    for i in range(100):
        f.write(bytes([i]), i)
    parts = f.parts()
    assert parts is not None
    assert len(parts) < 20
    assert b"".join(parts) == bytes(range(100))


def test_spilling_kept_pieces_writes_them_without_a_joined_copy(tmp_path) -> None:
    budget = StagingBudget(3 << 20)
    f = StagedFile(None, budget=budget, tmp_dir=str(tmp_path))
    pieces = [bytes([i + 1]) * (1 << 20) for i in range(5)]
    for piece in pieces:
        f.write(piece, f.size)
    assert f.spilled
    assert budget.used == 0
    assert f.parts() is None
    path = f.spill_path()
    assert path is not None
    with open(path, "rb") as spilled:
        assert spilled.read() == b"".join(pieces)


# == loading nothing it will not use ==============================================================


def test_a_new_or_truncated_file_never_fetches() -> None:
    base = Base(GiB, {0: b"old"})
    f = staged(base)
    f.truncate(0)  # O_TRUNC on an existing file
    f.write(b"new", 5)
    assert f.read(100, 0) == bytes(5) + b"new"
    assert f.getvalue() == bytes(5) + b"new"
    assert f.spill_path() is None
    assert base.fetches == []
    f.close()
    empty = staged(None)  # the gateway's O_TRUNC and create
    empty.write(b"x", 0)
    assert empty.getvalue() == b"x"
    empty.close()


def test_a_one_byte_write_into_a_big_base_fetches_only_at_commit(tmp_path) -> None:
    base = Base(GiB, {100: b"abc", GiB - 3: b"end"})
    f = staged(base, tmp_dir=str(tmp_path))
    f.write(b"X", 101)
    assert base.fetches == []
    assert f.size == GiB
    assert f.read(4, 99) == b"\0aXc"
    assert base.fetches == [(99, 2), (102, 1)]  # the untouched bytes around the write only
    assert f.read(3, GiB - 3) == b"end"
    base.fetches.clear()
    path = f.spill_path()
    assert path is not None
    assert all(length <= FETCH_PIECE for _, length in base.fetches)
    assert base.fetched() == GiB - 1  # everything but the written byte, once
    st_ = os.stat(path)
    assert st_.st_size == GiB
    assert st_.st_blocks * 512 < 1 << 20  # the base's zeros stayed holes
    with open(path, "rb") as spilled:
        assert os.pread(spilled.fileno(), 4, 99) == b"\0aXc"
        assert os.pread(spilled.fileno(), 3, GiB - 3) == b"end"
    base.fetches.clear()
    assert f.read(3, 100) == b"aXc"  # the base is in the temp file now
    assert base.fetches == []
    f.close()


def test_truncate_cuts_the_base_and_growing_again_reads_zeros() -> None:
    base = Base.of(b"0123456789")
    f = staged(base)
    f.truncate(4)
    f.truncate(8)
    assert f.read(10, 0) == b"0123" + bytes(4)
    assert base.fetches == [(0, 4)]
    assert f.getvalue() == b"0123" + bytes(4)
    f.close()


def test_a_small_base_is_held_in_memory_at_commit() -> None:
    base = Base.of(b"a" * 1000)
    f = staged(base, spill_bytes=4096)
    f.write(b"b", 500)
    assert f.spill_path() is None
    assert f.getvalue() == b"a" * 500 + b"b" + b"a" * 499
    assert not f.spilled
    f.close()


# == memory: one budget ===========================================================================


def test_budget_returns_to_zero_after_close() -> None:
    budget = StagingBudget(1 << 20)
    f = StagedFile(Base.of(b"x" * 100), budget=budget)
    for i in range(100):
        f.write(b"y" * 1000, i * 1000)
    assert 0 < budget.used <= 1 << 20
    f.truncate(10)
    assert budget.used < 1000  # a shrink gives memory back
    f.getvalue()
    f.close()
    assert budget.used == 0
    f.close()  # idempotent
    assert budget.used == 0


def test_files_sharing_a_small_budget_spill(tmp_path) -> None:
    budget = StagingBudget(1000)
    first = StagedFile(budget=budget, tmp_dir=str(tmp_path))
    second = StagedFile(budget=budget, tmp_dir=str(tmp_path))
    first.write(b"a" * 600, 0)
    second.write(b"b" * 600, 0)
    assert not first.spilled
    assert second.spilled  # the budget had only 400 bytes left
    assert budget.used <= 1000
    assert second.getvalue() == b"b" * 600
    assert second.spill_path() is not None
    assert os.listdir(tmp_path) == []  # the temp file is unlinked
    first.close()
    second.close()
    assert budget.used == 0


def test_growth_is_geometric_within_spill_bytes_and_the_budget() -> None:
    budget = StagingBudget(1 << 20)
    f = StagedFile(budget=budget, spill_bytes=1000)
    for offset in range(0, 900, 100):
        f.write(b"a" * 100, offset)
    assert budget.used == 1000  # doubled 100 -> 800, then capped at spill_bytes
    f.close()
    tight = StagingBudget(900)
    g = StagedFile(budget=tight)
    for offset in range(0, 900, 300):
        g.write(b"b" * 300, offset)
    assert not g.spilled  # doubling to 1200 was refused; exactly 900 was granted
    assert tight.used == 900
    g.close()


def test_growth_past_spill_bytes_moves_to_a_temp_file() -> None:
    budget = StagingBudget(1 << 20)
    f = StagedFile(budget=budget, spill_bytes=1000)
    f.write(b"a" * 600, 0)
    assert not f.spilled
    f.write(b"b" * 600, 600)
    assert f.spilled
    assert budget.used == 0  # the reservation went back at the spill
    assert f.getvalue() == b"a" * 600 + b"b" * 600
    f.close()


# == EFBIG ========================================================================================


def test_growing_past_max_size_is_refused_and_changes_nothing() -> None:
    f = staged(Base.of(b"z" * 50), max_size=100)
    f.write(b"a" * 10, 0)
    before = f.getvalue()
    with pytest.raises(FileTooLarge) as info:
        f.write(b"b" * 10, 95)
    assert errno_of(info.value) == errno.EFBIG
    with pytest.raises(FileTooLarge):
        f.truncate(101)
    assert (f.size, f.getvalue()) == (50, before)
    f.truncate(100)
    f.write(b"c", 99)
    assert f.size == 100
    f.close()


def test_a_file_already_past_max_size_may_be_rewritten_and_shrunk() -> None:
    f = staged(Base.of(b"z" * 200), max_size=100)
    f.write(b"a", 150)
    f.truncate(120)
    with pytest.raises(FileTooLarge):
        f.truncate(121)
    assert f.size == 120
    f.close()


# == sparse stays sparse ==========================================================================


def test_truncate_to_8_gib_spills_a_sparse_file(tmp_path) -> None:
    f = staged(None, tmp_dir=str(tmp_path))
    f.write(b"head", 0)
    f.truncate(8 * GiB)
    f.write(b"tail", 8 * GiB - 4)
    assert f.read(8, 8 * GiB - 8) == bytes(4) + b"tail"
    path = f.spill_path()
    assert path is not None
    st_ = os.stat(path)
    assert st_.st_size == 8 * GiB
    assert st_.st_blocks * 512 < 1 << 20
    store = FileStore(tmp_path / "root")
    store.put_file("big", path)  # the commit: still sparse in the backing store
    stored = os.stat(store.root / "big")
    assert stored.st_size == 8 * GiB
    assert stored.st_blocks * 512 < 1 << 20
    with open(store.root / "big", "rb") as out:
        assert os.pread(out.fileno(), 4, 0) == b"head"
        assert os.pread(out.fileno(), 4, 8 * GiB - 4) == b"tail"
    f.close()
