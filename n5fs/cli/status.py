"""``n5fs status``: which n5fs mounts this machine has, and how each is doing.

Its own module because it only reads: the kernel's mount table, the state files the daemons
leave (cli/daemon.py) and each mount's ``/.n5fs/stats.json``. A hung mount must not hang
``status``, so the counters are read in a helper thread with a timeout.

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

from n5fs.cli.daemon import process_alive, read_state, state_dir, state_path
from n5fs.fuse_front.mounts import mounts

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

#: the table's columns: header, and how a row shows in it
COLUMNS = ("MOUNTPOINT", "SOURCE", "MODE", "PID", "STATE")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def mount_status(timeout: float = 2.0) -> list[dict[str, Any]]:
    """Every n5fs mount of the kernel's table with its state file and counters, then state
    files whose mount is gone."""
    rows: list[dict[str, Any]] = []
    seen: set[Path] = set()
    for entry in mounts():
        if not entry.is_n5fs:
            continue
        path = state_path(entry.mountpoint)
        seen.add(path)
        state = read_state(path) or {}
        row: dict[str, Any] = {"mountpoint": entry.mountpoint, "source": entry.source, **state}
        row["state"], row["counters"] = _health(entry.mountpoint, timeout)
        rows.append(row)
    directory = state_dir()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        orphan = read_state(path) if path not in seen else None
        if orphan is not None:
            rows.append({**orphan, "state": _orphan_state(orphan), "counters": {}})
    return rows


def _orphan_state(state: dict[str, Any]) -> str:
    """A state file without its mount: a daemon still finishing, or one that was killed."""
    pid = state.get("pid")
    if isinstance(pid, int) and process_alive(pid):
        return "daemon running, not mounted"
    return "not mounted (stale state file)"


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
    rows = mount_status()
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("no n5fs mounts")
        return 0
    for text in render_table(rows):
        print(text)
    return 0
