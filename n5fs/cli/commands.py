"""``n5fs detect`` and ``n5fs validate``: what a store holds, and whether all of it is valid;
and what every command does to a SOURCE before opening it (:func:`absolute_source`,
:func:`missing_local_path`).

Both commands exit 2 when a local SOURCE (a directory, or the archive of a zip) does not exist:
an absent path would otherwise read as an empty store, and "valid; checked 0 chunks" would
pass a typo as a clean check. ``validate`` exits 1 when it found no group or array at all,
unless ``--allow-empty``.

``validate``'s exit status tells "the data is broken" from "the data could not be read":
:data:`EXIT_INVALID` when a key was read and breaks its format, :data:`EXIT_UNREADABLE` when
nothing read was invalid but some key could not be read or decoded (a store fault). A run
that could not read a key never exits 0: it did not check everything.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from n5fs.cli.progress import ProgressBar
from n5fs.detect import Detector, Folder, FolderKind, OpenedSource, node_spec, open_source
from n5fs.malloc import reuse_large_buffers
from n5fs.validate import Validator
from n5fs.views import VIEW_FORMATS

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    import numpy as np

    from n5fs.kvstore.spec import StoreSpec
    from n5fs.validate import Report

#: ``validate``: every metadata file and chunk was read, and is valid
EXIT_VALID = 0
#: ``validate``: something read is invalid (wins over :data:`EXIT_UNREADABLE`), or SOURCE
#: holds no group or array (without ``--allow-empty``)
EXIT_INVALID = 1
#: exit status of ``detect`` and ``validate`` when they could not run
EXIT_CANNOT_RUN = 2
#: ``validate``: nothing read is invalid, but some keys could not be read or decoded
EXIT_UNREADABLE = 3

VALIDATE_EXIT_STATUS = f"""\
Exit status: {EXIT_VALID} when every metadata file and chunk was read and is valid;
{EXIT_INVALID} when something is invalid (or SOURCE holds no group or array at all, unless
--allow-empty); {EXIT_CANNOT_RUN} when validate could not run (bad arguments, SOURCE does not
exist, a listing of the store that kept failing, a worker process that died: its chunks
were not checked); {EXIT_UNREADABLE} when nothing read is invalid but some files could not
be read or decoded because of a store fault (I/O errors, a backend that kept failing, a zip
member that cannot be extracted, a key deleted while validating): they are listed as
UNREADABLE (--json: "unreadable", each with its error) and were not checked, so run
validate again once the store answers. When some files are invalid and others unreadable,
the status is {EXIT_INVALID}.
"""


def dtype_name(dtype: np.dtype[Any]) -> Any:
    """numpy's name for simple types (``uint16``), the type string for strings (``<U4``), the
    field list for records."""
    if dtype.fields is not None:
        return [list(item) for item in dtype.descr]
    if dtype.kind in "SUV":
        return dtype.str
    return dtype.name


def describe(folder: Folder, source_spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": folder.prefix.rstrip("/"),
        "format": folder.fmt,
        "kind": folder.kind.value,
    }
    array = folder.array
    if array is not None:
        out.update(
            dtype=dtype_name(array.dtype),
            shape=list(array.shape),
            chunks=list(array.chunks),
            codecs=array.codec_summary(),
            spec=node_spec(source_spec, folder),
        )
    return out


def add_s3_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for S3 sources (also a zip on S3): what a URL cannot carry."""
    import argparse

    from n5fs.cli.config import s3_retries, s3_timeout

    def checked(check: Callable[[object], object]) -> Callable[[str], object]:
        def convert(text: str) -> object:
            try:
                return check(text)
            except (TypeError, ValueError) as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        return convert

    group = parser.add_argument_group("S3 sources")
    group.add_argument(
        "--anon", action="store_true", default=None, help="unsigned requests, for public buckets"
    )
    group.add_argument(
        "--endpoint",
        metavar="URL",
        default=None,
        help="an S3-compatible server, e.g. http://127.0.0.1:9000",
    )
    group.add_argument("--region", metavar="NAME", default=None)
    group.add_argument("--profile", metavar="NAME", default=None, help="a profile of ~/.aws/config")
    group.add_argument(
        "--s3-connect-timeout",
        type=checked(s3_timeout),
        default=None,
        metavar="SECONDS",
        help="give up connecting to the S3 server after this long (default 2)",
    )
    group.add_argument(
        "--s3-read-timeout",
        type=checked(s3_timeout),
        default=None,
        metavar="SECONDS",
        help="give up on an S3 server that sends nothing for this long, per wait, not per "
        "transfer (default 4)",
    )
    group.add_argument(
        "--s3-retries",
        type=checked(s3_retries),
        default=None,
        metavar="N",
        help="retry a failed or timed-out S3 request N times (default 1); with the defaults "
        "an unresponsive server costs a call EIO after ~12 s, not a hang",
    )


