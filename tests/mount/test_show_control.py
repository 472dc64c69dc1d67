"""``-o show_control``: ``/.n5fs/`` is reachable by its path on every mount, and
listed by ``readdir`` of the root only when the mount asks for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from n5fs.fuse_front.options import fuse_options, parse_options
from n5fs.gateway import EntryKind, Gateway, GatewayConfig
from n5fs.kvstore.memory import MemoryStore
from tests.mounting import NEEDS_FUSE


def names(gw: Gateway, path: str) -> list[str]:
    return [name for name, _ in gw.readdir(path)]


def test_the_option_is_n5fss_own() -> None:
    assert not parse_options(["ro,cache_ttl=3"]).show_control
    opts = parse_options(["ro", "show_control,allow_other"])
    assert opts.show_control
    assert "show_control" not in opts.fuse  # libfuse would refuse it
    assert "allow_other" in opts.fuse
    given = fuse_options(opts, read_only=True, ttl=5.0, fsname="x", libfuse_major=3)
    assert "show_control" not in given


def test_show_control_takes_no_value() -> None:
    opts = parse_options(["show_control=1"])
    assert not opts.show_control
    assert opts.fuse["show_control"] == "1"  # left to libfuse, which refuses it by name


@pytest.mark.parametrize("read_only", [False, True])
def test_the_root_lists_the_control_folder_only_when_asked(read_only: bool) -> None:
    store = MemoryStore()
    store.set("g/.zgroup", b'{"zarr_format": 2}')
    with Gateway(store, GatewayConfig(read_only=read_only)) as hidden:
        assert names(hidden, "/") == ["g"]
        assert hidden.stat("/.n5fs").kind is EntryKind.DIR  # reachable all the same
    with Gateway(store, GatewayConfig(read_only=read_only, show_control=True)) as shown:
        listing = dict(shown.readdir("/"))
        assert sorted(listing) == [".n5fs", "g"]
        assert listing[".n5fs"].kind is EntryKind.DIR
        assert not listing[".n5fs"].writable
        assert names(shown, "/g") == [".zgroup"]  # only the root shows it
        assert "stats.json" in names(shown, "/.n5fs")


def test_a_stored_key_of_the_control_name_stays_shadowed() -> None:
    store = MemoryStore()
    store.set(".n5fs/x", b"stored")
    store.set("a", b"1")
    with Gateway(store, GatewayConfig(show_control=True)) as gw:
        assert names(gw, "/") == [".n5fs", "a"]
        assert "x" not in names(gw, "/.n5fs")


@pytest.mark.fuse
@pytest.mark.timeout(120)
@NEEDS_FUSE
def test_mount_o_show_control_lists_it(mounter, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "g").mkdir(parents=True)
    (src / "g" / ".zgroup").write_text('{"zarr_format": 2}')
    shown = mounter.foreground(str(src), "-o", "show_control", name="shown")
    assert sorted(os.listdir(shown)) == [".n5fs", "g"]
    assert "stats.json" in os.listdir(shown / ".n5fs")
    hidden = mounter.foreground(str(src), name="hidden")
    assert os.listdir(hidden) == ["g"]
