"""Member-level parsers of a Zarr v2 ``.zarray``: dtype and fill_value.

They live apart from :mod:`n5fs.formats.zarr2` because each reads one member on its own,
needing at most the parsed dtype, never the document, the node or the format: the dtype
grammar (numpy type strings with their byte-order, size and datetime-unit rules, and nested
structured field lists) and the per-kind fill_value encodings (``"NaN"``/``"Infinity"`` words,
``[real, imag]`` pairs, int64 datetime counts, base64 bytes) are the largest self-contained
pieces of the spec, and keeping them here keeps ``zarr2`` about documents, nodes and chunks.
Nothing here imports ``zarr2``, which imports from here (``_bad`` and ``_is_int`` included).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

import numpy as np

from n5fs.errors import Rejected

# fmt: off
_SIMPLE_DTYPE = re.compile(
    r"([<>|])([biufcmMSUVO])(\d*)(?:\[(\d*)(Y|M|W|D|h|m|s|ms|us|ns|ps|fs|as)\])?", re.ASCII)
_FIXED_SIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16),
                "m": (8,), "M": (8,), "O": (8,)}
# fmt: on
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_MAX_NESTING = 8
_MAX_ITEMSIZE = 1 << 31


def _bad(rule: str, message: str) -> Rejected:
    return Rejected(message, rule=rule)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- dtype ----------------------------------------------------------------------------------


def parse_dtype(spec: Any, depth: int = 0) -> np.dtype[Any]:
    """A v2 ``dtype``: a numpy type string, or a structured list of ``[name, dtype(, shape)]``."""
    if isinstance(spec, str):
        return _simple_dtype(spec)
    if isinstance(spec, list) and spec and depth < _MAX_NESTING:
        return _structured_dtype(spec, depth)
    raise _bad(
        "dtype", f"dtype must be a type string or a non-empty list of fields, got {spec!r:.80}"
    )


def _simple_dtype(spec: str) -> np.dtype[Any]:
    match = _SIMPLE_DTYPE.fullmatch(spec)
    if match is None:
        raise _bad(
            "dtype",
            f"dtype {spec!r:.40} is not '<byteorder><kind><size>' (e.g. '<u2', '|S5', '<M8[ns]')",
        )
    order, kind, size_text, _, unit = match.groups()
    size = int(size_text) if size_text else (8 if kind == "O" else 0)
    allowed = _FIXED_SIZES.get(kind)
    if (allowed is not None and size not in allowed) or not 0 < size < _MAX_ITEMSIZE:
        raise _bad("dtype", f"dtype {spec!r}: no {kind!r} type has size {size}")
    if (unit is None) == (kind in "mM"):
        raise _bad(
            "dtype",
            f"dtype {spec!r}: datetime64/timedelta64 need a unit like "
            "'[ns]', other kinds take none",
        )
    if order == "|" and (kind == "U" or (kind in "iufcmM" and size > 1)):
        raise _bad("dtype", f"dtype {spec!r}: a multi-byte type needs byte order '<' or '>'")
    return np.dtype(spec)


def _structured_dtype(fields: list[Any], depth: int) -> np.dtype[Any]:
    parts: list[tuple[Any, ...]] = []
    for item in fields:
        ok = isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], str)
        if not ok or not item[0]:
            raise _bad(
                "dtype",
                f"structured dtype field {item!r:.60} is not [name, dtype] or [name, dtype, shape]",
            )
        sub = parse_dtype(item[1], depth + 1)
        if len(item) == 3:
            shape = item[2]
            if not isinstance(shape, list) or not all(_is_int(n) and n >= 1 for n in shape):
                raise _bad("dtype", f"field {item[0]!r}: shape must be a list of positive ints")
            parts.append((item[0], sub, tuple(shape)))
        else:
            parts.append((item[0], sub))
    try:
        dtype = np.dtype(parts)
    except (TypeError, ValueError) as exc:
        raise _bad("dtype", f"structured dtype refused: {exc}") from exc
    if dtype.hasobject or not 0 < dtype.itemsize < _MAX_ITEMSIZE:
        raise _bad("dtype", "structured dtype fields must be fixed-size, non-object types")
    return dtype


# --- fill_value -----------------------------------------------------------------------------


def parse_fill_value(value: Any, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The fill value as a 0-d array of ``dtype``; refuses an encoding that does not fit it.

    null: zeros (object: None). Floats: numbers or "NaN"/"Infinity"/"-Infinity". Complex:
    [real, imag]. datetime/timedelta: int64 counts (or "NaT"). S: base64 of at most itemsize
    bytes. U: a string. V and structured: base64 of exactly itemsize bytes. Object: any scalar.
    """
    out = np.zeros((), dtype=dtype)
    if value is None:
        return out
    kind = dtype.kind
    if kind == "O":
        if isinstance(value, (dict, list)):
            raise _bad("fill-value", "an object array's fill_value must be a JSON scalar")
        out[()] = value
    elif kind == "V":
        raw = _base64(value, dtype)
        if len(raw) != dtype.itemsize:
            raise _bad(
                "fill-value", f"fill_value holds {len(raw)} bytes, {dtype} needs {dtype.itemsize}"
            )
        out = np.frombuffer(raw, dtype=dtype).reshape(())
    else:
        out[()] = _scalar(value, dtype)
    return out


def _scalar(value: Any, dtype: np.dtype[Any]) -> Any:
    kind = dtype.kind
    if kind == "b" and (isinstance(value, bool) or value in (0, 1)):
        return bool(value)
    if kind in "iu" and (_is_int(value) or (isinstance(value, float) and value.is_integer())):
        info = np.iinfo(dtype)
        if info.min <= value <= info.max:
            return int(value)
    if kind == "f":
        return _float(value, dtype)
    if kind == "c" and isinstance(value, list) and len(value) == 2:
        part = np.dtype(f"f{dtype.itemsize // 2}")
        return complex(_float(value[0], part), _float(value[1], part))
    if kind in "mM" and (value == "NaT" or (_is_int(value) and -(2**63) <= value < 2**63)):
        count = -(2**63) if value == "NaT" else value
        return np.array(count, dtype=np.int64).view(dtype.newbyteorder("="))
    if kind == "S":
        raw = _base64(value, dtype)
        if len(raw) <= dtype.itemsize:
            return raw
    if kind == "U" and isinstance(value, str) and len(value) <= dtype.itemsize // 4:
        return value
    raise _bad("fill-value", f"fill_value {value!r:.60} does not encode a {dtype} value")


def _float(value: Any, dtype: np.dtype[Any]) -> float:
    if isinstance(value, str) and value in _FLOAT_WORDS:
        return _FLOAT_WORDS[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond every float
            number = None
        # a bare NaN/Infinity token passes; a finite number must fit the type
        if number is not None and (
            not math.isfinite(number) or abs(number) <= float(np.finfo(dtype).max)
        ):
            return number
    raise _bad(
        "fill-value",
        f"fill_value {value!r:.60} is not a {dtype} number (or 'NaN', 'Infinity', '-Infinity')",
    )


def _base64(value: Any, dtype: np.dtype[Any]) -> bytes:
    if isinstance(value, str):
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            pass
    raise _bad("fill-value", f"fill_value for {dtype} must be a base64 string, got {value!r:.60}")