def source_from_args(args: argparse.Namespace) -> str:
    """SOURCE, with the S3 flags and ``-o s3_*`` options (taken out of ``args.options``, so
    libfuse never sees them) applied to its S3 store (an error if it has none). A flag wins
    over an option, an option over the config file."""
    from n5fs.cli.config import S3Settings, take_s3_options, with_s3

    options, from_options = take_s3_options(getattr(args, "options", None))
    if getattr(args, "options", None) is not None:
        args.options = options
    flags = S3Settings(
        endpoint=args.endpoint,
        region=args.region,
        profile=args.profile,
        anonymous=args.anon,
        connect_timeout=args.s3_connect_timeout,
        read_timeout=args.s3_read_timeout,
        retries=args.s3_retries,
    )
    settings = from_options.overridden_by(flags)
    if settings == S3Settings():
        return str(args.source)
    return with_s3(args.source, settings, "command line")


def absolute_source(text: str) -> str:
    """SOURCE with every local path made absolute against the current directory, so that a
    process working elsewhere (the mount daemon works in ``/``) opens the same store: a bare
    path (also under a zip adapter: ``data/x.zip|zip:``) stays a URL, with its root made
    absolute; a JSON spec holding a file store is rewritten with absolute paths. Anything
    else is returned as it is."""
    from n5fs.cli.demo import DEMO_SOURCE
    from n5fs.kvstore.spec import parse_spec

    stripped = text.strip()
    if stripped == DEMO_SOURCE:
        return text
    if stripped.startswith("{"):
        spec = parse_spec(stripped)  # a file spec makes its own path absolute
        return json.dumps(spec.to_json()) if local_spec_path(spec) is not None else text
    root, bar, adapters = stripped.partition("|")
    if "://" in root:
        return text  # file:// URLs are absolute already (the parser refuses others)
    absolute = os.path.abspath(os.path.expanduser(root))
    if root.endswith("/") and not absolute.endswith("/"):
        absolute += "/"
    return absolute + bar + adapters


def local_spec_path(spec: StoreSpec) -> str | None:
    """The local path a spec reads: a file store's directory, or the archive file beneath a
    zip (however deeply nested); None for memory, S3 and other remote stores."""
    from n5fs.kvstore.spec import FileSpec, ZipSpec

    while isinstance(spec, ZipSpec) and spec.base is not None:
        spec = spec.base
    return spec.path if isinstance(spec, FileSpec) else None


def missing_local_path(text: str) -> str | None:
    """The local path of SOURCE if it does not exist (checked before opening: an absent
    directory or archive would read as an empty store), else None."""
    from n5fs.cli.demo import DEMO_SOURCE
    from n5fs.kvstore.spec import parse_spec

    if text.strip() == DEMO_SOURCE:
        return None
    path = local_spec_path(parse_spec(text))
    if path is None or os.path.exists(path):
        return None
    return path.rstrip("/") or "/"


def _refuse_missing(command: str, text: str) -> bool:
    """Say so on stderr when SOURCE is a local path that does not exist."""
    missing = missing_local_path(text)
    if missing is None:
        return False
    print(f"n5fs {command}: {missing}: no such file or directory", file=sys.stderr)
    return True


def open_cli_source(text: str, *, read_only: bool = False) -> OpenedSource:
    """``open_source``, plus ``demo:`` for the built-in demo store."""
    from n5fs.cli.demo import DEMO_SOURCE, demo_store

    if text == DEMO_SOURCE:
        store = demo_store()
        return OpenedSource(store.spec, store, None)
    return open_source(text, read_only=read_only)


