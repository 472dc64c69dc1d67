"""The built-in demo store: a small N5 + Zarr v2 + Zarr v3 hierarchy in memory.

Made with n5fs's own codecs (each format's ``encode_chunk``), so it needs no network and no
writer library; README's first command shows it.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np

from n5fs.formats.base import ArrayNode
from n5fs.formats.registry import get_format
from n5fs.kvstore.memory import MemoryStore

DEMO_SOURCE = "demo:"

_README = b"""n5fs demo store
===============
n5/      an N5 container (gzip blocks, clipped end blocks as N5 Java writes them)
zarr2/   a Zarr v2 group with a zstd array and consolidated metadata
zarr3/   a Zarr v3 group with a sharded array
Try: find . -type f | head; cat n5/raw/attributes.json
"""

_ARRAYS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "n5",
        "n5/raw/",
        "attributes.json",
        {
            "dimensions": [40, 30, 5],
            "blockSize": [16, 16, 5],
            "dataType": "uint16",
            "compression": {"type": "gzip", "level": -1},
            "resolution": [4, 4, 40],
        },
    ),
    (
        "zarr2",
        "zarr2/raw/",
        ".zarray",
        {
            "zarr_format": 2,
            "shape": [30, 40],
            "chunks": [16, 16],
            "dtype": "<u2",
            "compressor": {"id": "zstd", "level": 3},
            "fill_value": 0,
            "order": "C",
            "filters": None,
            "dimension_separator": ".",
        },
    ),
    (
        "zarr3",
        "zarr3/raw/",
        "zarr.json",
        {
            "zarr_format": 3,
            "node_type": "array",
            "shape": [32, 32],
            "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 16]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "attributes": {"description": "sharded demo"},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [8, 8],
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "gzip", "configuration": {"level": 5}},
                        ],
                        "index_codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                        "index_location": "end",
                    },
                }
            ],
        },
    ),
]

_GROUPS: dict[str, bytes] = {
    "n5/attributes.json": b'{"n5": "4.0.0"}',
    "zarr2/.zgroup": b'{"zarr_format": 2}',
    "zarr2/.zattrs": b'{"title": "n5fs demo"}',
    "zarr3/zarr.json": b'{"zarr_format": 3, "node_type": "group", "attributes": {}}',
}


def _values(array: ArrayNode) -> np.ndarray[Any, Any]:
    n = int(np.prod(array.shape))
    return (np.arange(n) % 199).astype(array.dtype).reshape(array.shape)


def _write_array(
    store: MemoryStore, fmt_name: str, prefix: str, name: str, meta: dict[str, Any]
) -> None:
    data = json.dumps(meta, indent=2).encode()
    store.set(prefix + name, data)
    node = get_format(fmt_name).parse_metadata(name, data, path=prefix + name)
    assert isinstance(node, ArrayNode)
    values = _values(node)
    for position in itertools.product(*(range(g) for g in node.grid)):
        region = tuple(
            slice(p * c, min((p + 1) * c, s))
            for p, c, s in zip(position, node.chunks, node.shape, strict=True)
        )
        store.set(prefix + node.chunk_key(position), node.encode_chunk(position, values[region]))


def demo_store() -> MemoryStore:
    store = MemoryStore()
    store.set("README.txt", _README)
    for key, value in _GROUPS.items():
        store.set(key, value)
    for fmt_name, prefix, name, meta in _ARRAYS:
        _write_array(store, fmt_name, prefix, name, meta)
    consolidated = {
        "zarr_consolidated_format": 1,
        "metadata": {
            key.removeprefix("zarr2/"): json.loads(store.get(key) or b"{}")
            for key in ("zarr2/.zgroup", "zarr2/.zattrs", "zarr2/raw/.zarray")
        },
    }
    store.set("zarr2/.zmetadata", json.dumps(consolidated, indent=2).encode())
    return store
