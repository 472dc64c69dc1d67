"""The plan of a mount: everything ``n5fs mount`` decides and checks before it forks.

Its own module because all of it runs in the calling process, where an error still reaches
the terminal (exit 2 with the reason) and before any thread exists: the ``-o`` options and
flags read into settings, every local path made absolute (the daemon works in ``/``), the
mount point checked (exists, is a directory, is empty unless ``-o nonempty``, nothing mounted
there; a stale mount detached), and the source opened once to see that it answers. The
daemon (or the foreground process) then serves exactly this plan (cli/mount.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from n5fs.cli.commands import absolute_source, local_spec_path
from n5fs.cli.daemon import state_path
from n5fs.errors import InvalidSource, N5fsError
from n5fs.fuse_front.mounts import MountFailed, is_stale, mount_entry, unmount
from n5fs.fuse_front.options import MountOptions, parse_options, parse_size

if TYPE_CHECKING:
    import argparse

log = logging.getLogger("n5fs.cli.plan")

DEFAULT_CACHE = 256 << 20
DEFAULT_TTL = 5.0
DEFAULT_STAGING = 256 << 20
DEFAULT_MAX_FILE_SIZE = 1 << 40
DEFAULT_WRITEBACK = 1 << 30
#: n5fs's ``-o`` sizes that fuse_front.options leaves among libfuse's: taken out here
_OWN_SIZE_OPTIONS = ("staging_size", "max_file_size", "writeback_size")


@dataclass(frozen=True)
class MountPlan:
    """What the daemon serves: ``source`` with absolute local paths, ``fsname`` the name
    ``df`` and ``mount`` show, ``mountpoint`` absolute and checked."""

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
    #: what other mounts' commits this one sees when (``ttl`` or ``strict``)
    consistency: str = "ttl"
    #: the most a write-back journal holds before writers wait (``-o writeback_size=``)
    writeback_bytes: int = DEFAULT_WRITEBACK

    @property
    def read_only(self) -> bool:
        return self.options.read_only

    @property
    def kernel_ttl(self) -> float:
        """The kernel's attr/entry timeouts: the gateway's TTL, none in strict consistency
        (every lookup reaches the gateway, which asks the store)."""
        return 0.0 if self.consistency == "strict" else self.ttl


def make_plan(args: argparse.Namespace) -> MountPlan:
    opts = parse_options([*(args.options or []), *flag_options(args)])
    sizes = _own_sizes(opts)
    mountpoint = check_mountpoint(args.mountpoint, nonempty=opts.nonempty)
    source = absolute_source(args.source)
    refuse_self_mount(source, mountpoint)
    fsname = probe_source(source, read_only=opts.read_only)
    cache = args.cache_size if args.cache_size is not None else opts.cache_bytes
    ttl = args.cache_ttl if args.cache_ttl is not None else opts.ttl
    log_file = args.log_file
    if log_file is not None:
        log_file = os.path.abspath(os.path.expanduser(log_file))
    elif not args.foreground:
        log_file = str(state_path(mountpoint).with_suffix(".log"))
    return MountPlan(
        source=source,
        fsname=fsname,
        mountpoint=mountpoint,
        options=opts,
        validate=args.validate or opts.validate or "strict",
        cache_bytes=DEFAULT_CACHE if cache is None else cache,
        ttl=DEFAULT_TTL if ttl is None else ttl,
        log_file=log_file,
        staging_bytes=_pick(args.staging_size, sizes.get("staging_size"), DEFAULT_STAGING),
        max_file_size=_pick(args.max_file_size, sizes.get("max_file_size"), DEFAULT_MAX_FILE_SIZE),
        consistency=getattr(args, "consistency", None) or opts.consistency or "ttl",
        writeback_bytes=sizes.get("writeback_size", DEFAULT_WRITEBACK),
    )


def flag_options(args: argparse.Namespace) -> list[str]:
    """``--read-only`` and ``--allow-other`` (rclone's and sshfs's spellings) as the ``-o``
    options they stand for, after the others: a flag wins over ``-o`` and the config file."""
    flags = []
    if getattr(args, "read_only", False):
        flags.append("ro")
    if getattr(args, "allow_other", False):
        flags.append("allow_other")
    return flags


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


def check_mountpoint(path: str, *, nonempty: bool = False) -> str:
    """An existing, empty directory that nothing is mounted on (``nonempty``: files there are
    allowed, and hidden while mounted); a stale FUSE mount there (its daemon died) is
    detached first, as systemd's restart expects."""
    mountpoint = os.path.abspath(path)
    if is_stale(mountpoint):
        log.warning("%s is a stale mount (its daemon is gone); detaching it", mountpoint)
        unmount(mountpoint, lazy=True)
    if not os.path.lexists(mountpoint):
        raise MountFailed(
            f"mountpoint {mountpoint} does not exist (create it with mkdir -p {mountpoint})"
        )
    if not os.path.isdir(mountpoint):
        raise MountFailed(f"mountpoint {mountpoint} is not a directory")
    entry = mount_entry(mountpoint)
    if entry is not None:
        raise MountFailed(f"{mountpoint} is already mounted ({entry.fstype} from {entry.source})")
    if not nonempty:
        _refuse_nonempty(mountpoint)
    return mountpoint


def _refuse_nonempty(mountpoint: str) -> None:
    """Mounting over files hides them until the unmount (and a writer may think its data is
    gone): refuse, as libfuse 2 did, unless ``-o nonempty``. A directory this user cannot
    list is left to the kernel."""
    try:
        with os.scandir(mountpoint) as entries:
            names = sorted(entry.name for entry in entries)
    except OSError:
        return
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise MountFailed(
            f"mountpoint {mountpoint} is not empty ({len(names)} "
            f"{'entry' if len(names) == 1 else 'entries'}: {shown}); the mount "
            "would hide them. Use an empty directory, or -o nonempty to mount over them"
        )


def refuse_self_mount(source: str, mountpoint: str) -> None:
    """A local source at or under its own mount point (possible with ``-o nonempty``) would
    be served through the mount itself: the daemon's first read waits for an answer only it
    could give, and the mount hangs."""
    from n5fs.cli.demo import DEMO_SOURCE
    from n5fs.kvstore.spec import parse_spec

    if source.strip() == DEMO_SOURCE:
        return
    local = local_spec_path(parse_spec(source))
    if local is None:
        return
    inside = os.path.realpath(local)
    target = os.path.realpath(mountpoint)
    if inside == target or inside.startswith(target.rstrip("/") + "/"):
        raise InvalidSource(
            f"{source} lies inside the mountpoint {mountpoint}: the mount would read from "
            "itself and hang; mount it somewhere else"
        )


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
