"""``n5fs status``: which n5fs mounts this machine has, and how each is doing.

Its own module because it reads: the kernel's mount table, the state files the daemons
leave (cli/daemon.py) and each mount's ``/.n5fs/stats.json``. A hung mount must not hang
``status``, so the counters are read in a helper thread with a timeout.

The one thing it writes is ``--prune``: it removes *stale* state files, those whose daemon is
provably gone (:func:`daemon_gone`: its pid runs no more, a zombie counting as gone, or now
runs a younger process) while nothing is mounted at their mount point. A killed daemon (kill
-9, OOM) leaves one, which nothing else ever removes; a daemon still running, or a mount
still in the table (a stale FUSE mount is ``n5fs unmount``'s to clean), keeps its file.
Without ``--prune`` a stale file is listed with the hint to prune it. A daemon mounting at the
same place meanwhile keeps its new file (:func:`~n5fs.cli.daemon.remove_state_if_unchanged`).

A person gets a table (a header, one row per mount, then an indented line of the counters
that matter, byte counts in binary units); ``--json`` gives every raw field and counter.
"""

from __future__ import annotations

import errno
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from n5fs.cli.daemon import read_state, remove_state_if_unchanged, state_dir, state_path
from n5fs.fuse_front.mounts import mounts
from n5fs.kvstore import tempnames

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from n5fs.fuse_front.mounts import MountEntry

#: the table's columns: header, and how a row shows in it
COLUMNS = ("MOUNTPOINT", "SOURCE", "MODE", "PID", "STATE")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
#: what a stale state file's row ends with
PRUNE_HINT = "(run n5fs status --prune to remove)"


def mount_status(timeout: float = 2.0) -> list[dict[str, Any]]:
    """Every n5fs mount of the kernel's table with its state file and counters, then state
    files whose mount is gone (``stale`` when their daemon is gone too)."""
    rows: list[dict[str, Any]] = []
    seen: set[Path] = set()
    table = mounts()
    for entry in table:
        if not entry.is_n5fs:
            continue
        path = state_path(entry.mountpoint)
        seen.add(path)
        state = read_state(path) or {}
        row: dict[str, Any] = {"mountpoint": entry.mountpoint, "source": entry.source, **state}
        row["state"], row["counters"] = _health(entry.mountpoint, timeout)
        rows.append(row)
    mounted = _mounted_places(table)
    for path, orphan in _state_files():
        if path not in seen:
            stale = _stale(path, orphan, mounted)
            state_text = _orphan_state(orphan, stale)
            rows.append({**orphan, "state": state_text, "counters": {}, "stale": stale})
    return rows


def _state_files() -> list[tuple[Path, dict[str, Any]]]:
    directory = state_dir()
    found = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return [(path, state) for path in found if (state := read_state(path)) is not None]


def _mounted_places(table: list[MountEntry]) -> set[Path]:
    """The state file names of every mount point in the table, n5fs's or not."""
    return {state_path(entry.mountpoint) for entry in table}


def _stale(path: Path, state: Mapping[str, Any], mounted: set[Path]) -> bool:
    """Nothing is mounted where the file says (by its name and by its ``mountpoint``) and its
    daemon is provably gone."""
    place = state.get("mountpoint")
    if path in mounted or (isinstance(place, str) and state_path(place) in mounted):
        return False
    return daemon_gone(state)


def daemon_gone(state: Mapping[str, Any]) -> bool:
    """Is the daemon that wrote ``state`` provably gone? As temp files' writers are judged
    (kvstore/tempnames.py): its recorded writer tag (pid, start time, boot) names no running
    process, so a pid reused by a younger process counts as gone; a file without the tag
    (an older n5fs) is judged by its pid, which a zombie no longer holds. A file without a
    pid proves nothing."""
    pid = _pid(state)
    if pid is None:
        return False
    tag = state.get("writer")
    writer = tempnames.writer_of(tag) if isinstance(tag, str) else None
    if writer is not None and writer.pid == pid:
        return tempnames.liveness(writer) is tempnames.Liveness.DEAD
    return not tempnames.process_alive(pid)


def _pid(state: Mapping[str, Any]) -> int | None:
    pid = state.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def prune_stale() -> list[dict[str, Any]]:
    """Remove the stale state files; the states of those removed (each with its ``file``)."""
    mounted = _mounted_places(mounts())
    removed: list[dict[str, Any]] = []
    for path, state in stale_state_files(mounted):
        if remove_state_if_unchanged(path, state):
            removed.append({**state, "file": str(path)})
    return removed


