"""``mount.n5fs``: the helper mount(8) runs for ``mount -t n5fs`` and fstab lines of type n5fs.

mount(8) calls ``/sbin/mount.n5fs SOURCE DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]`` with
every option of the fstab line, its own included. Those that only steer mount(8), systemd's
fstab generator or the boot (``_netdev``, ``noauto``, ``nofail``, ``user``, ``x-systemd.*``,
``defaults``, ...) are dropped here; n5fs's own (``validate=``, ``cache_size=``,
``cache_ttl=``, ``ro``, ``s3_connect_timeout=``, ``s3_read_timeout=``, ``s3_retries=``) and
libfuse's (``allow_other``, ``default_permissions``, ``uid=``,
``nosuid``, ...) go to ``n5fs mount -o``, where libfuse refuses any it does not know, with its
message; ``log_level=`` and ``log_file=`` become the flags of the same names. The mount then
goes to the background as ``n5fs mount`` does, and this helper returns once it answers,
silently (``--quiet``) unless ``-v``.

Exit status as mount(8) documents for helpers: 0 mounted, 1 bad invocation, 32 the mount failed.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.errors import N5fsError
from n5fs.fuse_front.options import parse_options, split_options

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("n5fs.cli.fstab")

__all__ = ["HelperCall", "build_parser", "main", "mount_argv", "translate_options"]

EXIT_USAGE = 1
EXIT_MOUNT_FAILED = 32

#: options for mount(8), systemd or the boot only; libfuse would refuse them
MOUNT_ONLY = frozenset(
    {
        "_netdev",
        "auto",
        "noauto",
        "nofail",
        "defaults",
        "rw",  # the default; ``ro`` is what n5fs reads
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "relatime",  # the kernel's default; libfuse does not parse it
    }
)
#: prefixes of options that mean something to userspace tools only
MOUNT_ONLY_PREFIXES = ("x-", "X-", "comment=", "user=", "helper=")
#: n5fs settings an fstab line may carry that are flags of ``n5fs mount``, not ``-o`` options
FLAG_OPTIONS = {"log_level": "--log-level", "log_file": "--log-file", "config": "--config"}
FSTYPES = ("n5fs", "fuse.n5fs")


@dataclass
class HelperCall:
    """What the fstab options came to: ``-o`` items for ``n5fs mount``, flags, and what was
    dropped (for ``-v``)."""

    options: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def _escape(item: str) -> str:
    r"""Back into one ``-o`` group: a comma inside a value stays one (``\,``)."""
    return item.replace("\\", "\\\\").replace(",", "\\,")


def translate_options(groups: Sequence[str]) -> HelperCall:
    """Sort mount(8)'s ``-o`` groups into what n5fs mount takes and what it must not see."""
    call = HelperCall()
    for group in groups:
        for item in split_options(group):
            name, has_value, value = item.partition("=")
            if item in MOUNT_ONLY or item.startswith(MOUNT_ONLY_PREFIXES):
                call.dropped.append(item)
            elif name in FLAG_OPTIONS and has_value and value:
                call.flags += [FLAG_OPTIONS[name], value]
            else:
                call.options.append(item)
    return call


def mount_argv(source: str, directory: str, call: HelperCall, *, verbose: bool) -> list[str]:
    """The ``n5fs`` command line (without the program name) the helper runs: quiet on
    success, as mount(8) helpers are, unless ``-v``."""
    argv = ["-v"] if verbose else []
    argv += ["mount", source, directory, *call.flags]
    if not verbose:
        argv.append("--quiet")
    if call.options:
        argv += ["-o", ",".join(_escape(item) for item in call.options)]
    return argv


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mount.n5fs",
        description="mount(8) helper: mount -t n5fs SOURCE DIR -o OPTIONS, and fstab lines "
        "such as 's3://bucket/prefix/ /mnt/vol n5fs _netdev,ro,validate=strict 0 0'. "
        "Link it as /sbin/mount.n5fs.",
    )
    parser.add_argument("source", metavar="SOURCE")
    parser.add_argument("directory", metavar="DIR")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS")
    parser.add_argument("-s", dest="sloppy", action="store_true", help="accepted; see docs")
    parser.add_argument(
        "-f", dest="fake", action="store_true", help="check everything, print, do not mount"
    )
    parser.add_argument("-n", dest="no_mtab", action="store_true", help="accepted (no mtab)")
    parser.add_argument("-v", dest="verbose", action="store_true", help="say what is done")
    parser.add_argument("-N", dest="namespace", default=None, metavar="NS")
    parser.add_argument("-t", dest="fstype", default=None, metavar="TYPE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from n5fs.cli.main import configure_logging

    configure_logging(0)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed why; mount(8) expects 1 for usage
        return 0 if exc.code == 0 else EXIT_USAGE
    problem = _unsupported(args)
    if problem is not None:
        log.error("%s", problem)
        return EXIT_USAGE
    call = translate_options(args.options)
    command = mount_argv(args.source, args.directory, call, verbose=args.verbose)
    if args.verbose:
        if call.dropped:
            print(f"mount.n5fs: not for n5fs: {','.join(call.dropped)}", file=sys.stderr)
        print(f"mount.n5fs: n5fs {shlex.join(command)}", file=sys.stderr)
    if args.fake:
        return _check_only(call)
    return _run(command)


def _unsupported(args: argparse.Namespace) -> str | None:
    if args.namespace is not None:
        return "mount.n5fs: -N (mount in another namespace) is not supported"
    if args.fstype is not None and args.fstype not in FSTYPES:
        return f"mount.n5fs: type {args.fstype!r} is not n5fs"
    return None


def _check_only(call: HelperCall) -> int:
    """``mount -f``: everything but the mount; n5fs's own option values are checked."""
    try:
        parse_options([",".join(_escape(item) for item in call.options)])
    except N5fsError as exc:
        log.error("%s", exc)  # noqa: TRY400 (the reason is the message)
        return EXIT_MOUNT_FAILED
    return 0


def _run(command: list[str]) -> int:
    from n5fs.cli.main import main as n5fs_main

    code = n5fs_main(command)
    return 0 if code == 0 else EXIT_MOUNT_FAILED


if __name__ == "__main__":
    sys.exit(main())
