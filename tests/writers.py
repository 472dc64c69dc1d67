"""Datasets written by real writers (TensorStore, zarr-python) for tests, into any path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
import zarr


def ramp(shape: tuple[int, ...], dtype: str = "uint16") -> np.ndarray[Any, Any]:
    return (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)


def tensorstore_n5(
    path: Path,
    values: np.ndarray[Any, Any],
    block: list[int],
    compression: dict[str, Any] | None = None,
) -> None:
    store = ts.open(
        {
            "driver": "n5",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "dimensions": list(values.shape),
                "blockSize": block,
                "dataType": str(values.dtype),
                "compression": compression or {"type": "gzip"},
            },
        },
        create=True,
        delete_existing=True,
    ).result()
    store.write(values).result()


def tensorstore_zarr3(
    path: Path, values: np.ndarray[Any, Any], chunks: list[int], *, shard: list[int] | None = None
) -> None:
    codecs: list[dict[str, Any]] = [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "gzip", "configuration": {"level": 5}},
    ]
    if shard is not None:
        codecs = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": chunks,
                    "codecs": codecs,
                    "index_codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "crc32c"},
                    ],
                },
            }
        ]
    store = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "shape": list(values.shape),
                "chunk_grid": {
                    "name": "regular",
                    "configuration": {"chunk_shape": shard or chunks},
                },
                "data_type": str(values.dtype),
                "codecs": codecs,
            },
        },
        create=True,
        delete_existing=True,
    ).result()
    store.write(values).result()


def zarr_python_hierarchy(root: Path, zarr_format: int) -> dict[str, np.ndarray[Any, Any]]:
    """A group with a nested group and two arrays, written by zarr-python; returns the values."""
    group = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    group.attrs["title"] = "test"
    raw = ramp((20, 30), "uint16")
    arr = group.create_array("raw", shape=raw.shape, chunks=(8, 8), dtype=raw.dtype)
    arr[...] = raw
    sub = group.create_group("labels")
    lab = ramp((10,), "int32")
    arr2 = sub.create_array("seg", shape=lab.shape, chunks=(4,), dtype=lab.dtype)
    arr2[...] = lab
    return {"raw": raw, "labels/seg": lab}
