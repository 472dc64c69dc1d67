"""Zarr v3 values every codec is parsed against: data types, extension points, array specs.

A codec is configured for the *decoded representation* it will see (chunk shape, data type,
fill value), so these types sit below the codecs, the chain and sharding, and import none of
them: any module of the package may build on this one without risking an import cycle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from n5fs.codecs.limits import CodecError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Largest ``length_bytes`` / raw width accepted for fixed-size string and raw data types.
MAX_ITEMSIZE = (1 << 31) - 1

_EXTENSION_KEYS = frozenset({"name", "configuration", "must_understand"})


def bad_config(message: str, rule: str = "codec-config") -> CodecError:
    return CodecError(message, rule=rule)


def is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer (``bool`` is an ``int`` in Python, never in JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Extension:
    """One extension-point value: ``"name"`` or ``{"name", "configuration", "must_understand"}``."""

    name: str
    configuration: Mapping[str, Any]
    must_understand: bool = True


def parse_extension(value: Any, what: str, rule: str = "codec-config") -> Extension:
    """Parse the spec's extension definition (object or short-hand name)."""
    if isinstance(value, str):
        return Extension(value, {})
    if not isinstance(value, dict):
        raise bad_config(f"{what} must be a name or an object with 'name', got {value!r}", rule)
    extra = sorted(set(value) - _EXTENSION_KEYS)
    if extra:
        raise bad_config(
            f"{what} has members {extra} beyond name/configuration/must_understand", rule
        )
    name, config = value.get("name"), value.get("configuration", {})
    must = value.get("must_understand", True)
    if not isinstance(name, str) or not name:
        raise bad_config(f"{what} needs a string 'name', got {name!r}", rule)
    if not isinstance(config, dict):
        raise bad_config(f"{what} {name!r}: 'configuration' must be an object", rule)
    if not isinstance(must, bool):
        raise bad_config(f"{what} {name!r}: 'must_understand' must be true or false", rule)
    return Extension(name, config, must)


def check_keys(
    config: Mapping[str, Any], what: str, required: set[str], optional: set[str]
) -> None:
    missing = sorted(required - set(config))
    unknown = sorted(set(config) - required - optional)
    if missing:
        raise bad_config(f"{what} configuration lacks required {missing}")
    if unknown:
        raise bad_config(f"{what} configuration has unknown members {unknown}")


# --------------------------------------------------------------------------- data types

_NUMERIC = {
    "bool": "?",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "complex64": "c8",
    "complex128": "c16",
}
_RAW_BITS = re.compile(r"r([1-9][0-9]*)")
_TIME_UNITS = frozenset(
    {"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs", "as", "generic"}
)
_LENGTH_TYPES = {"fixed_length_utf32": "U", "null_terminated_bytes": "S", "raw_bytes": "V"}
_VLEN = {"string": "utf8", "variable_length_bytes": "bytes", "bytes": "bytes"}


@dataclass(frozen=True)
class DataType:
    """A v3 data type: its normalized JSON identity and the numpy dtype of its values.

    ``vlen`` is ``"utf8"`` or ``"bytes"`` for zarr-python's variable-length types, whose
    values are Python objects (``dtype('O')``) serialized by a ``vlen-*`` codec.
    """

    json: Any = field(compare=False)
    dtype: np.dtype[Any]
    vlen: str | None = None

    @property
    def name(self) -> str:
        return str(self.json if isinstance(self.json, str) else self.json["name"])

    @property
    def endian_matters(self) -> bool:
        """Does the ``bytes`` codec need ``endian`` (multi-byte units)?"""
        return self.vlen is None and self.dtype.kind not in "SVb" and self.dtype.itemsize > 1


def parse_data_type(value: Any) -> DataType:
    """The data types the core spec and zarr-python 3 write (``structured`` left out)."""
    ext = parse_extension(value, "data_type", rule="data-type")
    if not ext.must_understand:
        raise bad_config(
            "data_type cannot set must_understand=false (the spec does not "
            "support it for the data type extension point)",
            "data-type",
        )
    name, config = ext.name, ext.configuration
    if name in _NUMERIC or _RAW_BITS.fullmatch(name) or name in _VLEN:
        if config:
            raise bad_config(f"data_type {name!r} takes no configuration", "data-type")
        if name in _NUMERIC:
            return DataType(name, np.dtype(_NUMERIC[name]))
        if name in _VLEN:
            return DataType(name, np.dtype(object), _VLEN[name])
        bits = int(name[1:])
        if bits % 8 or bits // 8 > MAX_ITEMSIZE:
            raise bad_config(f"raw data_type {name!r}: bits must be a multiple of 8", "data-type")
        return DataType(name, np.dtype(f"V{bits // 8}"))
    if name in _LENGTH_TYPES:
        return _length_type(name, config)
    if name in ("numpy.datetime64", "numpy.timedelta64"):
        return _time_type(name, config)
    raise bad_config(f"unsupported data_type {name!r}", "data-type")


def _length_type(name: str, config: Mapping[str, Any]) -> DataType:
    length = config.get("length_bytes")
    if set(config) != {"length_bytes"} or not is_int(length) or not 0 < length <= MAX_ITEMSIZE:
        raise bad_config(
            f"data_type {name!r} needs configuration {{'length_bytes': N}}, N > 0", "data-type"
        )
    kind = _LENGTH_TYPES[name]
    if kind == "U":
        if length % 4:
            raise bad_config(f"{name}: length_bytes {length} is not a multiple of 4", "data-type")
        dtype = np.dtype(f"<U{length // 4}")
    else:
        dtype = np.dtype(f"{kind}{length}")
    return DataType({"name": name, "configuration": {"length_bytes": length}}, dtype)


def _time_type(name: str, config: Mapping[str, Any]) -> DataType:
    unit, scale = config.get("unit"), config.get("scale_factor")
    if (
        set(config) != {"unit", "scale_factor"}
        or unit not in _TIME_UNITS
        or not is_int(scale)
        or not 0 < scale < 2**31
    ):
        raise bad_config(
            f"data_type {name!r} needs configuration {{'unit': one of "
            f"{sorted(_TIME_UNITS)}, 'scale_factor': 1..2^31-1}}",
            "data-type",
        )
    code = "M8" if name.endswith("datetime64") else "m8"
    numpy_unit = "us" if unit == "μs" else unit
    dtype = np.dtype(code if unit == "generic" else f"{code}[{scale}{numpy_unit}]")
    return DataType({"name": name, "configuration": {"unit": unit, "scale_factor": scale}}, dtype)


@dataclass(frozen=True)
class ArraySpec:
    """A decoded representation: what a codec receives on encode and returns on decode."""

    shape: tuple[int, ...]
    data_type: DataType
    fill_value: Any

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.data_type.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=object))

    @property
    def nbytes(self) -> int | None:
        """Decoded size in bytes, or None for variable-length types."""
        return None if self.data_type.vlen else self.size * self.dtype.itemsize

    def filled(self) -> np.ndarray[Any, Any]:
        return np.full(self.shape, self.fill_value, dtype=self.dtype)

    def with_shape(self, shape: tuple[int, ...]) -> ArraySpec:
        return ArraySpec(shape, self.data_type, self.fill_value)
