"""The command line of ``n5fs mount``, ``unmount`` and ``status``: arguments, flags, the
``-o`` options' help text, and the argument types that turn ``512M`` or ``2.5`` into numbers.

Why apart from :mod:`~n5fs.cli.mount`: what a user may type (and what ``--help`` tells them)
changes with every new option, while what a mount *does* with the parsed arguments (plan,
fork, serve, unmount) does not; the runners are attached by :func:`~n5fs.cli.mount.
add_mount_commands`. Nothing here imports FUSE, so ``n5fs mount --help`` works without
libfuse. The ``-o`` options themselves are parsed by :mod:`n5fs.fuse_front.options`.

Stateless: builds parsers, holds nothing.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from n5fs.cli.commands import add_s3_arguments
from n5fs.errors import InvalidSource
from n5fs.fuse_front.options import (
    CONSISTENCY_MODES,
    VALIDATE_MODES,
    parse_seconds,
    parse_size,
)
from n5fs.views import VIEW_FORMATS

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["mount_parser", "status_parser", "unmount_parser"]


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


def mount_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """``n5fs mount``: its arguments, flags and help text."""
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
        "conditional writes, probed at mount; off: last writer wins), mtime=kept|listing|head "
        "(on S3: the time cp -a/rsync -a kept through n5fs, one GET per folder that has one; "
        "LastModified from the listing; or each file's kept time, one HEAD per stat; default "
        "kept read-write, listing read-only), writeback=auto|on|off (close() returns once "
        "the validated file is journaled on local disk and uploads run behind; auto: on for "
        "read-write S3 mounts; fsync and n5fs sync wait for the uploads), "
        "writeback_size=SIZE (journal room, default 1G), read_ahead_kb=N (the kernel's "
        "read-ahead for the mount, default 1024: a file's bytes are asked in requests of up "
        "to 1 MiB, not 128 KiB; set as root only; 0, and the default of --as npy, leave the "
        "kernel's), "
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
    return p


def unmount_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """``n5fs unmount``: its arguments, flags and help text."""
    p = sub.add_parser(
        "unmount",
        help="unmount an n5fs mount (also clears a stale one)",
        description="Unmount MOUNTPOINT and wait until its daemon has committed what was "
        "staged and closed the store. First the daemon writes what its store holds staged "
        "(a zip archive's rewrite, the uploads of a write-back mount) while still mounted; if it cannot (no space, store "
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
    return p


def sync_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """``n5fs sync``: its arguments and help text."""
    p = sub.add_parser(
        "sync",
        help="wait until what a mount accepted is in its store",
        description="Wait until every write MOUNTPOINT accepted is in its store: on S3 the "
        "uploads a write-back mount runs behind close() (-o writeback), for a zip archive its "
        "rewrite. sync(1) and syncfs(2) do not reach a FUSE daemon; this does (an fsync of "
        "MOUNTPOINT/.n5fs/stats.json). Exit status 1 with the reason when something could "
        "not be written; it stays journaled and is tried again.",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait (default 600)",
    )
    return p


def status_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """``n5fs status``: its flags and help text."""
    p = sub.add_parser(
        "status",
        help="list active n5fs mounts with their counters",
        description="List the n5fs mounts of this machine: source, mountpoint, mode, daemon "
        "pid, health and the counters of MOUNTPOINT/.n5fs/stats.json. A mount whose daemon "
        "was killed leaves its state file behind: when that daemon is gone (its pid runs no "
        "more) and nothing is mounted at its mount point, the file is stale; it is listed "
        "with a hint until --prune removes it.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.add_argument(
        "--prune",
        action="store_true",
        help="first remove stale state files (daemon gone and mount point not mounted) and "
        "say which (on stderr with --json); a running daemon's or a mounted one's stay",
    )
    return p
