"""Zarr v2 chunk validation throughput against plain numcodecs decoding of the same bytes.

Validation (``Zarr2ArrayNode.validate_chunk``: grid check, bounded decode, exact size check)
should cost at most ~1.2x a bare ``codec.decode``. Both run in this process on the same
chunks; the table reports the best of several rounds, so the ratio is what matters.

    python scripts/bench_validate.py [--side 64] [--chunks 8] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

import numcodecs
import numpy as np

from n5fs.formats.zarr2 import Zarr2ArrayNode, Zarr2Format

if TYPE_CHECKING:
    from collections.abc import Callable

CODECS = {
    "gzip(5)": {"id": "gzip", "level": 5},
    "zlib(5)": {"id": "zlib", "level": 5},
    "blosc(lz4,shuffle)": {
        "id": "blosc",
        "cname": "lz4",
        "clevel": 5,
        "shuffle": 1,
        "blocksize": 0,
    },
    "blosc(zstd,bitshuffle)": {
        "id": "blosc",
        "cname": "zstd",
        "clevel": 3,
        "shuffle": 2,
        "blocksize": 0,
    },
    "zstd(3)": {"id": "zstd", "level": 3},
}


def realistic_chunk(side: int, seed: int) -> np.ndarray[Any, Any]:
    """Smooth structure plus Poisson noise: what a microscope volume chunk looks like."""
    rng = np.random.default_rng(seed)
    z, y, x = np.meshgrid(*(np.linspace(0, 6, side),) * 3, indexing="ij")
    base = 800 + 600 * np.sin(x + seed) * np.cos(y) + 300 * np.sin(z * 1.7)
    return np.asarray(rng.poisson(np.clip(base, 10, None)), dtype="<u2")


def best(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    side = args.side
    chunks = [realistic_chunk(side, seed) for seed in range(args.chunks)]
    raw_mib = sum(c.nbytes for c in chunks) / 2**20
    print(
        f"{args.chunks} chunks of {side}^3 <u2 ({raw_mib:.1f} MiB decoded), "
        f"best of {args.rounds} rounds\n"
    )
    print(
        f"{'codec':<24}{'ratio':>7}{'decode MB/s':>13}{'validate MB/s':>15}{'validate/decode':>17}"
    )
    for name, config in CODECS.items():
        doc = {
            "zarr_format": 2,
            "shape": [side * args.chunks, side, side],
            "chunks": [side] * 3,
            "dtype": "<u2",
            "compressor": config,
            "fill_value": 0,
            "order": "C",
            "filters": None,
        }
        node = Zarr2Format().parse_metadata(".zarray", json.dumps(doc).encode())
        assert isinstance(node, Zarr2ArrayNode)
        blobs = [node.encode_chunk((i, 0, 0), c) for i, c in enumerate(chunks)]
        codec = numcodecs.get_codec(dict(config))

        def decode(blobs: list[bytes] = blobs, codec: object = codec) -> None:
            for blob in blobs:
                codec.decode(blob)  # type: ignore[attr-defined]

        def validate(blobs: list[bytes] = blobs, node: Zarr2ArrayNode = node) -> None:
            for i, blob in enumerate(blobs):
                node.validate_chunk((i, 0, 0), blob)

        validate()  # warm up and prove every chunk is valid
        t_decode, t_validate = best(decode, args.rounds), best(validate, args.rounds)
        ratio = sum(c.nbytes for c in chunks) / sum(len(b) for b in blobs)
        print(
            f"{name:<24}{ratio:>7.2f}{raw_mib * 1.048576 / t_decode:>13.0f}"
            f"{raw_mib * 1.048576 / t_validate:>15.0f}{t_validate / t_decode:>16.2f}x"
        )


if __name__ == "__main__":
    main()
