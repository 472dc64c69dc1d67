"""``n5fs mount``, ``n5fs unmount`` and ``n5fs status``.

``mount`` opens the source and looks at it in the calling process, so a bad URL, missing
credentials or a missing directory reach the terminal (exit 2 with the reason). Then, like
sshfs, it goes to the background: fork before any thread exists (boto3 pools, libfuse
workers), ``setsid``, fork again, and the daemon opens the store afresh. The caller returns
only once the mount answers (a stat of its root was served), or with the daemon's own words
(libfuse's message included) when it could not mount. FUSE is imported in the daemon only.

A running mount leaves a state file (source, mode, pid, log) in the state directory
(``$N5FS_STATE_DIR``, else ``$XDG_RUNTIME_DIR/n5fs``, ``/run/n5fs`` for root, or
``/tmp/n5fs-UID``); ``status`` joins them with the kernel's mount table and each mount's
``/.n5fs/stats.json``.

Under systemd (``systemd/n5fs@.service``) the mount runs with ``--foreground --config FILE``
(cli/config.py): the process is the unit's main process and reports READY=1, STATUS= and
STOPPING=1 over ``NOTIFY_SOCKET`` (cli/sdnotify.py).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from n5fs.cli.commands import add_s3_arguments, source_from_args
from n5fs.cli.config import apply_config, load_config
from n5fs.cli.daemon import (
    daemonize,
    process_alive,
    read_state,
    remove_state,
    state_dir,
    state_path,
    wait_exit,
    write_state,
)
from n5fs.cli.sdnotify import Notifier, ServiceLink, status_line
from n5fs.errors import InvalidSource, N5fsError
from n5fs.fuse_front.mounts import MountFailed, is_stale, mount_entry, mounts, unmount
from n5fs.fuse_front.options import (
    VALIDATE_MODES,
    MountOptions,
    parse_options,
    parse_seconds,
    parse_size,
)

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("n5fs.cli.mount")

READY_TIMEOUT = 60.0
DEFAULT_CACHE = 256 << 20
DEFAULT_TTL = 5.0
DEFAULT_STAGING = 256 << 20
DEFAULT_MAX_FILE_SIZE = 1 << 40
#: n5fs's ``-o`` sizes that fuse_front.options leaves among libfuse's: taken out here
_OWN_SIZE_OPTIONS = ("staging_size", "max_file_size")


# == the plan: everything decided before forking ==================================================


@dataclass(frozen=True)
class MountPlan:
    source: str
    fsname: str
    mountpoint: str
    options: MountOptions
    validate: str
    cache_bytes: int
    ttl: float
    log_file: str | None
    staging_bytes: int = DEFAULT_STAGING
    max_file_size: int = DEFAULT_MAX_FILE_SIZE

    @property
    def read_only(self) -> bool:
        return self.options.read_only


def make_plan(args: argparse.Namespace) -> MountPlan:
    opts = parse_options(args.options or [])
    sizes = _own_sizes(opts)
    mountpoint = check_mountpoint(args.mountpoint)
    fsname = probe_source(args.source, read_only=opts.read_only)
    cache = args.cache_size if args.cache_size is not None else opts.cache_bytes
    ttl = args.cache_ttl if args.cache_ttl is not None else opts.ttl
    log_file = args.log_file
    if log_file is None and not args.foreground:
        log_file = str(state_path(mountpoint).with_suffix(".log"))
    return MountPlan(
        source=args.source,
        fsname=fsname,
        mountpoint=mountpoint,
        options=opts,
        validate=args.validate or opts.validate or "strict",
        cache_bytes=DEFAULT_CACHE if cache is None else cache,
        ttl=DEFAULT_TTL if ttl is None else ttl,
        log_file=log_file,
        staging_bytes=_pick(args.staging_size, sizes.get("staging_size"), DEFAULT_STAGING),
        max_file_size=_pick(args.max_file_size, sizes.get("max_file_size"), DEFAULT_MAX_FILE_SIZE),
    )


def _own_sizes(opts: MountOptions) -> dict[str, int]:
    """Take ``staging_size=`` and ``max_file_size=`` out of the options meant for libfuse
    (which would refuse them) and read them as sizes."""
    sizes: dict[str, int] = {}
    for name in _OWN_SIZE_OPTIONS:
        value = opts.fuse.pop(name, None)
        if value is True:
            raise InvalidSource(f"-o {name} needs a size, e.g. {name}=512M")
        if isinstance(value, str):
            sizes[name] = parse_size(value)
    return sizes


def _pick(flag: int | None, option: int | None, default: int) -> int:
    """The command-line flag, else the ``-o`` option (or config file), else the default."""
    if flag is not None:
        return flag
    return default if option is None else option


def check_mountpoint(path: str) -> str:
    """An existing directory that nothing is mounted on; a stale FUSE mount there (its
    daemon died) is detached first, as systemd's restart expects."""
    mountpoint = os.path.abspath(path)
    if is_stale(mountpoint):
        log.warning("%s is a stale mount (its daemon is gone); detaching it", mountpoint)
        unmount(mountpoint, lazy=True)
    if not os.path.isdir(mountpoint):
        raise MountFailed(f"mountpoint {mountpoint} is not a directory")
    entry = mount_entry(mountpoint)
    if entry is not None:
        raise MountFailed(f"{mountpoint} is already mounted ({entry.fstype} from {entry.source})")
    return mountpoint


