"""One budget for what writes hold: staged bytes, and the working memory of commits.

A commit that needs a whole chunk in memory (a full check of a spilled chunk, a view's
translation of a chunk into the native format) borrows working memory from the gateway's
staging budget; borrows take turns, a thread never waits for itself, and what a view's writer
writes is staged by the gateway like any file (its handles, its budget, spilling to disk).

Deterministic: where two commits must overlap, a hook inside the first holds it until the
test has seen the second wait (events, no sleeps, no RSS readings).
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING

import pytest

from n5fs.errors import Rejected
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.write.staging import StagedFile, StagingBudget
from n5fs.kvstore.file import FileStore
from n5fs.views import open_view
from n5fs.views.writes import ViewWrites

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from n5fs.views.base import View

WAIT = 30.0  # a deadlock fails the test instead of hanging it
pytestmark = pytest.mark.debug_locks  # the lock order is checked on every acquire
KiB = 1 << 10
BLOCK = 64 * KiB  # a uint8 N5 block (and view chunk) of the tests below


# == the budget ===================================================================================


def test_a_borrow_that_fits_is_granted_and_counts_as_used() -> None:
    budget = StagingBudget(100)
    assert budget.reserve(30)
    with budget.borrow(50):
        assert (budget.used, budget.lent) == (80, 50)
        assert not budget.reserve(30)  # a staged file spills while a commit works
    assert (budget.used, budget.lent) == (30, 0)


def test_borrows_take_turns_and_a_large_one_runs_alone() -> None:
    budget = StagingBudget(100)
    first_in, second_in, leave = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with budget.borrow(80):
            first_in.set()
            assert leave.wait(WAIT)

    def second() -> None:
        with budget.borrow(500):  # more than the whole budget: alone, once the first left
            second_in.set()

    one, two = threading.Thread(target=first), threading.Thread(target=second)
    one.start()
    assert first_in.wait(WAIT)
    two.start()
    assert not second_in.wait(0.2)  # it waits its turn (a longer wait changes nothing)
    leave.set()
    assert second_in.wait(WAIT)
    one.join(WAIT)
    two.join(WAIT)
    assert budget.overdrawn == 0
    assert budget.peak_lent == 500
    assert (budget.used, budget.lent) == (0, 0)


def test_a_thread_never_waits_for_its_own_borrow() -> None:
    budget = StagingBudget(100)
    with budget.borrow(90), budget.borrow(90):  # a translation's native commit nests
        assert budget.lent == 180
    assert budget.overdrawn == 0
    assert budget.used == 0


def test_a_borrow_waits_boundedly_then_goes_ahead_counted() -> None:
    budget = StagingBudget(100)
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with budget.borrow(90):
            entered.set()
            assert leave.wait(WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(WAIT)
    with budget.borrow(90, wait=0):  # inside the commit order: never waits
        assert budget.lent == 180
    assert budget.overdrawn == 1
    leave.set()
    holder.join(WAIT)


def test_a_borrow_never_waits_for_staged_files() -> None:
    """Staged files may stay open for as long as their writers like: a commit is not held
    back by them, only by other commits."""
    budget = StagingBudget(100)
    assert budget.reserve(100)
    with budget.borrow(60, wait=WAIT):
        assert budget.used == 160
    assert budget.overdrawn == 0


# == commits of spilled chunks ====================================================================


def n5_dataset(root: Path, blocks: int) -> None:
    (root / "d").mkdir(parents=True)
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    meta = {
        "dimensions": [blocks * BLOCK],
        "blockSize": [BLOCK],
        "dataType": "uint8",
        "compression": {"type": "raw"},
    }
    (root / "d" / "attributes.json").write_text(json.dumps(meta))


def payload(index: int) -> bytes:
    return bytes((i + index) % 251 for i in range(BLOCK))


def n5_block(data: bytes) -> bytes:
    return (0).to_bytes(2, "big") + (1).to_bytes(2, "big") + len(data).to_bytes(4, "big") + data


@pytest.fixture
def small_budget(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway whose staging budget holds less than one block: every block spills, and
    every check and translation of one borrows more than the budget."""
    n5_dataset(tmp_path / "src", 4)
    config = GatewayConfig(staging_bytes=BLOCK // 2, cache_bytes=BLOCK, spill_bytes=BLOCK // 2)
    with Gateway(FileStore(str(tmp_path / "src")), config) as gateway:
        yield gateway


def test_full_checks_of_spilled_chunks_borrow_and_take_turns(
    small_budget: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = small_budget
    lent_during_checks: list[int] = []
    check = gateway.rules.check

    def recording(*args: object, **kwargs: object) -> object:
        lent_during_checks.append(gateway.budget.lent)
        return check(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway.rules, "check", recording)
    threads = [
        threading.Thread(target=gateway.write_file, args=(f"/d/{i}", n5_block(payload(i))))
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert len(lent_during_checks) == 4
    # each check ran with exactly its own chunk borrowed: they took turns
    assert all(lent == len(n5_block(b"")) + BLOCK for lent in lent_during_checks)
    assert gateway.budget.peak_lent == len(n5_block(b"")) + BLOCK
    assert gateway.budget.overdrawn == 0
    assert (gateway.budget.used, gateway.budget.lent) == (0, 0)
    for i in range(4):
        assert gateway.read_file(f"/d/{i}") == n5_block(payload(i))


# == a view's writes are the gateway's ============================================================


def test_a_views_file_is_a_gateway_handle_staged_in_the_one_budget(small_budget: Gateway) -> None:
    view = open_view(small_budget, "zarr3")
    native = small_budget.open("/d/attributes.json", os.O_RDONLY)
    fh = view.create("/d/0", os.O_WRONLY)
    try:
        assert fh == native + 1  # one numbering: the view keeps no handle table of its own
        piece = payload(0)[: BLOCK // 4]
        view.write(fh, piece, 0)
        assert small_budget.budget.used == len(piece)  # staged in memory, in the budget
        view.write(fh, payload(0)[BLOCK // 4 :], BLOCK // 4)
        assert small_budget.budget.used == 0  # past the budget: spilled to disk
        assert view.stat("/d/0").size == BLOCK
        assert view.read(fh, 8, BLOCK - 8) == payload(0)[-8:]
        view.flush(fh)
    finally:
        view.release(fh)
        small_budget.release(native)
    assert small_budget.read_file("/d/0") == n5_block(payload(0))
    assert small_budget.budget.used == 0


def test_translations_take_turns_in_borrowed_memory(
    small_budget: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    view: View = open_view(small_budget, "zarr3")
    budget = small_budget.budget
    translating, leave = threading.Event(), threading.Event()
    inside: list[int] = []
    translate = ViewWrites._translated

    def held(self: ViewWrites, key: str, data: bytes) -> bool:
        inside.append(budget.lent)
        if key == "d/0":
            translating.set()
            assert leave.wait(WAIT)
        return translate(self, key, data)

    monkeypatch.setattr(ViewWrites, "_translated", held)
    commit = ViewWrites.commit
    committing = threading.Event()

    def noted(self: ViewWrites, key: str, staged: StagedFile) -> bool:
        if key == "d/1":
            committing.set()
        return commit(self, key, staged)

    monkeypatch.setattr(ViewWrites, "commit", noted)

    def write(index: int) -> None:
        fh = view.create(f"/d/{index}", os.O_WRONLY)
        try:
            view.write(fh, payload(index), 0)
            view.flush(fh)
        finally:
            view.release(fh)

    first = threading.Thread(target=write, args=(0,))
    first.start()
    assert translating.wait(WAIT)
    second = threading.Thread(target=write, args=(1,))
    second.start()
    assert committing.wait(WAIT)
    assert len(inside) == 1  # the second commit waits for working memory, not translating
    leave.set()
    first.join(WAIT)
    second.join(WAIT)
    working = BLOCK + 2 * BLOCK  # the written chunk, its values, the encoded block
    assert inside == [working, working]
    assert budget.overdrawn == 0
    for i in range(2):
        assert small_budget.read_file(f"/d/{i}") == n5_block(payload(i))


def test_a_view_file_too_large_to_translate_is_refused_unread(
    small_budget: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("n5fs.views.writes.MAX_VALIDATED_BYTES", BLOCK // 2)
    view = open_view(small_budget, "zarr3")
    fh = view.create("/d/0", os.O_WRONLY)
    try:
        view.write(fh, payload(0), 0)
        with pytest.raises(Rejected, match="translates in memory") as refused:
            view.flush(fh)
    finally:
        view.release(fh)
    assert refused.value.rule == "too-large-to-validate"
    assert [r.path for r in small_budget.rejections] == ["/d/0"]
    assert small_budget.lookup("/d/0") is None  # nothing stored
    assert small_budget.budget.peak_lent == 0  # never read into memory
