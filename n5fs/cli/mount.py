"""``n5fs mount``, ``n5fs unmount``, ``n5fs sync`` and ``n5fs status``.

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

A running mount leaves a state file (source, mode, pid and writer tag, log) in the state
directory (``$N5FS_STATE_DIR``, else ``$XDG_RUNTIME_DIR/n5fs``, ``/run/n5fs`` for root, or
``/tmp/n5fs-UID``); ``status`` (cli/status.py) joins them with the kernel's mount table and
each mount's ``/.n5fs/stats.json``, and ``status --prune`` removes those of killed daemons.

Under systemd (``systemd/n5fs@.service``) the mount runs with ``--foreground --config FILE``
(cli/config.py): the process is the unit's main process and reports READY=1, STATUS= and
STOPPING=1 over ``NOTIFY_SOCKET`` (cli/sdnotify.py).

The flags and help text of the three commands are cli/mount_args.py; this module runs them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from n5fs.cli.commands import source_from_args
from n5fs.cli.config import apply_config, load_config
from n5fs.cli.daemon import daemonize, read_state, remove_state, state_path, wait_exit, write_state
from n5fs.cli.mount_args import mount_parser, status_parser, sync_parser, unmount_parser
from n5fs.cli.plan import MountPlan, make_plan
from n5fs.cli.sdnotify import Notifier, ServiceLink, status_line
from n5fs.cli.status import run_status
from n5fs.errors import InvalidSource, N5fsError
from n5fs.fuse_front.mounts import MountFailed, is_stale, mount_entry, unmount
from n5fs.kvstore import tempnames

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from n5fs.kvstore.base import KvStore

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
    store = behind_journal(source.store, plan, read_only=read_only)
    gateway = Gateway(store, config)
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
        "writer": tempnames.current().tag,  # pid and start time: tells a reused pid
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
        if gateway.conditional.reason is not None and source.store.traits.shared_versions:
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
            read_ahead_kb=plan.options.read_ahead_for(),
        )
    finally:
        if link is not None:
            link.close()
        remove_state(path, os.getpid())


def behind_journal(store: KvStore, plan: MountPlan, *, read_only: bool) -> KvStore:
    """``store`` with write-back where ``-o writeback=`` wants it: ``on``, or ``auto`` on a
    read-write mount of a store whose writes are round trips (S3). Why that default: there a
    synchronous commit makes every ``close()`` wait for the network, one file at a time, while
    a journaled one keeps every promise a synchronous one makes (validated before it is
    acknowledged, durable on local disk, uploaded in commit order, replayed after a crash);
    on a local store the journal would only add a copy."""
    mode = plan.options.writeback
    if read_only or mode == "off" or (mode == "auto" and not store.traits.remote_writes):
        return store
    from n5fs.formats.registry import METADATA_NAMES
    from n5fs.kvstore.keys import basename
    from n5fs.kvstore.writeback import open_write_back

    def is_document(key: str) -> bool:
        return basename(key) in METADATA_NAMES

    return open_write_back(store, write_through=is_document, limit=plan.writeback_bytes)


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
        failure = _flush_staged(mountpoint, _log_file(state), args.timeout)
        if failure is not None:
            print(f"n5fs unmount: {mountpoint} is still mounted: {failure}", file=sys.stderr)
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


def run_sync(args: argparse.Namespace) -> int:
    """``n5fs sync``: what the mount accepted is in the store when this returns 0 (``sync``
    and ``syncfs`` do not reach a FUSE daemon)."""
    mountpoint = os.path.abspath(args.mountpoint)
    entry = mount_entry(mountpoint)
    if entry is None or not entry.fstype.startswith("fuse"):
        raise MountFailed(f"{mountpoint} is not an n5fs mount")
    state = read_state(state_path(mountpoint))
    failure = _flush_staged(mountpoint, _log_file(state), args.timeout, again="n5fs sync")
    if failure is not None:
        print(f"n5fs sync: {mountpoint}: {failure}", file=sys.stderr)
        return 1
    return 0


def _log_file(state: dict[str, object] | None) -> str | None:
    log_file = state.get("log_file") if state is not None else None
    return log_file if isinstance(log_file, str) else None


def _flush_staged(
    mountpoint: str, log_file: str | None, timeout: float, again: str = "n5fs unmount"
) -> str | None:
    """Have the daemon write what its store holds staged (a zip archive's rewrite, uploads
    behind a write-back journal) while the mount is still up: an fsync of
    ``/.n5fs/stats.json`` flushes the store. Returns why it could not, or None: done, or
    nobody to ask (no control file: not an n5fs mount, or its daemon just died; or not ours
    to open: the daemon then writes it as it exits)."""
    import errno
    import threading

    from n5fs.gateway.namespace.paths import CONTROL

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
            f"its daemon is still writing what is staged after {timeout:g} s; run {again} "
            f"again once it is done (or with a longer --timeout), or run n5fs unmount --discard "
            f"{mountpoint} to unmount anyway (a zip archive's rewrite is then lost; journaled "
            "uploads stay for the next mount)"
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
        f"{reason}; the changes stay staged — {fix} and run {again} again, or run n5fs "
        f"unmount --discard {mountpoint} to unmount anyway (a zip archive's rewrite is then lost; "
        "journaled uploads stay for the next mount)"
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


def add_mount_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mount``, ``unmount`` and ``status`` (their flags: :mod:`~n5fs.cli.mount_args`)."""
    mount_parser(sub).set_defaults(run=run_mount)
    unmount_parser(sub).set_defaults(run=run_unmount)
    sync_parser(sub).set_defaults(run=run_sync)
    status_parser(sub).set_defaults(run=run_status)
