"""``n5fs mount``, ``n5fs unmount`` and ``n5fs status``.

``mount`` opens the source and looks at it in the calling process, so a bad URL, missing
credentials or a missing directory reach the terminal (exit 2 with the reason). Then, like
sshfs, it goes to the background: fork before any thread exists (boto3 pools, libfuse
workers), ``setsid``, fork again, and the daemon opens the store afresh. The caller returns
only once the mount answers (a stat of its root was served), or with the daemon's own words
(libfuse's message included) when it could not mount. FUSE is imported in the daemon only.

What is decided before the fork is the plan (cli/plan.py): every local path made absolute
(the daemon works in ``/`` and must serve the tree ``--foreground`` serves), the mount point
checked. Once the daemon answers, ``mount`` prints one line on stdout (``mounted SOURCE at
MOUNTPOINT (pid N, log FILE)``; ``--quiet`` drops it); in the foreground it prints nothing of
its own (systemd and the terminal see the log).

A running mount leaves a state file (source, mode, pid, log) in the state directory
(``$N5FS_STATE_DIR``, else ``$XDG_RUNTIME_DIR/n5fs``, ``/run/n5fs`` for root, or
``/tmp/n5fs-UID``); ``status`` (cli/status.py) joins them with the kernel's mount table and
each mount's ``/.n5fs/stats.json``.

Under systemd (``systemd/n5fs@.service``) the mount runs with ``--foreground --config FILE``
(cli/config.py): the process is the unit's main process and reports READY=1, STATUS= and
STOPPING=1 over ``NOTIFY_SOCKET`` (cli/sdnotify.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from n5fs.cli.commands import add_s3_arguments, source_from_args
from n5fs.cli.config import apply_config, load_config
from n5fs.cli.daemon import daemonize, read_state, remove_state, state_path, wait_exit, write_state
from n5fs.cli.plan import MountPlan, make_plan
from n5fs.cli.sdnotify import Notifier, ServiceLink, status_line
from n5fs.cli.status import run_status
from n5fs.errors import InvalidSource, N5fsError
from n5fs.fuse_front.mounts import MountFailed, is_stale, mount_entry, unmount
from n5fs.fuse_front.options import (
    CONSISTENCY_MODES,
    VALIDATE_MODES,
    parse_seconds,
    parse_size,
)
from n5fs.views import VIEW_FORMATS

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["add_mount_commands", "make_plan", "serve_plan"]

log = logging.getLogger("n5fs.cli.mount")

READY_TIMEOUT = 60.0


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
    from n5fs.fuse_front.options import fuse_options, loop_options, render
    from n5fs.gateway import Gateway, GatewayConfig
    from n5fs.views import NATIVE, open_view

    view = plan.options.view
    # a Zarr view may write into an N5 root, the n5 view into a Zarr one (the view decides);
    # npy views are read-only
    read_only = plan.read_only or view not in (NATIVE, "zarr3", "zarr2", "n5")
    source = open_cli_source(plan.source, read_only=read_only)
    config = GatewayConfig(
        validate=plan.validate,
        read_only=read_only,
        cache_bytes=plan.cache_bytes,
        ttl=plan.ttl,
        staging_bytes=plan.staging_bytes,
        max_file_size=plan.max_file_size,
        show_control=plan.options.show_control,
        durable=plan.options.durable,
        consistency=plan.consistency,
        conditional=plan.options.conditional,
        mtime=plan.options.mtime,
    )
    gateway = Gateway(source.store, config)
    front = gateway if view == NATIVE else open_view(gateway, view)
    fuse = fuse_options(
        plan.options,
        read_only=front.read_only,
        ttl=plan.kernel_ttl,
        fsname=plan.fsname,
        libfuse_major=LIBFUSE_VERSION[0],
    )
    fuse.update(loop_options(plan.options, libfuse_major=LIBFUSE_VERSION[0]))
    state = {
        "mountpoint": plan.mountpoint,
        "source": plan.source,
        "mode": "ro" if front.read_only else "rw",
        "validate": plan.validate,
        "view": view,
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
        if gateway.conditional.reason is not None and source.store.shared_versions:
            # said at the terminal while mounting; now into the log (stderr) too
            log.warning("%s", gateway.conditional.announcement())

    try:
        serve(
            front,
            plan.mountpoint,
            fuse,
            on_ready=ready,
            on_stopping=None if link is None else link.stopping,
            on_stop_refused=None if link is None else link.refused,
        )
    finally:
        if link is not None:
            link.close()
        remove_state(path, os.getpid())


# == commands =====================================================================================


def run_mount(args: argparse.Namespace) -> int:
    if args.config is not None:
        args.config = os.path.abspath(os.path.expanduser(args.config))
        apply_config(args, load_config(args.config))
    for name, what in (("source", "SOURCE"), ("mountpoint", "MOUNTPOINT")):
        if getattr(args, name) is None:
            raise InvalidSource(
                f"n5fs mount needs a {what}: give it on the command line or as {name!r} in "
                "the --config file"
            )
    args.source = source_from_args(args)
    if args.view is not None:  # after -o and the config file: the flag wins
        args.options = [*(args.options or []), f"as={args.view}"]
    if args.log_level is not None:
        logging.getLogger("n5fs").setLevel(args.log_level.upper())
    if args.foreground:
        return run_foreground(args)
    plan = make_plan(args)
    pid = daemonize(
        lambda ready: serve_plan(plan, on_ready=ready),
        what=f"mount of {plan.fsname} at {plan.mountpoint}",
        log_file=plan.log_file,
        timeout=READY_TIMEOUT,
    )
    if not args.quiet:
        print(mounted_line(plan, pid))
    return 0


def mounted_line(plan: MountPlan, pid: int | None) -> str:
    """What a background mount prints once it answers (stdout: scripts may keep it)."""
    return (
        f"mounted {plan.fsname} at {plan.mountpoint} "
        f"(pid {'?' if pid is None else pid}, log {plan.log_file or 'none'})"
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
    if not (stale or args.discard):
        log_file = state.get("log_file") if state is not None else None
        refusal = _flush_staged(
            mountpoint, log_file if isinstance(log_file, str) else None, args.timeout
        )
        if refusal is not None:
            print(f"n5fs unmount: {refusal}", file=sys.stderr)
            return 1
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


def _flush_staged(mountpoint: str, log_file: str | None, timeout: float) -> str | None:
    """Have the daemon write what its store holds staged (a zip archive's rewrite) while the
    mount is still up: an fsync of ``/.n5fs/stats.json`` flushes the store. Returns why the
    mount must stay, or None: done, or nobody to ask (no control file: not an n5fs mount, or
    its daemon just died; or not ours to open: the daemon then writes it as it exits)."""
    import errno
    import threading

    from n5fs.gateway.namespace import CONTROL

    offset = os.path.getsize(log_file) if log_file and os.path.exists(log_file) else 0
    failed: list[OSError] = []
    unasked: list[OSError] = []

    def flush() -> None:
        try:
            fd = os.open(os.path.join(mountpoint, CONTROL, "stats.json"), os.O_RDONLY)
        except OSError as exc:
            unasked.append(exc)
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(fd)

    thread = threading.Thread(target=flush, name="n5fs-unmount-flush", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return (
            f"{mountpoint} is still mounted: its daemon is still writing what is staged after "
            f"{timeout:g} s; run n5fs unmount again once it is done (or with a longer "
            f"--timeout), or n5fs unmount --discard {mountpoint} to drop the changes"
        )
    if unasked and unasked[0].errno in (errno.EACCES, errno.EPERM):
        log.warning(
            "cannot ask the daemon of %s to write what is staged first: %s", mountpoint, unasked[0]
        )
    if not failed or failed[0].errno == errno.ENOTCONN:
        return None
    code = failed[0].errno or errno.EIO
    reason = _daemon_reason(log_file, offset) or os.strerror(code)
    fix = "free space" if code == errno.ENOSPC else "fix the cause"
    return (
        f"{mountpoint} is still mounted: {reason}; the changes stay staged — {fix} and run "
        f"n5fs unmount again, or n5fs unmount --discard {mountpoint} to drop them"
    )


def _daemon_reason(log_file: str | None, offset: int) -> str | None:
    """The daemon's words for the failed fsync, from what its log gained since ``offset``."""
    if not log_file:
        return None
    try:
        with open(log_file, "rb") as f:
            f.seek(offset)
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return None
    marker = "fsync /.n5fs/stats.json: errno "  # the front's line for a failed call
    for line in reversed(text.splitlines()):
        at = line.find(marker)
        if at >= 0:
            return line[at + len(marker) :].partition("): ")[2].strip() or None
    return None


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
        "answers, prints 'mounted SOURCE at MOUNTPOINT (pid N, log FILE)' and exits 0, or exits "
        "2 with the reason. Writes are validated at close() and rename(); a refused one fails "
        "with EINVAL and is listed in MOUNTPOINT/.n5fs/rejections. A relative SOURCE is taken "
        "from the current directory: cd /data && n5fs mount volume /mnt/v mounts /data/volume.",
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
        help="an existing, empty directory (mkdir -p /mnt/v; -o nonempty mounts over files); "
        "optional with --config",
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
        help="comma-separated, e.g. -o ro,cache_size=1G: ro, allow_other (brings "
        "default_permissions; no_default_permissions drops it), nonempty (mount over a "
        "directory with files, hiding them), show_control (list MOUNTPOINT/.n5fs, which "
        "is reachable by its path either way), as=FORMAT (see --as), validate=MODE, "
        "durable=fsync|commit (when a commit to a local store is on disk: at fsync/unmount, "
        "or before close returns), consistency=ttl|strict (see --consistency), "
        "conditional=auto|off (metadata commits as compare-and-swap where the store honours "
        "conditional writes, probed at mount; off: last writer wins), mtime=kept|listing (on "
        "S3: the time cp -a/rsync -a kept, one HEAD per stat, or LastModified from the "
        "listing; default kept read-write, listing read-only), "
        "cache_size=SIZE, "
        "cache_ttl=SECONDS, staging_size=SIZE, max_file_size=SIZE, s3_connect_timeout=SECONDS, "
        "s3_read_timeout=SECONDS, s3_retries=N; others go to libfuse",
    )
    p.add_argument(
        "--read-only",
        action="store_true",
        help="same as -o ro: every write fails with EROFS, the kernel keeps the page cache "
        "(n5fs mount --read-only s3://bucket/vol/ /mnt/v)",
    )
    p.add_argument(
        "--as",
        dest="view",
        choices=VIEW_FORMATS,
        default=None,
        metavar="FORMAT",
        help="show the store in another format (same as -o as=FORMAT): zarr3 or "
        "zarr2 (N5 datasets and Zarr arrays of the other version as Zarr arrays, sharded v3 "
        "arrays as plain v2 ones), npy (every array as one ARRAY.npy file), n5 (numeric Zarr "
        "arrays as N5 datasets); native (default) is the store as it is. Zarr views of N5 "
        "data and the n5 view of Zarr data take writes, which land in the store's own format; "
        "npy is read-only (n5fs mount /data/vol.n5 /mnt/v --as zarr3)",
    )
    p.add_argument(
        "--allow-other",
        action="store_true",
        help="same as -o allow_other: other users may use the mount, with the kernel checking "
        "the modes shown (default_permissions), so they can read but not write; needs "
        "user_allow_other in /etc/fuse.conf unless root (n5fs mount --allow-other /data/v /mnt/v)",
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
        "--consistency",
        choices=CONSISTENCY_MODES,
        default=None,
        help="what this mount sees of other mounts' commits to the same store (one per node "
        "of a cluster): ttl (default) trusts listings and detection for --cache-ttl seconds; "
        "strict asks the store on every lookup and before every chunk commit (slower; "
        "n5fs mount s3://bucket/vol /mnt/v --consistency strict). Either way a chunk-shaped "
        "name in a folder believed plain is checked against the store before it lands, and "
        "on S3 metadata commits are compare-and-swap: a lost race fails with EAGAIN",
    )
    p.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay in the foreground (systemd, debugging); logs go to stderr, and nothing "
        "else is printed",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing once mounted (by default: 'mounted /data/v at /mnt/v (pid 4242, "
        "log ...)'); errors are still printed",
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=None)
    p.add_argument(
        "--log-file",
        default=None,
        metavar="PATH",
        help="where the daemon logs, e.g. --log-file ./mount.log (a relative path is taken "
        "from the current directory; default: beside its state file)",
    )
    p.set_defaults(run=run_mount)

    p = sub.add_parser(
        "unmount",
        help="unmount an n5fs mount (also clears a stale one)",
        description="Unmount MOUNTPOINT and wait until its daemon has committed what was "
        "staged and closed the store. First the daemon writes what its store holds staged "
        "(a zip archive's rewrite) while still mounted; if it cannot (no space, store "
        "unreachable), the mount stays, the reason is printed and the exit status is 1. A "
        "stale mount (daemon gone) is detached lazily.",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument(
        "--discard",
        action="store_true",
        help="unmount without first having the daemon write what is staged; what it then "
        "cannot write as it exits (a zip archive's rewrite) is lost",
    )
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
        help="how long to wait for the daemon to write what is staged, and then to exit "
        "(default 60 each)",
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
