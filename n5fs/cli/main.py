"""``n5fs``: the argparse tree, logging set-up, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from typing import TYPE_CHECKING

from n5fs import __version__
from n5fs.codecs.limits import INFLATE
from n5fs.errors import N5fsError

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("n5fs")

DESCRIPTION = """\
Mount a key-value store of chunked array data (N5, Zarr v2, Zarr v3, hdmf-zarr) as a
directory tree, and refuse any write that would break the format.

SOURCE is a URL or a TensorStore kvstore JSON spec:
  /data/volume                      a local directory (or file:///data/volume/)
  s3://bucket/prefix/               S3; endpoint from AWS_ENDPOINT_URL for S3-compatible servers
  file:///data/x.zip|zip:           a zip archive (also s3://bucket/x.zip|zip:inner/)
  memory://                         an empty in-memory store
  demo:                             a built-in demo (N5, Zarr v2, Zarr v3 arrays in memory)
  '{"driver": "s3", "bucket": "b", "path": "p/", "endpoint": "http://127.0.0.1:9000"}'
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="n5fs",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"n5fs {__version__} (inflate: {INFLATE})"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more log output (-vv also prints tracebacks)",
    )
    parser.set_defaults(run=lambda args: _no_command(parser))
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    from n5fs.cli.commands import add_commands

    add_commands(sub)
    from n5fs.cli.mount import add_mount_commands

    add_mount_commands(sub)
    for command in sub.choices.values():
        command.formatter_class = WholeWordsFormatter
    return parser


class WholeWordsFormatter(argparse.HelpFormatter):
    """argparse's help, wrapped at spaces only: a line never ends inside ``--allow-empty``
    or ``mkdir -p``, so the flags and examples of the help can be copied as they are."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


def _no_command(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


_HANDLER_NAME = "n5fs-cli"
#: syslog priorities (sd-daemon(3)): journald reads a ``<N>`` line prefix as the priority
_PRIORITIES = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
)


class JournalFormatter(logging.Formatter):
    """Lines for journald: ``<4>refused /a/.zarray: ...``. journald adds the time, host,
    unit and pid itself, so a line carries only its priority and message; each line of a
    traceback gets the prefix, else journald files it at the default priority."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = next((p for level, p in _PRIORITIES if record.levelno >= level), 7)
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def journal_stderr() -> bool:
    """Is stderr the journal stream systemd connected (``JOURNAL_STREAM=dev:inode`` names
    it; a child that redirected stderr inherits the variable but not the stream)?"""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # closed, or not a real file
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def configure_logging(verbose: int) -> None:
    """One handler on the ``n5fs`` logger, writing to the stderr of this call (not the root
    logger: a host program or test runner may own that); journald's format when stderr is
    the journal."""
    logger = logging.getLogger("n5fs")
    for handler in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    if journal_stderr():
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("n5fs: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING - 10 * min(verbose, 2))
    logger.propagate = False


#: the exit status of a process killed by SIGPIPE, as a shell reports it (128 + 13)
EXIT_BROKEN_PIPE = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (2: it could not run, with the reason on stderr)."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # here, so that a closed pipe is seen now, not at exit
    except BrokenPipeError:
        return _stdout_gone()
    return code


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.run(args))
    except N5fsError as exc:
        log.error("%s", exc, exc_info=args.verbose > 1)  # noqa: TRY400 (traceback only on -vv)
        return 2
    except KeyboardInterrupt:
        return 130


def _stdout_gone() -> int:
    """The reader of stdout went away (``n5fs status --json | head -1``): end quietly, as a
    process killed by SIGPIPE would, without a traceback. Python ignores SIGPIPE, so the
    write raised instead; stdout is pointed at /dev/null so that flushing it at exit cannot
    fail again (docs.python.org, signal module, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a non-file (a test's capture)
        return EXIT_BROKEN_PIPE
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return EXIT_BROKEN_PIPE
