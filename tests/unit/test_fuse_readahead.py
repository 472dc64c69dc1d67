"""The kernel's read-ahead for a mount (n5fs/fuse_front/readahead.py), on a stand-in for
``/sys/class/bdi``; and ``-o read_ahead_kb=``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from n5fs.errors import InvalidSource
from n5fs.fuse_front.options import READ_AHEAD_KB, parse_options
from n5fs.fuse_front.readahead import set_read_ahead

DEVICE = os.makedev(0, 57)


def bdi(tmp_path: Path, kib: int) -> Path:
    path = tmp_path / "0:57" / "read_ahead_kb"
    path.parent.mkdir()
    path.write_text(f"{kib}\n")
    return path


def test_the_read_ahead_is_set_and_zero_leaves_the_kernels(tmp_path: Path) -> None:
    path = bdi(tmp_path, 128)
    assert set_read_ahead(DEVICE, 0, root=tmp_path) == 128
    assert path.read_text() == "128\n"
    assert set_read_ahead(DEVICE, 1024, root=tmp_path) == 1024
    assert path.read_text() == "1024\n"
    assert set_read_ahead(DEVICE, 1024, root=tmp_path) == 1024  # already: nothing written


def test_no_such_device_or_a_refusal_keeps_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert set_read_ahead(DEVICE, 1024, root=tmp_path) is None  # not Linux, or no device
    path = bdi(tmp_path, 128)

    def refuse(self: Path, text: str) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse)
    with caplog.at_level(logging.INFO, logger="n5fs.fuse_front.readahead"):
        assert set_read_ahead(DEVICE, 1024, root=tmp_path) == 128
    assert path.read_text() == "128\n"
    assert "stays at 128 KiB" in caplog.text
    assert "Permission denied" in caplog.text


def test_the_option_is_n5fs_own_with_a_default_of_a_mebibyte() -> None:
    assert parse_options([]).read_ahead_for() == READ_AHEAD_KB == 1024
    assert parse_options(["ro,as=zarr3"]).read_ahead_for() == 1024
    assert parse_options(["as=npy"]).read_ahead_for() == 0  # mmap readers: the kernel's
    assert parse_options(["as=npy,read_ahead_kb=512"]).read_ahead_for() == 512
    opts = parse_options(["ro,read_ahead_kb=256"])
    assert opts.read_ahead_for() == 256
    assert "read_ahead_kb" not in opts.fuse  # libfuse would refuse it
    assert parse_options(["read_ahead_kb=0"]).read_ahead_for() == 0
    with pytest.raises(InvalidSource, match="read_ahead_kb is a number of KiB"):
        parse_options(["read_ahead_kb=1M"])
