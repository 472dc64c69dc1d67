"""``n5fs``: the argparse tree, logging set-up, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from n5fs import __version__
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
  '{"driver": "s3", "bucket": "b", "path": "p/", "endpoint": "http://127.0.0.1:9000"}'
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="n5fs",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"n5fs {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more log output (-vv also prints tracebacks)",
    )
    parser.set_defaults(run=lambda args: _no_command(parser))
    parser.add_subparsers(title="commands", metavar="COMMAND")
    return parser


def _no_command(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def configure_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="n5fs: %(levelname)s: %(message)s", stream=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
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
