"""Symlinks in a backing folder are never followed as folders: a loop in it (``ln -s . self``
in an array folder, ``ln -s ../grp grp/up``) is no folder to the store's listings and walks,
to ``n5fs validate``, nor to a mount, so each real file is seen once and every walk ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

from n5fs.cli.main import main
from n5fs.kvstore.file import FileStore
from tests.mounting import NEEDS_FUSE

#: the files zarr-python writes for the hierarchy below (one array, 3 x 4 chunks)
REAL_FILES = [
    ".zattrs",
    ".zgroup",
    "grp/.zattrs",
    "grp/.zgroup",
    "grp/arr/.zarray",
    "grp/arr/.zattrs",
    *(f"grp/arr/{i}.{j}" for i in range(3) for j in range(4)),
]
REAL_FOLDERS = ["grp", "grp/arr"]


@pytest.fixture
def looped(tmp_path: Path) -> Path:
    """A Zarr v2 group ``grp`` holding array ``arr``, with two loops planted in it."""
    root = tmp_path / "store"
    group = zarr.open_group(str(root), mode="w", zarr_format=2)
    arr = group.create_group("grp").create_array(
        "arr", shape=(20, 30), chunks=(8, 8), dtype="uint16"
    )
    arr[...] = np.arange(600, dtype="uint16").reshape(20, 30)
    os.symlink(".", root / "grp" / "arr" / "self")
    os.symlink("../grp", root / "grp" / "up")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(
        REAL_FILES
    )  # (rglob follows no symlinks)
    return root


def test_the_store_lists_and_walks_each_real_key_once(looped: Path) -> None:
    store = FileStore(looped)
    for walked in (
        [i.key for i in store.walk("")],
        list(store.list("", delimiter=None).names()),
    ):
        assert sorted(walked) == sorted(REAL_FILES)
    assert store.list("grp/").prefixes == ("grp/arr/",)
    assert store.list("grp/arr/").prefixes == ()
    assert store.list("grp/up/") == store.list("grp/arr/self/", delimiter=None)
    assert store.list("grp/up/").keys == ()
    assert store.get("grp/up/arr/.zarray") is None
    assert store.get("grp/arr/self/.zarray") is None
    assert store.get("grp/arr/.zarray") is not None


def test_a_loop_is_named_once_in_a_warning(looped: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FileStore(looped)
    with caplog.at_level("WARNING", logger="n5fs.kvstore.file"):
        list(store.walk(""))
        store.list("grp/")
        store.list("grp/arr/")
        list(store.walk(""))
    named = [r.getMessage() for r in caplog.records if "symlink" in r.getMessage()]
    assert len(named) == 2, named
    assert any("'grp/up' -> '../grp'" in m for m in named)
    assert any("'grp/arr/self' -> '.'" in m for m in named)


def test_deleting_a_prefix_does_not_reach_through_a_loop(looped: Path) -> None:
    store = FileStore(looped)
    assert store.delete_prefix("grp/up/") == 0
    assert store.delete_prefix("grp/arr/self/") == 0
    assert sorted(i.key for i in store.walk("")) == sorted(REAL_FILES)


def test_validate_checks_each_metadata_file_once(
    looped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["validate", "--json", str(looped)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    # .zattrs and .zgroup of the root and of grp, the one .zarray and its .zattrs
    assert doc["checked"] == {"metadata": 6, "chunks": 12, "other": 0}
    code = main(["validate", "--json", str(looped / "grp" / "arr")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert doc["checked"] == {"metadata": 2, "chunks": 12, "other": 0}


@pytest.mark.parametrize("mode", ["ro", "rw"])
@pytest.mark.fuse
@pytest.mark.timeout(120)
@NEEDS_FUSE
def test_find_and_cp_over_a_mount_see_each_real_entry_once(
    mounter, looped: Path, tmp_path: Path, mode: str
) -> None:
    mp = mounter.foreground(str(looped), *(["--read-only"] if mode == "ro" else []))
    found = subprocess.run(
        ["find", ".", "-mindepth", "1"],
        cwd=mp,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    entries = [line.removeprefix("./") for line in found.stdout.splitlines()]
    assert sorted(entries) == sorted(REAL_FILES + REAL_FOLDERS)
    for link in ("grp/up", "grp/arr/self"):
        assert not os.path.lexists(mp / link)
    copied = tmp_path / "copied"
    shutil.copytree(mp, copied)
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if p.is_file()) == sorted(
        REAL_FILES
    )
    assert (copied / "grp" / "arr" / "1.2").read_bytes() == (
        looped / "grp" / "arr" / "1.2"
    ).read_bytes()