def stale_state_files(mounted: set[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The state files :func:`prune_stale` would remove, judged now."""
    return [(path, state) for path, state in _state_files() if _stale(path, state, mounted)]


def _orphan_state(state: Mapping[str, Any], stale: bool) -> str:
    """A state file without its n5fs mount: a daemon still finishing, or one that was killed."""
    if stale:
        return f"not mounted, daemon gone (stale state file) {PRUNE_HINT}"
    if _pid(state) is None:
        return "not mounted (the state file names no daemon)"
    if not daemon_gone(state):
        return "daemon running, not mounted"
    return "daemon gone; another filesystem is mounted there"


def removal_line(state: Mapping[str, Any]) -> str:
    """What ``--prune`` says of one file it removed."""
    pid = state.get("pid")
    return (
        f"removed stale state file {state['file']}: {state.get('mountpoint', '?')} "
        f"(source {state.get('source', '?')}, daemon pid {pid} gone, not mounted)"
    )


def _health(mountpoint: str, timeout: float) -> tuple[str, dict[str, Any]]:
    """Read ``/.n5fs/stats.json`` in a helper thread: a hung mount must not hang status."""
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            result["stats"] = json.loads(Path(mountpoint, ".n5fs", "stats.json").read_bytes())
        except Exception as exc:  # noqa: BLE001 (any failure is a state to show)
            result["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return f"not answering within {timeout:g} s", {}
    error = result.get("error")
    if isinstance(error, OSError) and error.errno == errno.ENOTCONN:
        return "stale: its daemon is gone (run n5fs unmount)", {}
    if error is not None:
        return f"answering, no counters ({error})", {}
    return "mounted", result["stats"]


# == the table ====================================================================================


def human_bytes(count: int) -> str:
    """``12.3 MiB``: binary units, as ``du -h``, ``free -h`` and n5fs's size options."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def counters_line(counters: Mapping[str, Any]) -> str:
    """The counters a person looks at, in words; the rest are in ``--json``."""

    def n(name: str) -> int:
        value = counters.get(name, 0)
        return value if isinstance(value, int) else 0

    network = (
        [f"S3: {n('s3_retries')} retries, {n('s3_throttled')} throttled"]
        if "s3_rate_limit" in counters
        else []
    )
    uploads = (
        [
            (
                f"{n('writeback_pending_files')} uploads pending "
                f"({human_bytes(n('writeback_pending_bytes'))}, oldest "
                f"{n('writeback_oldest_seconds')} s, {n('writeback_failing')} failing)"
            )
        ]
        if "writeback_pending_files" in counters
        else []
    )
    return ", ".join(
        [
            f"{n('commits')} commits",
            f"{n('rejections')} rejected",
            f"{human_bytes(n('bytes_in'))} in",
            f"{human_bytes(n('bytes_out'))} out",
            f"{n('store_reads')} store reads",
            f"cache {n('cache_hits')} hits/{n('cache_misses')} misses",
            f"{human_bytes(n('cache_bytes'))} cached",
            f"{n('open_handles')} open files",
            f"{human_bytes(n('staging_bytes'))} staged",
            *uploads,
            *network,
        ]
    )


def consistency_line(counters: Mapping[str, Any]) -> str:
    """What other mounts of the store this one keeps up with, and how (``docs/semantics.md``,
    "Many mounts of one bucket")."""
    mode = counters.get("consistency", "?")
    conditional = counters.get("conditional_writes", "?")
    conflicts = counters.get("conflicts", 0)
    return f"consistency {mode}; conditional writes {conditional}; {conflicts} conflicts"


def table_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    mode = f"{row.get('mode', '?')},{row.get('validate', '?')}"
    pid = row.get("pid")
    return (
        str(row.get("mountpoint", "?")),
        str(row.get("source", "?")),
        mode,
        str(pid) if pid is not None else "-",
        str(row.get("state", "?")),
    )


def render_table(rows: list[dict[str, Any]]) -> list[str]:
    """A header and one line per mount (columns padded to their widest cell; the last column
    is not), each followed by its counters, indented, when the mount answered."""
    cells = [table_cells(row) for row in rows]
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS) - 1)]

    def line(values: tuple[str, ...]) -> str:
        padded = [value.ljust(width) for value, width in zip(values[:-1], widths, strict=True)]
        return "  ".join([*padded, values[-1]])

    lines = [line(COLUMNS)]
    for row, values in zip(rows, cells, strict=True):
        lines.append(line(values))
        if row.get("counters"):
            lines.append("    " + counters_line(row["counters"]))
            if "consistency" in row["counters"]:  # a view's counters do not say
                lines.append("    " + consistency_line(row["counters"]))
    return lines


def run_status(args: argparse.Namespace) -> int:
    if args.prune:
        removed = prune_stale()
        lines = [removal_line(state) for state in removed] or ["no stale state files"]
        for text in lines:  # with --json, stdout holds the JSON only
            print(text, file=sys.stderr if args.json else sys.stdout)
    rows = mount_status()
    left = unuploaded_journals()
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("no n5fs mounts")
    else:
        for text in render_table(rows):
            print(text)
    for line in left:
        print(line)
    return 0


def unuploaded_journals() -> list[str]:
    """Write-back journals no mount holds (a daemon killed or stopped with uploads failing):
    what they hold is uploaded by the next mount of their source."""
    from n5fs.kvstore.state import state_home
    from n5fs.kvstore.writeback.journal import journal_root, orphans

    return [
        f"{human_bytes(o.bytes)} of writes not uploaded yet for {o.source} ({o.folder}): the "
        "next mount of it uploads them"
        for o in orphans(journal_root(state_home()))
    ]
