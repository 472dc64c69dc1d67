"""Member-level parsers of a Zarr v3 ``zarr.json``: fill_value and chunk_key_encoding.

They live apart from :mod:`n5fs.formats.zarr3` because each reads one member on its own,
needing only the data type or nothing at all, never the document, the node or the format:
fill_value's per-type grammar (base64 bytes, ``"NaN"``, ``"0x..."`` bit patterns, ``"NaT"``)
and the chunk key grammar (``c/1/2``, ``1.2``, canonical decimal indices) are the largest
self-contained pieces of the spec, and keeping them here keeps ``zarr3`` about documents,
nodes and chunks. Nothing here imports ``zarr3``, which imports from here.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from n5fs.codecs.limits import CodecError
from n5fs.codecs.v3 import DataType, is_int, parse_extension
from n5fs.errors import Rejected
from n5fs.formats.base import chunk_like

FMT = "zarr3"


def _bad(rule: str, message: str) -> Rejected:
    return Rejected(message, fmt=FMT, rule=rule)


# --------------------------------------------------------------------------- fill_value

_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_HEX = re.compile(r"0x([0-9a-fA-F]+)")


def parse_fill_value(value: Any, data_type: DataType) -> Any:
    """The fill value as a numpy scalar (``str``/``bytes`` for variable-length types)."""
    dtype, kind = data_type.dtype, data_type.dtype.kind
    if data_type.vlen == "utf8" or kind == "U":
        width = None if data_type.vlen else dtype.itemsize // 4
        if isinstance(value, str) and (width is None or len(value) <= width):
            return value if width is None else np.str_(value)
    elif data_type.vlen == "bytes" or kind == "S" or data_type.name == "raw_bytes":
        raw = _base64(value)
        if raw is not None and data_type.vlen == "bytes":
            return raw
        if raw is not None and (
            len(raw) <= dtype.itemsize if kind == "S" else len(raw) == dtype.itemsize
        ):
            return np.bytes_(raw) if kind == "S" else np.frombuffer(raw, dtype=dtype)[0]
    elif kind == "V":  # core r* types: one integer 0..255 per byte
        if (
            isinstance(value, list)
            and len(value) == dtype.itemsize
            and all(is_int(b) and 0 <= b <= 255 for b in value)
        ):
            return np.frombuffer(bytes(value), dtype=dtype)[0]
    elif kind == "b":
        if isinstance(value, bool):
            return np.bool_(value)
    elif kind in "iu":
        return _int_fill(value, dtype, data_type)
    elif kind in "Mm":
        if value == "NaT" or (is_int(value) and -(2**63) <= value < 2**63):
            ticks = np.iinfo(np.int64).min if value == "NaT" else value
            return np.array(ticks, dtype=np.int64).view(dtype)[()]
    elif kind == "f":
        return _float_fill(value, dtype, data_type)
    elif kind == "c" and isinstance(value, list) and len(value) == 2:
        part = np.dtype(f"f{dtype.itemsize // 2}")
        pair = np.array([_float_fill(v, part, data_type) for v in value], dtype=part)
        return pair.view(dtype)[0]
    raise _bad("fill-value", f"fill_value {value!r} is not a valid {data_type.name} value")


def _base64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None


def _int_fill(value: Any, dtype: np.dtype[Any], data_type: DataType) -> Any:
    """Integers; an integral JSON number such as ``2.0`` is accepted, as TensorStore does."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    info = np.iinfo(dtype)
    if is_int(value) and info.min <= value <= info.max:
        return dtype.type(value)
    raise _bad(
        "fill-value",
        f"fill_value {value!r} is not an integer in "
        f"[{info.min}, {info.max}] as {data_type.name} requires",
    )


