"""``n5fs detect`` and ``n5fs validate``: what a store holds, and whether all of it is valid."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from n5fs.cli.progress import ProgressBar
from n5fs.detect import Detector, Folder, FolderKind, Source, node_spec, open_source
from n5fs.validate import Validator

if TYPE_CHECKING:
    import argparse

    import numpy as np


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


def source_from_args(args: argparse.Namespace) -> str:
    """SOURCE, with the S3 flags applied to its S3 store (an error if it has none)."""
    from n5fs.cli.config import S3Settings, with_s3

    settings = S3Settings(
        endpoint=args.endpoint, region=args.region, profile=args.profile, anonymous=args.anon
    )
    if settings == S3Settings():
        return str(args.source)
    return with_s3(args.source, settings, "command line")


def open_cli_source(text: str, *, read_only: bool = False) -> Source:
    """``open_source``, plus ``demo:`` for the built-in demo store."""
    from n5fs.cli.demo import DEMO_SOURCE, demo_store

    if text == DEMO_SOURCE:
        store = demo_store()
        return Source(store.spec, store, None)
    return open_source(text, read_only=read_only)


def run_detect(args: argparse.Namespace) -> int:
    source = open_cli_source(source_from_args(args))
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
    source = open_cli_source(source_from_args(args), read_only=True)
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
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for finding in sorted(report.invalid, key=lambda f: f.key):
            print(f"INVALID {finding.key}: {finding.message} [{finding.rule}]")
        for finding in sorted(report.skipped, key=lambda f: f.key):
            print(f"SKIPPED {finding.key}: {finding.message}")
        verdict = "valid" if report.ok else f"{len(report.invalid)} invalid"
        print(
            f"{source.spec.to_url()}: {verdict}; checked {report.metadata} metadata files, "
            f"{report.chunks} chunks; {report.other} other keys not judged; "
            f"{len(report.skipped)} skipped"
        )
    return 0 if report.ok else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "detect",
        help="show which formats, groups and arrays a store holds",
        description="Detect the format of every folder of SOURCE (TensorStore's auto "
        "algorithm, extended to groups) and print one line per group and array, or --json "
        "with the TensorStore spec that opens each array. Exit 0, or 2 with the reason.",
    )
    p.add_argument("source", metavar="SOURCE", help="URL or JSON kvstore spec (see n5fs --help)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_s3_arguments(p)
    p.set_defaults(run=run_detect)

    p = sub.add_parser(
        "validate",
        help="check every metadata file and chunk of a store (fsck)",
        description="Walk the detected hierarchy of SOURCE and check every metadata file and "
        "every chunk against its format's spec, in parallel with bounded memory. Shows progress "
        "on a terminal. Exit 0 when all is valid, 1 when something is not, 2 when it could not "
        "run. Keys that are neither metadata nor chunks are counted, not judged.",
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
    add_s3_arguments(p)
    p.set_defaults(run=run_validate)
