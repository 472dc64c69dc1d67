"""Faults and leftovers below the mount: bounded JSON, long names, dead writers' temp files,
crash-safe folder renames on stores that move key by key, and kept modification times."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from n5fs.codecs import jsondoc
from n5fs.codecs.limits import CodecError
from n5fs.errors import Rejected
from n5fs.gateway import Gateway, GatewayConfig
from n5fs.kvstore import tempnames
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.validate import Validator

# -- one JSON loader, bounded nesting ---------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_loader_bounds_nesting() -> None:
    assert jsondoc.load_json(nested(jsondoc.MAX_DEPTH)) == eval(nested(jsondoc.MAX_DEPTH))
    with pytest.raises(CodecError) as info:
        jsondoc.load_json(nested(jsondoc.MAX_DEPTH + 1))
    assert info.value.rule == "json-depth"
    with pytest.raises(CodecError) as info:  # deep enough to overflow Python's decoder
        jsondoc.load_json(nested(100_000).encode())
    assert info.value.rule == "json-depth"
    with pytest.raises(CodecError) as info:
        jsondoc.load_json(b"\xff{")
    assert info.value.rule == "json"


@pytest.mark.parametrize("name", [".zattrs", ".zarray", "zarr.json", "attributes.json"])
def test_too_deep_metadata_is_refused_and_recorded(name: str) -> None:
    gw = Gateway(MemoryStore(), GatewayConfig())
    marker = {
        ".zattrs": b'{"zarr_format": 2}',
        ".zarray": b'{"zarr_format": 2}',
        "zarr.json": b'{"zarr_format": 3, "node_type": "group"}',
        "attributes.json": b'{"n5": "4.0.0"}',
    }[name]
    gw.write_file("/g/" + (".zgroup" if name.startswith(".z") else name), marker)
    with pytest.raises(Rejected) as info:
        gw.write_file(f"/g/{name}", ('{"a": ' + nested(5000) + "}").encode())
    assert info.value.rule == "json-depth"
    assert [r.rule for r in gw.rejections] == ["json-depth"]


# -- temp names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 255, "é" * 127, "x.zarray" * 31, "k"])
def test_temp_names_fit_name_max(name: str) -> None:
    temp = tempnames.temp_name(name)
    assert len(temp.encode()) <= tempnames.NAME_MAX
    assert tempnames.is_partial(temp)
    assert tempnames.writer_of(temp) == tempnames.current()
    temp.encode()  # never a split UTF-8 sequence


def dead_writer() -> tempnames.Writer:
    """The tag of a process that ran on this host and is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    me = tempnames.current()
    dead = tempnames.Writer(me.host, me.boot, proc.pid, "1")
    proc.wait()
    return dead


def plant(folder: Path, name: str, writer: tempnames.Writer) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{name}.{writer.tag}0123{tempnames.PARTIAL_SUFFIX}"
    path.write_bytes(b"half a chunk")
    return path


def test_liveness_of_writers() -> None:
    me = tempnames.current()
    assert tempnames.liveness(me) is tempnames.Liveness.ALIVE
    assert tempnames.liveness(dead_writer()) is tempnames.Liveness.DEAD
    rebooted = tempnames.Writer(me.host, "ffff" if me.boot != "ffff" else "0000", me.pid, me.start)
    assert tempnames.liveness(rebooted) is tempnames.Liveness.DEAD
    child = subprocess.Popen(["sleep", "0.3"])
    writer = tempnames.Writer(me.host, me.boot, child.pid, tempnames._start_time(child.pid) or "")
    assert tempnames.liveness(writer) is tempnames.Liveness.ALIVE
    assert tempnames.liveness(tempnames.Writer(me.host, me.boot, child.pid, "1")) is (
        tempnames.Liveness.DEAD  # the pid now belongs to a process that started later
    )
    while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
        time.sleep(0.01)  # exited, not reaped yet: what a killed daemon in a container is
    assert tempnames.liveness(writer) is tempnames.Liveness.DEAD
    child.wait()
    elsewhere = tempnames.Writer("abcdef" if me.host != "abcdef" else "123456", "0", 1, "1")
    assert tempnames.liveness(elsewhere) is tempnames.Liveness.UNKNOWN