def _float_fill(value: Any, dtype: np.dtype[Any], data_type: DataType) -> Any:
    """A number, "NaN"/"Infinity"/"-Infinity", or "0x..." with the exact bit pattern."""
    if isinstance(value, str) and value in _SPECIAL_FLOATS:
        return dtype.type(_SPECIAL_FLOATS[value])
    match = _HEX.fullmatch(value) if isinstance(value, str) else None
    if match and len(match.group(1)) == 2 * dtype.itemsize:
        bits = np.array(int(match.group(1), 16), dtype=f"u{dtype.itemsize}")
        return bits.view(dtype)[()]
    if is_int(value) or isinstance(value, float):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        with np.errstate(over="ignore"):
            result = dtype.type(number)
        if math.isfinite(number) and np.isfinite(result):
            return result
    raise _bad(
        "fill-value",
        f"fill_value {value!r} is not a {data_type.name} value: use a number "
        f'in range, "NaN", "Infinity", "-Infinity" or a '
        f'{2 * dtype.itemsize}-digit "0x..." bit pattern',
    )


def fill_identity(fill: Any, data_type: DataType) -> str:
    """A canonical text for a fill value, so ``"NaN"`` and ``"0x7fc00000"`` compare equal."""
    if data_type.vlen:
        return repr(fill)
    return np.array(fill, dtype=data_type.dtype).tobytes().hex()


# --------------------------------------------------------------------------- chunk keys

#: one canonical index: no sign, no leading zero; 1000 digits keeps int() under Python's
#: 4300-digit limit (any index past 19 digits lies outside every grid anyway)
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,999}", re.ASCII)


@dataclass(frozen=True)
class ChunkKeyEncoding:
    """``default`` (``c/1/2``, ``c.1.2``, 0-d ``c``) or ``v2`` (``1.2``, ``1/2``, 0-d ``0``)."""

    name: str
    separator: str

    @classmethod
    def parse(cls, value: Any) -> ChunkKeyEncoding:
        try:
            ext = parse_extension(value, "chunk_key_encoding", rule="chunk-key-encoding")
        except CodecError as exc:
            raise _bad(exc.rule, exc.message) from exc
        if ext.name not in ("default", "v2") or not ext.must_understand:
            raise _bad(
                "chunk-key-encoding",
                f"chunk_key_encoding {ext.name!r} is not 'default' "
                "or 'v2' (must_understand=false is not allowed here by the spec)",
            )
        separator = ext.configuration.get("separator", "/" if ext.name == "default" else ".")
        if set(ext.configuration) - {"separator"} or separator not in ("/", "."):
            raise _bad(
                "chunk-key-encoding",
                "chunk_key_encoding configuration may only hold "
                f"separator '/' or '.', got {dict(ext.configuration)!r}",
            )
        return cls(ext.name, separator)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": {"separator": self.separator}}

    def key(self, position: tuple[int, ...]) -> str:
        parts = [str(p) for p in position]
        if self.name == "default":
            return self.separator.join(["c", *parts])
        return self.separator.join(parts) if parts else "0"

    def parse_key(self, key: str, ndim: int) -> tuple[int, ...] | None:
        """The grid position ``key`` names (``ndim`` indices, not checked against the grid),
        or None when ``key`` is not a chunk key of an ``ndim``-dimensional array."""
        if self.name == "v2" and ndim == 0:
            return () if key == "0" else None
        parts = key.split(self.separator)
        if self.name == "default":
            if parts[0] != "c":
                return None
            parts = parts[1:]
        if len(parts) != ndim or not all(_DECIMAL.fullmatch(p) for p in parts):
            return None
        return tuple(int(p) for p in parts)

    def looks_like_key(self, key: str) -> bool:
        """Is ``key`` chunk-shaped (see :func:`chunk_like`)? A bare ``c`` is too under the
        default encoding: the 0-d key, wrong for an array with dimensions."""
        return chunk_like(key) or (self.name == "default" and key == "c")

    def grammar(self, ndim: int) -> str:
        """This encoding's chunk keys for ``ndim`` dimensions, in words (for refusals)."""
        example = self.key((0,) * ndim)
        if ndim == 0:
            return f"the single key {example!r} (the array has 0 dimensions)"
        count = f"{ndim} {'index' if ndim == 1 else 'indices'}"
        if self.name == "default":
            layout = f"'c' followed by {count}, each after {self.separator!r}"
        elif ndim == 1:
            layout = count
        else:
            layout = f"{count} joined by {self.separator!r}"
        return f"{layout}, such as {example!r}; decimal, without sign or leading zeros"
