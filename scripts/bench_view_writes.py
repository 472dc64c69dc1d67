"""Memory of writes through a view: large chunks written at once through ``--as zarr3`` over
an N5 dataset, against the same blocks written natively, in one run; prints the daemon's peak
RSS (``VmHWM``) and the time of each, and checks that every block landed as a valid N5 block
holding the bytes written.

A view translates a chunk at its commit (decode the Zarr chunk, encode the N5 block); what it
holds while it does, and while the writers' bytes wait, must come out of the mount's one
memory budget (``--staging-size``), not out of a buffer per open file. The native run is the
floor: the same bytes as N5 blocks, staged and validated by the gateway.

    python scripts/bench_view_writes.py                      # six 64 MiB chunks, raw
    python scripts/bench_view_writes.py --chunks 4 --chunk-mib 16 --compression gzip
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

from n5fs.testing.soak import mounted, peak_rss_mib

MiB = 1 << 20
PIECE = 1 * MiB  # each writer writes its chunk in pieces of this size, as cp does
COMPRESSIONS = {"raw": {"type": "raw"}, "gzip": {"type": "gzip", "level": 1}}


def make_dataset(root: Path, chunks: int, chunk_bytes: int, compression: str) -> None:
    """An empty N5 root holding dataset ``d``: uint8, 1-D, ``chunks`` blocks of ``chunk_bytes``."""
    (root / "d").mkdir(parents=True)
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    meta = {
        "dimensions": [chunks * chunk_bytes],
        "blockSize": [chunk_bytes],
        "dataType": "uint8",
        "compression": COMPRESSIONS[compression],
    }
    (root / "d" / "attributes.json").write_text(json.dumps(meta))


def payload(index: int, nbytes: int) -> bytes:
    """Bytes that differ per chunk and compress a little (not all zero, not random)."""
    row = bytes((i * 7 + index) % 251 for i in range(4096))
    return (row * (nbytes // len(row) + 1))[:nbytes]


def n5_block(data: bytes, compression: str) -> bytes:
    """The N5 block of a 1-D uint8 chunk: mode 0, one dimension, its length, the payload."""
    header = struct.pack(">HHI", 0, 1, len(data))
    if compression == "gzip":
        zipper = zlib.compressobj(1, zlib.DEFLATED, 31)
        return header + zipper.compress(data) + zipper.flush()
    return header + data


def zarr_chunk(data: bytes, compression: str) -> bytes:
    """The chunk the view declares: its bytes, through the gzip codec where N5 has gzip."""
    if compression == "gzip":
        zipper = zlib.compressobj(1, zlib.DEFLATED, 31)
        return zipper.compress(data) + zipper.flush()
    return data


def block_payload(block: bytes, compression: str) -> bytes:
    mode, ndim = struct.unpack(">HH", block[:4])
    if mode != 0 or ndim != 1:
        raise RuntimeError(f"not a default-mode 1-D N5 block: mode {mode}, {ndim} dims")
    body = block[8:]
    return zlib.decompress(body, 31) if compression == "gzip" else body


def write_all(paths: list[Path], datas: list[bytes]) -> list[str]:
    """Each file written by its own thread at once, in pieces; the errors, if any."""
    errors: list[str] = []
    start = threading.Barrier(len(paths))

    def one(path: Path, data: bytes) -> None:
        try:
            start.wait()
            with open(path, "wb", buffering=0) as out:
                out.writelines(data[at : at + PIECE] for at in range(0, len(data), PIECE))
        except OSError as exc:
            errors.append(f"{path.name}: {exc}")

    threads = [threading.Thread(target=one, args=pair) for pair in zip(paths, datas, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def run(tmp: Path, chunks: int, chunk_bytes: int, compression: str, budget: str) -> int:
    limits = ["--staging-size", budget, "--cache-size", budget]
    datas = [payload(i, chunk_bytes) for i in range(chunks)]
    rows: list[tuple[str, float, float, str]] = []
    for name, extra, made in (
        ("native N5 blocks", limits, lambda d: n5_block(d, compression)),
        ("--as zarr3 chunks", [*limits, "--as", "zarr3"], lambda d: zarr_chunk(d, compression)),
    ):
        source = tmp / name.split()[0].strip("-") / "src"
        make_dataset(source, chunks, chunk_bytes, compression)
        files = [made(d) for d in datas]
        with mounted(str(source), tmp / "mnt", tmp / "state", *extra) as pid:
            before = peak_rss_mib(pid)
            started = time.perf_counter()
            errors = write_all([tmp / "mnt" / "d" / str(i) for i in range(chunks)], files)
            seconds = time.perf_counter() - started
            peak = peak_rss_mib(pid)
        del files
        bad = [
            str(i)
            for i in range(chunks)
            if not (source / "d" / str(i)).is_file()
            or block_payload((source / "d" / str(i)).read_bytes(), compression) != datas[i]
        ]
        verdict = "; ".join(errors) or (f"blocks wrong: {', '.join(bad)}" if bad else "ok")
        rows.append((name, peak, seconds, verdict))
        print(f"  {name}: idle {before:.0f} MiB", flush=True)
    print(f"\n{chunks} chunks of {chunk_bytes // MiB} MiB, {compression}, budgets {budget}:")
    print(f"{'write path':<22} {'peak RSS':>10} {'seconds':>8}  blocks")
    for name, peak, seconds, verdict in rows:
        print(f"{name:<22} {peak:>6.0f} MiB {seconds:>8.2f}  {verdict}")
    print(f"view / native peak RSS: {rows[1][1] / rows[0][1]:.2f}x")
    return 0 if all(row[3] == "ok" for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=6, help="chunks written at once (6)")
    parser.add_argument("--chunk-mib", type=int, default=64, help="MiB per chunk (64)")
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="raw")
    parser.add_argument("--budget", default="64M", help="--staging-size and --cache-size")
    parser.add_argument("--tmp", default=None, help="where the data goes (default: $TMPDIR)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="n5fs-bench-view-writes-", dir=args.tmp))
    try:
        return run(tmp, args.chunks, args.chunk_mib * MiB, args.compression, args.budget)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