def test_sweep_removes_dead_writers_files_only(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0").write_bytes(b"chunk")
    dead = plant(tmp_path / "a", "1", dead_writer())
    live = plant(tmp_path / "a", "2", tempnames.current())
    old = tmp_path / "a" / f".3.{'0' * 32}{tempnames.PARTIAL_SUFFIX}"  # an older n5fs
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    found = {left.path: left for left in store.leftovers()}
    assert set(found) == {f"a/{p.name}" for p in (dead, live, old)}
    assert found[f"a/{dead.name}"].dead
    assert not found[f"a/{live.name}"].dead
    removed = {left.path for left in store.sweep()}
    assert removed == {f"a/{dead.name}", f"a/{old.name}"}
    assert live.exists()
    assert not dead.exists()
    assert not old.exists()
    assert store.get("a/0") == b"chunk"


def test_rmdir_is_not_blocked_by_dead_writers_files(tmp_path: Path) -> None:
    gw = Gateway(FileStore(tmp_path), GatewayConfig())
    gw.mkdir("/d")
    plant(tmp_path / "d", "0", dead_writer())
    gw.rmdir("/d")
    assert not (tmp_path / "d").exists()
    gw.mkdir("/e")
    plant(tmp_path / "e", "0", tempnames.current())  # a live writer's: its rename would fail
    with pytest.raises(OSError):
        gw.rmdir("/e")


def test_validate_reports_leftovers(tmp_path: Path) -> None:
    (tmp_path / ".zgroup").write_text('{"zarr_format": 2}')
    planted = plant(tmp_path / "x", "0", dead_writer())
    report = Validator(FileStore(tmp_path), jobs=1).run()
    assert [left.path for left in report.leftovers] == [f"x/{planted.name}"]
    assert report.to_json()["leftovers"][0]["writer_gone"] is True


# -- folder renames on stores that move key by key ----------------------------------------------


class Recording(MemoryStore):
    """A memory store that logs every change, to replay any prefix of a rename. A MemoryStore
    itself, not a wrapper: the single copies and deletes its batches are made of are logged."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str, str]] = []

    def copy(self, src: str, dst: str) -> None:
        self.ops.append(("copy", src, dst))
        super().copy(src, dst)

    def delete(self, key: str) -> None:
        self.ops.append(("delete", key, ""))
        super().delete(key)


ZARRAY = (
    b'{"zarr_format": 2, "shape": [4, 4], "chunks": [2, 2], "dtype": "<u1", "compressor": null,'
    b' "fill_value": 0, "order": "C", "filters": null}'
)


def arrays_complete(state: dict[str, bytes]) -> list[str]:
    """Folders that hold an array's metadata but not all four of its chunks."""
    broken = []
    for key in state:
        if key.endswith(".zarray"):
            folder = key.removesuffix(".zarray")
            chunks = [f"{folder}{i}.{j}" for i in range(2) for j in range(2)]
            if not all(chunk in state for chunk in chunks):
                broken.append(folder)
    return broken


def test_folder_rename_order_is_safe_to_interrupt_anywhere() -> None:
    store = Recording()
    gw = Gateway(store, GatewayConfig())
    gw.write_file("/src/.zgroup", b'{"zarr_format": 2}')
    for name in ("a", "b"):
        gw.write_file(f"/src/{name}/.zarray", ZARRAY)
        gw.write_file(f"/src/{name}/.zattrs", b'{"x": 1}')
        for i in range(2):
            for j in range(2):
                gw.write_file(f"/src/{name}/{i}.{j}", bytes(4))
    before = {info.key: store.get(info.key) or b"" for info in store.walk()}
    store.ops.clear()
    gw.rename("/src", "/dst")
    assert not any(key.startswith("src/") for key in (i.key for i in store.walk()))
    # replay every prefix of what the rename did: no array is ever missing a chunk
    state = dict(before)
    for kind, key, dst in store.ops:
        if kind == "copy":
            state[dst] = state[key]
        else:
            state.pop(key, None)
        assert arrays_complete(state) == [], (kind, key)
    copies = [k for kind, k, _ in store.ops if kind == "copy"]
    metadata = [i for i, k in enumerate(copies) if os.path.basename(k).startswith(".z")]
    assert metadata == list(range(len(copies) - len(metadata), len(copies)))  # metadata last


def test_file_store_renames_folders_in_one_step(tmp_path: Path) -> None:
    assert FileStore(tmp_path).traits.atomic_prefix_rename
    assert not MemoryStore().traits.atomic_prefix_rename


# -- modification times ----------------------------------------------------------------------


def test_utimens_is_stored_and_served(tmp_path: Path) -> None:
    gw = Gateway(FileStore(tmp_path), GatewayConfig())
    gw.write_file("/f", b"data")
    gw.utimens("/f", 1_000_000_000.5)
    assert gw.stat("/f").mtime == pytest.approx(1_000_000_000.5)
    assert os.stat(tmp_path / "f").st_mtime == pytest.approx(1_000_000_000.5)
    fresh = Gateway(FileStore(tmp_path), GatewayConfig())  # a remount sees it too
    assert fresh.stat("/f").mtime == pytest.approx(1_000_000_000.5)


def test_utimens_while_staged_is_applied_by_the_commit(tmp_path: Path) -> None:
    gw = Gateway(FileStore(tmp_path), GatewayConfig())
    fh = gw.create("/g", os.O_WRONLY)
    gw.write(fh, b"abc", 0)
    gw.utimens("/g", 1_234_567_890.0)  # cp -a: futimens before close
    assert gw.stat("/g").mtime == pytest.approx(1_234_567_890.0)
    gw.flush(fh)
    gw.release(fh)
    assert os.stat(tmp_path / "g").st_mtime == pytest.approx(1_234_567_890.0)
    assert gw.stat("/g").mtime == pytest.approx(1_234_567_890.0)


def test_validate_cli_lists_leftovers(tmp_path: Path) -> None:
    (tmp_path / ".zgroup").write_text('{"zarr_format": 2}')
    planted = plant(tmp_path / "x", "0", dead_writer())
    out = subprocess.run(
        [sys.executable, "-m", "n5fs", "validate", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr  # leftovers are reported, not invalid
    assert f"LEFTOVER temp file x/{planted.name}" in out.stdout
    assert "its writer is gone" in out.stdout


def test_a_refused_commit_drops_the_time_set_for_it(tmp_path: Path) -> None:
    gw = Gateway(FileStore(tmp_path), GatewayConfig())
    gw.write_file("/g/.zgroup", b'{"zarr_format": 2}')
    gw.write_file("/g/notes", b"v1")
    fh = gw.open("/g/notes", os.O_RDWR)
    gw.write(fh, b"v2", 0)
    gw.utimens("/g/notes", 1_000_000_000.0)
    gw.flush(fh)
    gw.release(fh)
    assert os.stat(tmp_path / "g" / "notes").st_mtime == pytest.approx(1_000_000_000.0)
    fh = gw.create("/g/.zattrs", os.O_WRONLY)
    gw.write(fh, b"[not json", 0)
    gw.utimens("/g/.zattrs", 1_000_000_000.0)
    with pytest.raises(Rejected):
        gw.flush(fh)
    gw.write(fh, b'{"ok": 1}', 0)
    gw.truncate("/g/.zattrs", 9, fh)
    gw.flush(fh)  # the new content, committed now, gets its own time
    gw.release(fh)
    assert os.stat(tmp_path / "g" / ".zattrs").st_mtime > 1_500_000_000