def run_detect(args: argparse.Namespace) -> int:
    text = source_from_args(args)
    if _refuse_missing("detect", text):
        return EXIT_CANNOT_RUN
    view = getattr(args, "view", None)
    if view is not None and view != "native":
        return _detect_view(text, view, as_json=args.json)
    source = open_cli_source(text)
    with source.store:
        detector = Detector(source.store)
        nodes = [
            describe(f, source.spec)
            for f in detector.walk("")
            if f.kind in (FolderKind.GROUP, FolderKind.ARRAY)
        ]
    if not nodes:
        from n5fs.errors import DetectionFailed

        raise DetectionFailed(
            f"{source.spec.to_url()}: no N5, Zarr v2, Zarr v3 or hdmf-zarr metadata found"
        )
    if args.json:
        doc = {"source": source.spec.to_json(), "container": source.container, "nodes": nodes}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    header = source.spec.to_url() + (f"  ({source.container} archive)" if source.container else "")
    print(header)
    for node in nodes:
        print(_tree_line(node))
    return 0


def _detect_view(text: str, fmt: str, *, as_json: bool) -> int:
    """``detect --as FORMAT``: the groups and arrays as the view shows them, and the arrays
    it leaves out with the reason."""
    from n5fs.gateway import Gateway, GatewayConfig
    from n5fs.views import make_tree

    source = open_cli_source(text, read_only=True)
    with source.store:
        nodes = make_tree(Gateway(source.store, GatewayConfig(read_only=True)), fmt).describe()
    if not nodes:
        from n5fs.errors import DetectionFailed

        raise DetectionFailed(
            f"{source.spec.to_url()}: no N5, Zarr v2, Zarr v3 or hdmf-zarr metadata found"
        )
    if as_json:
        doc = {"source": source.spec.to_json(), "view": fmt, "nodes": nodes}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{source.spec.to_url()}  (as {fmt})")
    for node in nodes:
        print(_view_line(node))
    return 0


def _view_line(node: dict[str, Any]) -> str:
    if node["kind"] == "left out":
        path = node["path"] or "/"
        return f"{path:<32} left out: {node['reason']}"
    if node["kind"] == "file":  # an .npy file
        shape = "x".join(map(str, node["shape"])) or "scalar"
        return f"{node['path']:<32} {node['format']:<9} file  {node['dtype']}  {shape}"
    fill = node.get("fill_blocks")
    if fill is not None:  # ``--as n5``: absent chunks shown as blocks of the fill value
        grid = fill["grid_blocks"]
        where = f"{fill['where']} of the {grid} in the grid"
        return f"{_tree_line(node)}  fill {fill['fill_value']} ({where} is a fill block)"
    return _tree_line(node)


def _tree_line(node: dict[str, Any]) -> str:
    path = node["path"] or "/"
    depth = node["path"].count("/") + 1 if node["path"] else 0
    name = "  " * depth + (path.rsplit("/", 1)[-1] if node["path"] else "/")
    line = f"{name:<32} {node['format']:<9} {node['kind']}"
    if node["kind"] == "array":
        dtype = node["dtype"] if isinstance(node["dtype"], str) else "record"
        shape = "x".join(map(str, node["shape"])) or "scalar"
        chunks = "x".join(map(str, node["chunks"])) or "-"
        line += f"  {dtype}  {shape}  chunks {chunks}  {node['codecs']}"
    return line


def run_validate(args: argparse.Namespace) -> int:
    text = source_from_args(args)
    if _refuse_missing("validate", text):
        return EXIT_CANNOT_RUN
    source = open_cli_source(text, read_only=True)
    reuse_large_buffers()  # a batch job: decoded chunk buffers come from the heap (n5fs.malloc)
    with source.store:
        validator = Validator(source.store, jobs=args.jobs)
        progress = validator.progress

        def sample() -> tuple[int, int, int, bool]:
            return (
                progress.done_chunks,
                progress.total_chunks,
                progress.done_bytes,
                progress.listing_done,
            )

        with ProgressBar(sample):
            report = validator.run("")
    url = source.spec.to_url()
    empty = found_nothing(report)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not empty or args.allow_empty:
        _print_report(report, url, empty=empty)
    if empty and not args.allow_empty:
        print(
            f"n5fs validate: no array found in {url}: nothing to validate "
            "(no N5, Zarr or hdmf-zarr metadata; --allow-empty accepts that)",
            file=sys.stderr,
        )
    return validate_status(report, empty=empty, allow_empty=args.allow_empty)


