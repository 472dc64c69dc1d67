"""``--as npy``: every array as one read-only ``<array>.npy`` file, its attributes beside it.

The file is numpy's format (``numpy.lib.format``, version 1.0, 2.0 for a huge header): the
header, made from metadata, then the whole array in C order (an N5 dataset in the axis
order of the Zarr view: reversed; its values big-endian as stored, which the header says).
Nothing is materialized: a read of bytes ``[offset, offset+size)`` works out which elements
those are, which units (chunks, inner chunks of a shard) hold them, and decodes only those
(:meth:`StoreArray.values <n5fs.views.arrays.StoreArray.values>`, cached); a missing unit
reads as the fill value. So ``np.load(path, mmap_mode="r")[i:j]`` fetches only the chunks
its pages touch (and the kernel's read-ahead around them).

A flat byte range is cut into at most ``2 * ndim - 1`` boxes that are each contiguous in C
order (:func:`c_boxes`): the rest of the first row, of the first plane..., whole slabs along
the first axis, then the same downwards; each box is filled unit by unit.

Groups stay folders; ``<array>.json`` holds an array's attributes; metadata files are not
shown. Arrays without fixed-size values (object, variable-length strings) are left out.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from n5fs.detect import Folder, FolderKind
from n5fs.gateway.namespace.paths import EntryKind
from n5fs.gateway.read.reader import PageCache
from n5fs.views.arrays import StoreArray, store_array
from n5fs.views.tree import Entry, PlanCache, ViewTree, document, left_out, to_json

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from n5fs.gateway import Attr
    from n5fs.views.access import StoreAccess

NPY = ".npy"
ATTRS = ".json"
Box = tuple[tuple[int, ...], tuple[int, ...]]


def npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """numpy's header for a C-order array (padded so the data starts 64-byte aligned)."""
    fmt = np.lib.format
    header = {"descr": fmt.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    try:
        fmt.write_array_header_1_0(out, header)
    except ValueError:  # a header over 64 KiB (a structured type with very many fields)
        out = io.BytesIO()
        fmt.write_array_header_2_0(out, header)
    return out.getvalue()


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """C-order index of element ``flat`` (Python ints: shapes may pass int64)."""
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return index[::-1]


def c_boxes(shape: tuple[int, ...], first: int, stop: int) -> Iterator[tuple[int, Box]]:
    """(flat start, (lo, hi)) of boxes, each contiguous in C order, that together are the
    elements ``[first, stop)`` of an array of ``shape``, in order."""
    ndim = len(shape)
    strides = [prod(shape[axis + 1 :]) for axis in range(ndim)]
    cursor = first
    while cursor < stop:
        index = unravel(cursor, shape)
        for axis in range(ndim):
            aligned = not any(index[axis + 1 :])
            if aligned and stop - cursor >= strides[axis]:
                count = min(shape[axis] - index[axis], (stop - cursor) // strides[axis])
                lo = (*index[:axis], index[axis], *([0] * (ndim - axis - 1)))
                hi = (*(i + 1 for i in index[:axis]), index[axis] + count, *shape[axis + 1 :])
                yield cursor, (lo, hi)
                cursor += count * strides[axis]
                break


@dataclass(frozen=True)
class NpyArray:
    """One source array as its ``.npy`` file."""

    source: StoreArray

    @cached_property
    def header(self) -> bytes:
        return npy_header(self.source.dtype, self.source.shape)

    @property
    def size(self) -> int:
        return len(self.header) + self.source.nbytes

    @cached_property
    def attributes(self) -> bytes:
        return to_json(dict(self.source.node.attributes))

    def entry(self) -> Entry:
        return Entry(EntryKind.FILE, self.size, open=lambda: NpyContent(self))


class NpyContent:
    """An open ``.npy`` file: reads work out and decode the units they touch."""

    page_cache = PageCache.KEEP

    def __init__(self, array: NpyArray) -> None:
        self.array = array
        self.source = array.source

    def read(self, size: int, offset: int) -> bytes:
        header = self.array.header
        total = self.array.size
        end = min(offset + size, total)
        if offset >= end:
            return b""
        parts = [header[offset:end]] if offset < len(header) else []
        start = max(offset, len(header)) - len(header)
        stop = end - len(header)
        if stop > start:
            parts.append(self.body(start, stop))
        return b"".join(parts)

    def body(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the array's C-order values."""
        source = self.source
        itemsize = source.dtype.itemsize
        first, last = start // itemsize, -(-stop // itemsize)
        out = np.empty(last - first, dtype=source.dtype)
        if not source.shape:  # 0-d: one element, in the one unit
            out[...] = self._unit_values((), ())
        for flat, (lo, hi) in c_boxes(source.shape, first, last) if source.shape else ():
            shape = tuple(h - low for low, h in zip(lo, hi, strict=True))
            box = out[flat - first : flat - first + prod(shape)].reshape(shape)
            self._fill(box, lo, hi)
        skip = start - first * itemsize
        return out.tobytes()[skip : skip + stop - start]

    def _unit_values(self, pos: tuple[int, ...], where: tuple[slice, ...]) -> Any:
        loc = self.source.locate(pos)
        if loc is None:
            return self.source.fill
        return self.source.values(pos, loc)[where]

    def _fill(self, box: np.ndarray[Any, Any], lo: tuple[int, ...], hi: tuple[int, ...]) -> None:
        units = self.source.units
        ranges = [
            range(low // u, (h - 1) // u + 1) for low, h, u in zip(lo, hi, units, strict=True)
        ]
        for pos in itertools.product(*ranges):
            begin = [p * u for p, u in zip(pos, units, strict=True)]
            inner_lo = [max(low, b) for low, b in zip(lo, begin, strict=True)]
            inner_hi = [min(h, b + u) for h, b, u in zip(hi, begin, units, strict=True)]
            dst = tuple(
                slice(a - low, b - low) for a, b, low in zip(inner_lo, inner_hi, lo, strict=True)
            )
            src = tuple(
                slice(a - b0, b - b0) for a, b, b0 in zip(inner_lo, inner_hi, begin, strict=True)
            )
            box[dst] = self._unit_values(pos, src)


class NpyTree(ViewTree):
    """The namespace of ``--as npy`` (see the module docs)."""

    name = "npy"

    def __init__(self, access: StoreAccess) -> None:
        super().__init__(access)
        self._plans: PlanCache[NpyArray | str] = PlanCache()

    def plan(self, folder: Folder) -> NpyArray | str:
        node = folder.array
        assert node is not None

        def make() -> NpyArray | str:
            source = store_array(self.access, folder.prefix, node)
            return source if isinstance(source, str) else NpyArray(source)

        return self._plans.get(folder.prefix, node, make)

    def _array_folder(self, key: str) -> Folder | None:
        folder = self.access.folder(key)
        return folder if folder.kind is FolderKind.ARRAY else None

    # -- groups and plain folders --------------------------------------------------------------

    def documents(self, folder: Folder) -> Mapping[str, bytes]:
        return {}

    def in_folder(self, folder: Folder, name: str, key: str) -> Entry | None:
        for suffix in (NPY, ATTRS):
            if name.endswith(suffix) and len(name) > len(suffix):
                made = self._made(key[: -len(suffix)], suffix)
                if made is not None:
                    return made
        return super().in_folder(folder, name, key)

    def _made(self, stem: str, suffix: str) -> Entry | None:
        attr = self.access.lookup(stem)
        if attr is None or attr.kind is not EntryKind.DIR:
            return None
        array = self._array_folder(stem)
        plan = None if array is None else self.plan(array)
        if not isinstance(plan, NpyArray):
            return None
        return plan.entry() if suffix == NPY else document(plan.attributes)

    def subfolder(self, key: str, attr: Attr) -> Entry | None:
        if self._array_folder(key) is not None:
            return None  # an array is a file here
        return Entry(EntryKind.DIR, mtime=attr.mtime)

    def listed(
        self, folder: Folder, name: str, key: str, attr: Attr
    ) -> Iterator[tuple[str, Entry]]:
        if attr.kind is not EntryKind.DIR:
            yield from super().listed(folder, name, key, attr)
            return
        array = self._array_folder(key)
        if array is None:
            yield name, Entry(EntryKind.DIR, mtime=attr.mtime)
            return
        plan = self.plan(array)
        if isinstance(plan, NpyArray):
            yield name + NPY, plan.entry()
            yield name + ATTRS, document(plan.attributes)

    # -- arrays are files: nothing inside them -------------------------------------------------

    def in_array(self, array: Folder, rel: str) -> Entry | None:
        return None

    def array_children(self, array: Folder, rel_dir: str) -> list[tuple[str, Entry]]:
        return []

    # -- detect --as ---------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        for folder in self.access.detector.walk("", on_error=lambda prefix, exc: None):
            path = folder.prefix.rstrip("/")
            if folder.kind is FolderKind.GROUP:
                nodes.append({"path": path, "format": "folder", "kind": "group"})
            elif folder.kind is FolderKind.ARRAY:
                plan = self.plan(folder)
                if isinstance(plan, str):
                    nodes.append(left_out(folder, path, plan))
                    continue
                nodes.append(
                    {
                        "path": path + NPY,
                        "format": "npy",
                        "kind": "file",
                        "from": folder.fmt,
                        "dtype": plan.source.dtype.str,
                        "shape": list(plan.source.shape),
                        "size": plan.size,
                    }
                )
        return nodes
