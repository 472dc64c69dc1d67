"""Opening a stored key's local file for reading (every read-only open of a file-store mount):
below its checked folder with O_NOFOLLOW, links at the name resolved by the store's own
check, a FIFO refused without blocking."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore.file import FileStore


def gateway(root: Path) -> Gateway:
    (root / "a").mkdir(exist_ok=True)
    (root / "a" / "x").write_bytes(b"inside")
    return Gateway(FileStore(root / "."), GatewayConfig(read_only=True))


def read(gw: Gateway, key: str) -> bytes | None:
    local = gw.reader.open_local(key)
    if local is None:
        return None
    try:
        return os.pread(local.fd, 100, 0)
    finally:
        local.close()


def test_a_file_opens_below_its_folder(tmp_path: Path) -> None:
    assert read(gateway(tmp_path), "a/x") == b"inside"
    assert read(gateway(tmp_path), "a/missing") is None


def test_a_link_at_the_name_is_followed_only_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    gw = gateway(root)
    (tmp_path / "secret").write_bytes(b"outside")
    (root / "a" / "in").symlink_to(root / "a" / "x")
    (root / "a" / "out").symlink_to(tmp_path / "secret")
    assert read(gw, "a/in") == b"inside"
    assert read(gw, "a/out") is None


def test_a_fifo_at_a_key_is_refused_without_blocking(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    os.mkfifo(tmp_path / "a" / "pipe")
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(read, gw, "a/pipe").result(timeout=10) is None