def validate_status(report: Report, *, empty: bool, allow_empty: bool) -> int:
    """The exit status of a finished run (see :data:`VALIDATE_EXIT_STATUS`): invalid data
    first, then unreadable data; :data:`EXIT_VALID` only when both lists are empty, so a key
    that could not be read never passes as checked."""
    if report.invalid or (empty and not allow_empty):
        return EXIT_INVALID
    if report.unreadable:
        return EXIT_UNREADABLE
    return EXIT_VALID


def found_nothing(report: Report) -> bool:
    """No group or array anywhere: every detected one has a metadata file, which is counted
    when read, reported as invalid when its folder's metadata is broken, and as unreadable
    when it could not be read."""
    return report.metadata == 0 and not report.invalid and not report.unreadable


def _print_report(report: Report, url: str, *, empty: bool) -> None:
    for finding in sorted(report.invalid, key=lambda f: f.key):
        print(f"INVALID {finding.key}: {finding.message} [{finding.rule}]")
    for finding in sorted(report.unreadable, key=lambda f: f.key):
        print(f"UNREADABLE {finding.key}: {finding.message} [{finding.rule}]")
    for leftover in report.leftovers:
        print(f"LEFTOVER {leftover.describe()}")
    if report.leftovers:
        gone = sum(1 for leftover in report.leftovers if leftover.dead)
        print(
            f"{len(report.leftovers)} leftovers of interrupted writers ({gone} of writers that "
            "are gone: the next read-write mount removes those)"
        )
    if empty:
        verdict = "no array found"
    elif report.invalid:
        verdict = f"{len(report.invalid)} invalid"
    elif report.unreadable:
        verdict = "not fully checked"  # never "valid": some bytes were not read
    else:
        verdict = "valid"
    print(
        f"{url}: {verdict}; checked {report.metadata} metadata files, "
        f"{report.chunks} chunks; {report.other} other keys not judged; "
        f"{len(report.unreadable)} could not be checked"
    )


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "detect",
        help="show which formats, groups and arrays a store holds",
        description="Detect the format of every folder of SOURCE (TensorStore's auto "
        "algorithm, extended to groups) and print one line per group and array, or --json "
        "with the TensorStore spec that opens each array. Exit 0, or 2 with the reason (no "
        "metadata found, SOURCE does not exist, ...).",
    )
    p.add_argument("source", metavar="SOURCE", help="URL or JSON kvstore spec (see n5fs --help)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--as",
        dest="view",
        choices=VIEW_FORMATS,
        default=None,
        metavar="FORMAT",
        help="print the tree as n5fs mount --as FORMAT shows it (zarr3, zarr2, npy, n5): each "
        "array's shape, chunks and codecs in that format, and the arrays the view leaves out "
        "with the reason",
    )
    add_s3_arguments(p)
    p.set_defaults(run=run_detect)

    p = sub.add_parser(
        "validate",
        help="check every metadata file and chunk of a store (fsck)",
        description="Walk the detected hierarchy of SOURCE and check every metadata file and "
        "every chunk against its format's spec, in parallel with bounded memory. Shows progress "
        "on a terminal. Prints INVALID for a file whose bytes break its format, UNREADABLE for "
        "one that could not be read or decoded (a store fault: it was not checked). Keys that "
        "are neither metadata nor chunks are counted, not judged.",
        epilog=VALIDATE_EXIT_STATUS,
    )
    p.add_argument("source", metavar="SOURCE", help="URL or JSON kvstore spec (see n5fs --help)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print only a JSON report on stdout (progress and logs go to stderr)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help="parallel chunk checks (default: CPUs on a local store; 2 per CPU, at least 8, on a remote one)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 when SOURCE holds no group or array (a folder that may still be empty, "
        "e.g. n5fs validate --allow-empty /data/incoming); by default that is exit 1",
    )
    add_s3_arguments(p)
    p.set_defaults(run=run_validate)
