"""The corpus of every array the view tests write, through real mounts (``n5fs mount --as``).

The in-process tests (tests/gateway/test_views_corpus.py) read copies of each view; here
each view of the same corpus is mounted read-only and every array it shows is read inside
the mount by every reader of its format (zarr-python 3, TensorStore, z5py, ``np.load`` with
``mmap_mode="r"``), against what the source's own reader reads. The arrays a reader reads
wrong must be exactly the known holes of that view; left-out arrays are not in the mount.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.test_views_corpus import (
    ARRAYS,
    BUILDERS,
    HOLES,
    LEFT_OUT,
    READ,
    READER_LIMITS,
    READERS,
    VIEWS,
    Natives,
    _quiet,
    assert_same,
)
from tests.mounting import Mounter, real_mount

pytestmark = real_mount(300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mount-corpus") / "src"
    with _quiet():
        for folder, (build, _) in BUILDERS.items():
            build(root / folder)
    return root


@pytest.fixture(scope="module")
def natives(corpus: Path) -> Natives:
    return Natives(corpus)


@pytest.mark.parametrize("view", VIEWS)
def test_every_shown_array_reads_the_native_values_in_a_mount(
    mounter: Mounter, corpus: Path, natives: Natives, view: str
) -> None:
    mp = mounter.foreground(str(corpus), "--as", view, "--read-only")
    suffix = ".npy" if view == "npy" else ""
    wrong: dict[tuple[str, str], str] = {}
    for path in ARRAYS:
        shown = (mp / f"{path}{suffix}").exists()
        assert shown == (path not in LEFT_OUT[view]), path
        if not shown:
            continue
        for reader in READERS[view]:
            if path in READER_LIMITS.get((view, reader), {}):
                continue  # the reader's own limit (the in-process tests check it)
            read, n5_order = READ[view, reader]
            want = natives[path]
            try:
                assert_same(read(mp, path), want.T if n5_order else want)
            except (AssertionError, ValueError, OSError) as exc:
                wrong[reader, path] = f"{type(exc).__name__}: {str(exc)[:200]}"
    holes = {(reader, path) for (v, path) in HOLES if v == view for reader in READERS[view]}
    assert set(wrong) == holes, {k: v for k, v in wrong.items() if k not in holes}
