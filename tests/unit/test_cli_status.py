"""``n5fs status`` and the state files of daemons that are gone: listed with a hint, removed by
``--prune`` only when the daemon is provably gone and nothing is mounted at its mount point.

The daemons are real processes this test started: one exited and reaped, one exited and not
reaped (a zombie), and this test's own process standing for a running daemon (with its real
writer tag) or for a pid reused by a younger process (a tag whose start time differs). The
mount table is the real one: ``/`` is always mounted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from n5fs.cli import status
from n5fs.cli.daemon import read_state, state_path, write_state
from n5fs.cli.main import main
from n5fs.kvstore import tempnames

HINT = "(run n5fs status --prune to remove)"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "state"
    monkeypatch.setenv("N5FS_STATE_DIR", str(directory))
    return directory


@pytest.fixture
def reaped_pid() -> int:
    """The pid of a process that ran, exited and was reaped: no process holds it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def zombie_pid() -> Iterator[int]:
    """The pid of a process that exited and is not reaped yet: a zombie until teardown."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
    yield child.pid
    child.wait()


def plant(mountpoint: str | Path, pid: int, **extra: Any) -> Path:
    """A state file as a daemon mounting at ``mountpoint`` writes it."""
    path = state_path(str(mountpoint))
    state = {
        "mountpoint": str(mountpoint),
        "source": "/data/x",
        "mode": "ro",
        "validate": "strict",
        "pid": pid,
        "started": time.time(),
        **extra,
    }
    write_state(path, state)
    return path


def reused_tag() -> str:
    """This process's writer tag with another start time: its pid, reused by a younger
    process, once named a daemon that is gone."""
    me = tempnames.current()
    return tempnames.Writer(me.host, me.boot, me.pid, me.start + "0").tag


def ours(rows: list[dict[str, Any]], root: Path) -> dict[str, dict[str, Any]]:
    """Rows of this test's state files (the machine may have other mounts)."""
    return {
        row["mountpoint"]: row
        for row in rows
        if str(row.get("mountpoint", "")).startswith(str(root)) or row.get("mountpoint") == "/"
    }


def test_status_lists_stale_state_files_with_a_hint_and_prune_removes_only_those(
    tmp_path: Path, state_dir: Path, reaped_pid: int, zombie_pid: int, capsys
) -> None:
    killed = plant(tmp_path / "killed", reaped_pid)
    zombie = plant(tmp_path / "zombie", zombie_pid)
    reused = plant(tmp_path / "reused", os.getpid(), writer=reused_tag())
    running = plant(tmp_path / "running", os.getpid(), writer=tempnames.current().tag)
    untagged = plant(tmp_path / "untagged", os.getpid())  # an older n5fs wrote no tag
    mounted = plant("/", reaped_pid)  # gone, but something is mounted there
    stale = {killed, zombie, reused}

    code, out, _ = run(["status", "--json"], capsys)
    assert code == 0
    rows = ours(json.loads(out), tmp_path)
    for name in ("killed", "zombie", "reused"):
        row = rows[str(tmp_path / name)]
        assert row["stale"] is True
        assert row["state"].endswith(HINT)
    for name in ("running", "untagged"):
        row = rows[str(tmp_path / name)]
        assert (row["stale"], row["state"]) == (False, "daemon running, not mounted")
    assert rows["/"]["stale"] is False
    assert HINT not in rows["/"]["state"]

    code, out, _ = run(["status"], capsys)
    assert code == 0
    hinted = [line for line in out.splitlines() if line.endswith(HINT)]
    assert sorted(line.split()[0] for line in hinted if line.startswith(str(tmp_path))) == [
        str(tmp_path / name) for name in ("killed", "reused", "zombie")
    ]
    assert all(path.exists() for path in stale)  # listing never removes

    code, out, _ = run(["status", "--prune"], capsys)
    assert code == 0
    said = sorted(line for line in out.splitlines() if line.startswith("removed "))
    assert said == [
        f"removed stale state file {path}: {tmp_path / name} (source /data/x, daemon pid {pid} "
        "gone, not mounted)"
        for path, name, pid in sorted(
            [
                (killed, "killed", reaped_pid),
                (reused, "reused", os.getpid()),
                (zombie, "zombie", zombie_pid),
            ],
            key=lambda found: f"removed stale state file {found[0]}",
        )
    ]
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in (running, untagged, mounted))
    assert HINT not in out

    code, out, err = run(["status", "--prune", "--json"], capsys)
    assert (code, err) == (0, "no stale state files\n")  # stdout holds the JSON only
    assert str(tmp_path / "running") in ours(json.loads(out), tmp_path)


def test_prune_keeps_a_state_file_a_new_daemon_wrote_after_the_judgement(
    tmp_path: Path, state_dir: Path, reaped_pid: int, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A daemon mounting at the same place replaces the stale file between prune's judgement
    and its removal: the new file stays, and nothing is said removed."""
    mountpoint = tmp_path / "again"
    path = plant(mountpoint, reaped_pid)
    judged = status.stale_state_files

    def then_a_new_daemon_writes(mounted: set[Path]) -> list[tuple[Path, dict[str, Any]]]:
        found = judged(mounted)
        assert [p for p, _ in found] == [path]
        plant(mountpoint, os.getpid(), writer=tempnames.current().tag)
        return found

    monkeypatch.setattr(status, "stale_state_files", then_a_new_daemon_writes)
    code, out, _ = run(["status", "--prune"], capsys)
    assert code == 0
    assert "no stale state files" in out
    state = read_state(path)
    assert state is not None
    assert (state["pid"], state["writer"]) == (os.getpid(), tempnames.current().tag)
    assert sorted(p.name for p in state_dir.iterdir()) == [path.name]  # nothing held left


def test_a_state_file_without_a_pid_is_never_pruned(tmp_path: Path, state_dir: Path, capsys):
    path = state_path(str(tmp_path / "odd"))
    write_state(path, {"mountpoint": str(tmp_path / "odd"), "source": "/data/x"})
    code, out, _ = run(["status", "--prune", "--json"], capsys)
    assert code == 0
    row = ours(json.loads(out), tmp_path)[str(tmp_path / "odd")]
    assert (row["stale"], row["state"]) == (False, "not mounted (the state file names no daemon)")
    assert path.exists()


def test_status_help_teaches_prune(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--prune" in text
    assert "stale" in text
    assert "daemon gone and mount point not mounted" in text