def probe_source(text: str, *, read_only: bool) -> str:
    """Open the source, list its root and detect its format, then close it again: errors
    surface here, before the fork. Returns the name the mount shows (``df``, ``mount``)."""
    from n5fs.cli.commands import open_cli_source
    from n5fs.detect import Detector
    from n5fs.kvstore.spec import FileSpec

    source = open_cli_source(text, read_only=read_only)
    with source.store:
        spec = source.spec
        local = isinstance(spec, FileSpec) and source.container is None
        if local and not os.path.isdir(spec.path):
            raise InvalidSource(f"{text}: no such directory")
        source.store.list("")
        try:
            folder = Detector(source.store).folder("")
            fmt = f" ({folder.fmt})" if folder.fmt else ""
            log.info("%s: the root folder is a %s%s", text, folder.kind.value, fmt)
        except N5fsError as exc:
            log.warning("%s: the root folder's format is unclear: %s", text, exc)
    return spec.to_url() if text.lstrip().startswith("{") else text


# == serving (foreground, or inside the daemon) ===================================================


def serve_plan(
    plan: MountPlan,
    on_ready: Callable[[], None] | None = None,
    *,
    notifier: Notifier | None = None,
) -> None:
    """Open the store, mount it, and block until unmounted; the state file lives meanwhile.
    With a ``notifier`` (systemd), READY=1 follows the first answered stat, STATUS= the
    counters, STOPPING=1 the signal."""
    from n5fs.cli.commands import open_cli_source
    from n5fs.fuse_front._lib import LIBFUSE_VERSION, describe
    from n5fs.fuse_front.mount import serve
    from n5fs.fuse_front.options import fuse_options, render
    from n5fs.gateway import Gateway, GatewayConfig

    source = open_cli_source(plan.source, read_only=plan.read_only)
    config = GatewayConfig(
        validate=plan.validate,
        read_only=plan.read_only,
        cache_bytes=plan.cache_bytes,
        ttl=plan.ttl,
        staging_bytes=plan.staging_bytes,
        max_file_size=plan.max_file_size,
    )
    gateway = Gateway(source.store, config)
    fuse = fuse_options(
        plan.options,
        read_only=gateway.read_only,
        ttl=plan.ttl,
        fsname=plan.fsname,
        libfuse_major=LIBFUSE_VERSION[0],
    )
    state = {
        "mountpoint": plan.mountpoint,
        "source": plan.source,
        "mode": "ro" if gateway.read_only else "rw",
        "validate": plan.validate,
        "pid": os.getpid(),
        "started": time.time(),
        "log_file": plan.log_file,
        "fuse_options": render(fuse),
        "library": describe(),
    }
    path = state_path(plan.mountpoint)
    link = None
    if notifier is not None:
        link = ServiceLink(
            notifier, lambda: status_line(plan.fsname, plan.mountpoint, gateway.stats())
        )

    def ready() -> None:
        write_state(path, state)
        if link is not None:
            link.ready()
        if on_ready is not None:
            on_ready()

    try:
        serve(
            gateway,
            plan.mountpoint,
            fuse,
            on_ready=ready,
            on_stopping=None if link is None else link.stopping,
        )
    finally:
        if link is not None:
            link.close()
        remove_state(path, os.getpid())


# == commands =====================================================================================


def run_mount(args: argparse.Namespace) -> int:
    if args.config is not None:
        apply_config(args, load_config(args.config))
    for name, what in (("source", "SOURCE"), ("mountpoint", "MOUNTPOINT")):
        if getattr(args, name) is None:
            raise InvalidSource(
                f"n5fs mount needs a {what}: give it on the command line or as {name!r} in "
                "the --config file"
            )
    args.source = source_from_args(args)
    if args.log_level is not None:
        logging.getLogger("n5fs").setLevel(args.log_level.upper())
    if args.foreground:
        return run_foreground(args)
    plan = make_plan(args)
    return daemonize(
        lambda ready: serve_plan(plan, on_ready=ready),
        what=f"mount of {plan.source} at {plan.mountpoint}",
        log_file=plan.log_file,
        timeout=READY_TIMEOUT,
    )


def run_foreground(args: argparse.Namespace) -> int:
    """Serve in this process (systemd's ``Type=notify`` main process, or debugging); a
    failure to start becomes the unit's STATUS= too."""
    notifier = Notifier.from_environment()
    try:
        serve_plan(make_plan(args), notifier=notifier)
    except N5fsError as exc:
        if notifier is not None:
            notifier.status(f"failed: {exc}")
        raise
    finally:
        if notifier is not None:
            notifier.close()
    return 0


