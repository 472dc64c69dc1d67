"""Removing trees through a writable view removes the native data they stand for.

``rm -r`` takes the names of a folder in listing order (``.zarray`` before ``0.0``; GNU rm
sorts big folders by inode), so each test removes an array both ways: its document first
(the array is doomed: the document is hidden, the chunks stay removable) and last (the
document goes natively at once). After the folder's ``rmdir`` nothing of the array is left in
the store, the view lists nothing of it, and the rest of the store reads as before. Real
``rm -r`` through real mounts is in ``tests/mount/test_mount_views.py``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import zarr

from n5fs.errors import KeyNotFound, PrefixNotEmpty
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.gateway.namespace.paths import EntryKind
from n5fs.kvstore import open_store
from n5fs.views import open_view
from n5fs.views.base import View
from tests.writers import ramp, tensorstore_n5

DOCUMENTS = {"zarr3": ("zarr.json",), "zarr2": (".zarray", ".zattrs", ".zgroup"), "n5": ()}


def n5_store(root: Path) -> Path:
    tensorstore_n5(root / "g" / "arr", ramp((4, 6)), [2, 3])
    tensorstore_n5(root / "g" / "keep", ramp((4, 6)), [2, 3])
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    (root / "g" / "attributes.json").write_text(json.dumps({"title": "g"}))
    return root


def zarr_store(root: Path, zarr_format: int) -> Path:
    group = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)  # type: ignore[arg-type]
    sub = group.create_group("g", attributes={"title": "g"})
    for name in ("arr", "keep"):
        sub.create_array(name, shape=(4, 6), chunks=(2, 3), dtype="uint16")[...] = 7
    return root


def view_of(root: Path, fmt: str) -> View:
    view = open_view(Gateway(open_store(str(root)), GatewayConfig()), fmt)
    assert not view.read_only
    return view


def remove_tree(view: View, path: str, *, documents_first: bool) -> None:
    """``rm -r``: every name of a listing taken before anything is removed, then the folder."""
    listing = view.readdir(path)
    docs = [item for item in listing if item[0] in (*DOCUMENTS[view.format], "attributes.json")]
    rest = [item for item in listing if item not in docs]
    for name, attr in docs + rest if documents_first else rest + docs:
        child = f"{path}/{name}"
        if attr.kind is EntryKind.DIR:
            remove_tree(view, child, documents_first=documents_first)
        else:
            view.unlink(child)
    view.rmdir(path)


def stored(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


CASES = [("n5", "zarr3"), ("n5", "zarr2"), ("zarr3", "n5"), ("zarr2", "n5")]


def make_store(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "store"
    if source == "n5":
        return n5_store(root)
    return zarr_store(root, int(source[-1]))


@pytest.mark.parametrize("documents_first", [True, False], ids=["doc-first", "doc-last"])
@pytest.mark.parametrize(("source", "fmt"), CASES)
def test_rm_r_of_an_array_removes_its_native_data(
    tmp_path: Path, source: str, fmt: str, documents_first: bool
) -> None:
    root = make_store(tmp_path, source)
    keep_before = [k for k in stored(root) if k.startswith("g/keep")]
    view = view_of(root, fmt)
    remove_tree(view, "/g/arr", documents_first=documents_first)
    assert not (root / "g" / "arr").exists(), stored(root)
    assert view.lookup("/g/arr") is None
    assert "arr" not in dict(view.readdir("/g"))
    assert [k for k in stored(root) if k.startswith("g/keep")] == keep_before
    later = view_of(root, fmt)
    assert later.lookup("/g/arr") is None
    assert "keep" in dict(later.readdir("/g"))


@pytest.mark.parametrize(("source", "fmt"), CASES)
def test_rm_r_of_a_group_removes_it_and_the_root_keeps_its_format(
    tmp_path: Path, source: str, fmt: str
) -> None:
    root = make_store(tmp_path, source)
    view = view_of(root, fmt)
    remove_tree(view, "/g", documents_first=True)
    assert stored(root) == [n for n in stored(root) if "/" not in n]
    assert not (root / "g").exists()
    assert view.readdir("/") == [(n, a) for n, a in view.readdir("/") if n != "g"]
    root_doc = "attributes.json" if fmt == "n5" else DOCUMENTS[fmt][0]
    if fmt == "zarr2":
        root_doc = ".zgroup"
    view.unlink("/" + root_doc)
    assert view.lookup("/" + root_doc) is None
    later = view_of(root, fmt)  # still writable: the root kept its format
    assert later.tree.access.folder("").fmt == source


def test_a_document_removed_alone_hides_it_for_the_mount_and_strands_no_chunk(
    tmp_path: Path,
) -> None:
    """The document of an array with chunks is hidden, not removed: a later mount shows the
    array whole, never N5 block folders as groups of orphaned chunks."""
    root = n5_store(tmp_path / "store")
    view = view_of(root, "zarr3")
    view.unlink("/g/arr/zarr.json")
    assert view.lookup("/g/arr/zarr.json") is None
    with pytest.raises(KeyNotFound):
        view.unlink("/g/arr/zarr.json")
    assert sorted(dict(view.readdir("/g/arr"))) == ["0.0", "0.1", "1.0", "1.1"]
    view.unlink("/g/arr/0.0")
    assert not (root / "g/arr/0/0").exists()
    with pytest.raises(PrefixNotEmpty):
        view.rmdir("/g/arr")
    assert (root / "g/arr/attributes.json").exists()
    later = view_of(root, "zarr3")
    assert later.lookup("/g/arr/zarr.json") is not None
    assert sorted(dict(later.readdir("/g/arr"))) == ["0.1", "1.0", "1.1", "zarr.json"]


def test_a_document_written_again_is_shown_again(tmp_path: Path) -> None:
    """An array removed (its chunks, then its document) and made again at the same name."""
    root = n5_store(tmp_path / "store")
    view = view_of(root, "zarr3")
    doc = view.read_file("/g/arr/zarr.json")
    for name, _ in view.readdir("/g/arr"):
        view.unlink(f"/g/arr/{name}")
    assert view.lookup("/g/arr/zarr.json") is None
    assert not (root / "g/arr/attributes.json").exists()
    fh = view.create("/g/arr/zarr.json", os.O_WRONLY | os.O_CREAT)
    view.write(fh, doc, 0)
    view.flush(fh)
    view.release(fh)
    assert view.read_file("/g/arr/zarr.json") == doc
    assert (root / "g/arr/attributes.json").exists()


def test_removing_zattrs_clears_the_attributes_only(tmp_path: Path) -> None:
    root = n5_store(tmp_path / "store")
    attrs = json.loads((root / "g/arr/attributes.json").read_text())
    (root / "g/arr/attributes.json").write_text(json.dumps({**attrs, "unit": "nm"}))
    view = view_of(root, "zarr2")
    assert json.loads(view.read_file("/g/arr/.zattrs")) == {"unit": "nm"}
    view.unlink("/g/arr/.zattrs")
    assert json.loads((root / "g/arr/attributes.json").read_text()) == attrs
    assert view.lookup("/g/arr/.zarray") is not None
    assert sorted(dict(view.readdir("/g/arr")))[-4:] == ["0.0", "0.1", "1.0", "1.1"]


WAIT = 30.0  # generous: a deadlock fails the test instead of hanging it


class PauseBefore:
    """Pauses the first ``gateway.<call>(path)`` before it runs, until released: the hook
    between a removal's decision (what it loaded) and its native call (what it stores)."""

    def __init__(self, gateway: Gateway, call: str, path: str) -> None:
        self.reached, self.opened = threading.Event(), threading.Event()
        real: Callable[..., Any] = getattr(gateway, call)

        def paused(p: str, *args: Any) -> Any:
            if p == path and not self.reached.is_set():
                self.reached.set()
                assert self.opened.wait(WAIT), f"the {call} hook was never released"
            return real(p, *args)

        setattr(gateway, call, paused)

    def wait_reached(self) -> None:
        assert self.reached.wait(WAIT), "the hook was never reached"


def test_a_document_written_while_rmdir_removes_its_doomed_array_is_kept(
    tmp_path: Path,
) -> None:
    """rm -r took the document, then the chunks; the folder's rmdir has decided to remove the
    array (no chunk left) when a writer's document for the same array is flushed. Either
    order is serial: the removal, then the new array (the writer's close() succeeded, so its
    document is stored and shown). Before the folder hold, the flush landed between the
    decision and the native delete and the delete removed the writer's document."""
    root = n5_store(tmp_path / "store")
    view = view_of(root, "zarr3")
    assert view.writes is not None
    removals = view.writes.removals
    doc = view.read_file("/g/arr/zarr.json")
    view.unlink("/g/arr/zarr.json")  # doomed: the chunks stay
    for name, _ in view.readdir("/g/arr"):
        view.unlink(f"/g/arr/{name}")
    fh = view.create("/g/arr/zarr.json", os.O_WRONLY | os.O_CREAT)
    view.write(fh, doc, 0)  # staged; stored at the flush below

    pause = PauseBefore(view.gateway, "unlink", "/g/arr/attributes.json")
    writer_waits = threading.Event()  # the writer is at the hold (or done, without one)
    holding = removals.holding

    def watched(folder: str) -> Any:
        if pause.reached.is_set():
            writer_waits.set()
        return holding(folder)

    removals.holding = watched  # type: ignore[method-assign]
    with ThreadPoolExecutor(2) as pool:
        removing = pool.submit(view.rmdir, "/g/arr")
        pause.wait_reached()
        flushing = pool.submit(view.flush, fh)
        flushing.add_done_callback(lambda _: writer_waits.set())
        assert writer_waits.wait(WAIT)
        pause.opened.set()
        removing.result(WAIT)
        flushing.result(WAIT)
    view.release(fh)

    attrs = json.loads((root / "g/arr/attributes.json").read_text())
    assert attrs["dimensions"] == [4, 6]
    assert view.read_file("/g/arr/zarr.json") == doc
    assert removals.held_count() == 0
    later = view_of(root, "zarr3")
    assert later.lookup("/g/arr/zarr.json") is not None
    assert sorted(dict(later.readdir("/g/arr"))) == ["zarr.json"]


def test_rmdir_of_a_doomed_array_waits_for_no_chunk_unlink(tmp_path: Path) -> None:
    """A chunk unlink has found its N5 block (loaded) and not yet removed it (stored) when the
    folder's rmdir runs: the chunk is still shown, so the rmdir refuses (ENOTEMPTY) and
    removes nothing; once the unlink is done the rmdir removes the array."""
    root = n5_store(tmp_path / "store")
    view = view_of(root, "zarr3")
    view.unlink("/g/arr/zarr.json")
    for name in ("0.0", "0.1", "1.0"):
        view.unlink(f"/g/arr/{name}")
    pause = PauseBefore(view.gateway, "unlink", "/g/arr/1/1")
    with ThreadPoolExecutor(1) as pool:
        unlinking = pool.submit(view.unlink, "/g/arr/1.1")
        pause.wait_reached()
        with pytest.raises(PrefixNotEmpty):
            view.rmdir("/g/arr")
        assert (root / "g/arr/attributes.json").exists()
        pause.opened.set()
        unlinking.result(WAIT)
    view.rmdir("/g/arr")
    assert not (root / "g" / "arr").exists()
    assert view.lookup("/g/arr") is None