def run_unmount(args: argparse.Namespace) -> int:
    mountpoint = os.path.abspath(args.mountpoint)
    stale = is_stale(mountpoint)
    entry = mount_entry(mountpoint)
    if entry is None and not stale:
        raise MountFailed(f"{mountpoint} is not mounted")
    if entry is not None and not entry.fstype.startswith("fuse"):
        raise MountFailed(f"{mountpoint} is a {entry.fstype} mount; n5fs unmounts FUSE mounts")
    path = state_path(mountpoint)
    state = read_state(path)
    unmount(mountpoint, lazy=args.lazy or stale)
    pid = state.get("pid") if state is not None else None
    if isinstance(pid, int) and not wait_exit(pid, args.timeout):
        raise MountFailed(
            f"{mountpoint} is unmounted, but its daemon (pid {pid}) is still committing after "
            f"{args.timeout:g} s"
        )
    if isinstance(pid, int):
        remove_state(path, pid)  # the daemon removes it; a killed one could not
    return 0


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


def run_status(args: argparse.Namespace) -> int:
    rows = mount_status()
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("no n5fs mounts")
    for row in rows:
        mode = f"{row.get('mode', '?')},{row.get('validate', '?')}"
        print(
            f"{row.get('mountpoint')}  {row.get('source')}  {mode}  pid {row.get('pid', '?')}  "
            f"{row['state']}"
        )
        counters = row["counters"]
        if counters:
            print("    " + " ".join(f"{k}={v}" for k, v in sorted(counters.items())))
    return 0


# == argparse =====================================================================================


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except InvalidSource as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        return parse_seconds(text)
    except InvalidSource as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_mount_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mount",
        help="mount a store as a directory tree (validating every write)",
        description="Mount SOURCE at MOUNTPOINT. Goes to the background once the mount "
        "answers (exit 0), or exits 2 with the reason. Writes are validated at close() and "
        "rename(); a refused one fails with EINVAL and is listed in MOUNTPOINT/.n5fs/rejections.",
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        nargs="?",
        help="URL or JSON kvstore spec (see n5fs --help); optional with --config",
    )
    p.add_argument(
        "mountpoint",
        metavar="MOUNTPOINT",
        nargs="?",
        help="an existing directory; optional with --config",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a TOML file with source, mountpoint and settings (systemd/n5fs.toml.example); "
        "command-line flags override it",
    )
    add_s3_arguments(p)
    p.add_argument(
        "-o",
        dest="options",
        action="append",
        metavar="OPTIONS",
        help="comma-separated: ro, allow_other, default_permissions, validate=MODE, "
        "cache_size=SIZE, cache_ttl=SECONDS, staging_size=SIZE, max_file_size=SIZE; others "
        "go to libfuse",
    )
    p.add_argument(
        "--validate",
        choices=VALIDATE_MODES,
        default=None,
        help="strict (refuse invalid writes; default), warn (store and log), off",
    )
    p.add_argument(
        "--cache-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="memory for cached object bytes, e.g. 512M, 2G (default 256M)",
    )
    p.add_argument(
        "--staging-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="memory all open files together may use for written bytes not yet committed "
        "(they go to the store at close/fsync/rename); beyond it, and for any file over 64M, "
        "they wait in sparse temp files under $TMPDIR (default 256M)",
    )
    p.add_argument(
        "--max-file-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="the largest size a write or truncate may give a file; beyond it the call fails "
        "with EFBIG (File too large), so a runaway writer cannot fill the temp disk "
        "(default 1T)",
    )
    p.add_argument(
        "--cache-ttl",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="how long listings and stats are trusted; also the kernel's attr/entry "
        "timeouts (default 5)",
    )
    p.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay in the foreground (systemd, debugging); logs go to stderr",
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=None)
    p.add_argument(
        "--log-file",
        default=None,
        metavar="PATH",
        help="where the daemon logs (default: beside its state file)",
    )
    p.set_defaults(run=run_mount)

    p = sub.add_parser(
        "unmount",
        help="unmount an n5fs mount (also clears a stale one)",
        description="Unmount MOUNTPOINT and wait until its daemon has committed what was "
        "staged and closed the store. A stale mount (daemon gone) is detached lazily.",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument(
        "-z",
        "--lazy",
        action="store_true",
        help="detach now even if busy; the daemon exits when the last user leaves",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the daemon to finish (default 60)",
    )
    p.set_defaults(run=run_unmount)

    p = sub.add_parser(
        "status",
        help="list active n5fs mounts with their counters",
        description="List the n5fs mounts of this machine: source, mountpoint, mode, daemon "
        "pid, health and the counters of MOUNTPOINT/.n5fs/stats.json.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.set_defaults(run=run_status)
