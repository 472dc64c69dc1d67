"""The Zarr v3 codec chain: ``array -> array``*, one ``array -> bytes``, ``bytes -> bytes``*.

A chain is parsed against the *decoded representation* it will see (chunk shape, data
type, fill value), as the core spec's ``compute_encoded_representation_type`` does, so a
configuration that cannot work for this array (a transpose order of the wrong length, a
``bytes`` codec without ``endian`` for ``int32``) is refused when the metadata is
written, not when the first chunk arrives. Every decode is bounded: each ``bytes ->
bytes`` stage may produce at most what the next stage could legally consume, so a
decompression bomb is refused before it inflates. Sharding lives in ``sharding.py``.
"""

from __future__ import annotations

import abc
import enum
import gzip
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

import google_crc32c
import numpy as np
import zstandard

from n5fs.codecs.limits import (
    CodecError,
    blosc_decompress,
    check_size,
    gzip_decompress,
    zstd_decompress,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Bound on one variable-length chunk's serialized size: vlen codecs have no size in metadata.
VLEN_MAX_BYTES = 256 << 20
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


# --------------------------------------------------------------------------- codec kinds


class CodecKind(enum.IntEnum):
    """Ordered as a chain must be: a later kind never precedes an earlier one."""

    ARRAY_ARRAY = 0
    ARRAY_BYTES = 1
    BYTES_BYTES = 2


class Codec(abc.ABC):
    name: ClassVar[str]
    kind: ClassVar[CodecKind]

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> Codec:
        """Validate ``config`` for the decoded representation ``spec``; raise CodecError."""

    @abc.abstractmethod
    def configuration(self) -> dict[str, Any]:
        """The normalized configuration (empty: written without ``configuration``)."""

    def to_json(self) -> dict[str, Any]:
        config = self.configuration()
        return {"name": self.name, "configuration": config} if config else {"name": self.name}

    def summary(self) -> str:
        args = ", ".join(
            f"{k}={v}" for k, v in self.configuration().items() if not isinstance(v, (list, dict))
        )
        return f"{self.name}({args})" if args else self.name


class ArrayArrayCodec(Codec):
    kind = CodecKind.ARRAY_ARRAY

    @abc.abstractmethod
    def encoded_spec(self, spec: ArraySpec) -> ArraySpec: ...

    @abc.abstractmethod
    def encode(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]: ...

    @abc.abstractmethod
    def decode(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]: ...


class ArrayBytesCodec(Codec):
    kind = CodecKind.ARRAY_BYTES

    @abc.abstractmethod
    def decode(self, data: bytes, spec: ArraySpec) -> np.ndarray[Any, Any]: ...

    @abc.abstractmethod
    def encode(self, array: np.ndarray[Any, Any], spec: ArraySpec) -> bytes: ...

    @abc.abstractmethod
    def max_encoded_size(self, spec: ArraySpec) -> int:
        """Upper bound of the encoding: the decode limit of the next codec."""

    def encoded_size(self, spec: ArraySpec) -> int | None:
        """Exact encoded size when it does not depend on the values (index codecs need it)."""
        return None

    def validate(self, data: bytes, spec: ArraySpec) -> None:
        """Raise CodecError unless ``data`` decodes; sharding overrides to stay bounded."""
        self.decode(data, spec)


class BytesBytesCodec(Codec):
    kind = CodecKind.BYTES_BYTES

    @abc.abstractmethod
    def decode(self, data: bytes, limit: int) -> bytes:
        """Decode to at most ``limit`` bytes (CodecError beyond: a bomb)."""

    @abc.abstractmethod
    def encode(self, data: bytes) -> bytes: ...

    def max_encoded_size(self, size: int) -> int:
        """Compressors may expand incompressible input a little; this bound is generous."""
        return size + size // 8 + 1024

    def encoded_size(self, size: int) -> int | None:
        return None


# --------------------------------------------------------------------------- core codecs


@dataclass(frozen=True)
class TransposeCodec(ArrayArrayCodec):
    """Encoded axis ``i`` is decoded axis ``order[i]`` (spec: transpose v1.0)."""

    name = "transpose"
    order: tuple[int, ...]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> TransposeCodec:
        check_keys(config, "transpose", {"order"}, set())
        order, ndim = config["order"], len(spec.shape)
        if order in ("C", "F"):  # early v3 writers; TensorStore still reads them
            return cls(tuple(range(ndim)) if order == "C" else tuple(reversed(range(ndim))))
        if (
            not isinstance(order, list)
            or not all(is_int(i) for i in order)
            or sorted(order) != list(range(ndim))
        ):
            raise bad_config(f"transpose order {order!r} is not a permutation of 0..{ndim - 1}")
        return cls(tuple(order))

    def configuration(self) -> dict[str, Any]:
        return {"order": list(self.order)}

    def encoded_spec(self, spec: ArraySpec) -> ArraySpec:
        return spec.with_shape(tuple(spec.shape[i] for i in self.order))

    def encode(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return array.transpose(self.order)

    def decode(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return array.transpose(np.argsort(self.order))


@dataclass(frozen=True)
class BytesCodec(ArrayBytesCodec):
    """Fixed-size elements in C order, in the configured byte order (spec: bytes v1.0)."""

    name = "bytes"
    endian: str | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> BytesCodec:
        check_keys(config, "bytes", set(), {"endian"})
        endian = config.get("endian")
        if spec.data_type.vlen:
            raise bad_config(
                f"the bytes codec cannot encode variable-length data_type "
                f"{spec.data_type.name!r}; use vlen-{spec.data_type.vlen}"
            )
        if endian not in (None, "little", "big"):
            raise bad_config(f"bytes endian must be 'little' or 'big', got {endian!r}")
        if endian is None and spec.data_type.endian_matters:
            raise bad_config(
                f"bytes codec requires 'endian' for multi-byte data_type {spec.data_type.name!r}"
            )
        return cls(endian if spec.data_type.endian_matters else None)

    def configuration(self) -> dict[str, Any]:
        return {"endian": self.endian} if self.endian else {}

    def _stored(self, spec: ArraySpec) -> np.dtype[Any]:
        return spec.dtype.newbyteorder(">" if self.endian == "big" else "<")

    def decode(self, data: bytes, spec: ArraySpec) -> np.ndarray[Any, Any]:
        check_size(len(data), spec.size * spec.dtype.itemsize, "chunk")
        if spec.dtype.kind == "b" and data and max(data) > 1:
            raise CodecError(
                "bool elements must be the bytes 0x00 or 0x01 (spec: bytes codec)",
                rule="invalid-value",
            )
        flat = np.frombuffer(data, dtype=self._stored(spec))
        return flat.astype(spec.dtype).reshape(spec.shape)

    def encode(self, array: np.ndarray[Any, Any], spec: ArraySpec) -> bytes:
        return np.ascontiguousarray(array, dtype=self._stored(spec)).tobytes()

    def max_encoded_size(self, spec: ArraySpec) -> int:
        return spec.size * spec.dtype.itemsize

    def encoded_size(self, spec: ArraySpec) -> int | None:
        return self.max_encoded_size(spec)


@dataclass(frozen=True)
class VlenCodec(ArrayBytesCodec):
    """zarr-python's ``vlen-utf8``/``vlen-bytes``: uint32 count, then (uint32 length, bytes)*."""

    name = "vlen-utf8"
    utf8: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> VlenCodec:
        check_keys(config, cls.name, set(), set())
        want = "utf8" if cls is VlenUtf8Codec else "bytes"
        if spec.data_type.vlen != want:
            raise bad_config(
                f"{cls.name} encodes only variable-length "
                f"{'string' if want == 'utf8' else 'bytes'} data, not "
                f"{spec.data_type.name!r}"
            )
        return cls(want == "utf8")

    def configuration(self) -> dict[str, Any]:
        return {}

    def decode(self, data: bytes, spec: ArraySpec) -> np.ndarray[Any, Any]:
        view, pos, count = memoryview(data), 4, spec.size
        if len(data) < 4 or int.from_bytes(data[:4], "little") != count:
            raise CodecError(f"{self.name} header must state {count} items", rule="decoded-size")
        if len(data) < 4 + 4 * count:  # before allocating: each item needs a length prefix
            raise CodecError(f"{self.name} data is too short for {count} items", rule="undecodable")
        out = np.empty(count, dtype=object)
        for i in range(count):
            size = int.from_bytes(view[pos : pos + 4], "little")
            if pos + 4 + size > len(data):
                raise CodecError(f"{self.name} item {i} runs past the end", rule="undecodable")
            item = bytes(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
            out[i] = self._text(item) if self.utf8 else item
        if pos != len(data):
            raise CodecError(
                f"{self.name} has {len(data) - pos} trailing bytes", rule="trailing-data"
            )
        return out.reshape(spec.shape)

    def _text(self, item: bytes) -> str:
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"vlen-utf8 item is not UTF-8: {exc}", rule="undecodable") from exc

    def encode(self, array: np.ndarray[Any, Any], spec: ArraySpec) -> bytes:
        parts = [len(array.flat).to_bytes(4, "little")]
        for value in np.asarray(array).ravel(order="C"):
            item = value.encode("utf-8") if self.utf8 else bytes(value)
            parts += [len(item).to_bytes(4, "little"), item]
        return b"".join(parts)

    def max_encoded_size(self, spec: ArraySpec) -> int:
        return VLEN_MAX_BYTES


class VlenUtf8Codec(VlenCodec):
    name = "vlen-utf8"


class VlenBytesCodec(VlenCodec):
    name = "vlen-bytes"


@dataclass(frozen=True)
class GzipCodec(BytesBytesCodec):
    name = "gzip"
    level: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> GzipCodec:
        check_keys(config, "gzip", {"level"}, set())
        level = config["level"]
        if not is_int(level) or not 0 <= level <= 9:
            raise bad_config(f"gzip level must be an integer 0..9, got {level!r}")
        return cls(level)

    def configuration(self) -> dict[str, Any]:
        return {"level": self.level}

    def decode(self, data: bytes, limit: int) -> bytes:
        return gzip_decompress(data, limit)

    def encode(self, data: bytes) -> bytes:
        return gzip.compress(data, compresslevel=self.level, mtime=0)


@dataclass(frozen=True)
class ZstdCodec(BytesBytesCodec):
    """``checksum`` is optional on read (TensorStore omits it); it defaults to false."""

    name = "zstd"
    level: int
    checksum: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> ZstdCodec:
        check_keys(config, "zstd", {"level"}, {"checksum"})
        level, checksum = config["level"], config.get("checksum", False)
        if not is_int(level) or not -131072 <= level <= 22:
            raise bad_config(f"zstd level must be an integer -131072..22, got {level!r}")
        if not isinstance(checksum, bool):
            raise bad_config(f"zstd checksum must be true or false, got {checksum!r}")
        return cls(level, checksum)

    def configuration(self) -> dict[str, Any]:
        return {"level": self.level, "checksum": self.checksum}

    def decode(self, data: bytes, limit: int) -> bytes:
        return zstd_decompress(data, limit)

    def encode(self, data: bytes) -> bytes:
        return zstandard.ZstdCompressor(level=self.level, write_checksum=self.checksum).compress(
            data
        )


_BLOSC_CNAMES = ("lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib")
_BLOSC_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")


@dataclass(frozen=True)
class BloscCodec(BytesBytesCodec):
    name = "blosc"
    cname: str
    clevel: int
    shuffle: str
    typesize: int | None
    blocksize: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> BloscCodec:
        check_keys(config, "blosc", {"cname", "clevel", "shuffle", "blocksize"}, {"typesize"})
        cname, clevel, shuffle = config["cname"], config["clevel"], config["shuffle"]
        typesize, blocksize = config.get("typesize"), config["blocksize"]
        if cname not in _BLOSC_CNAMES:
            raise bad_config(f"blosc cname must be one of {list(_BLOSC_CNAMES)}, got {cname!r}")
        if not is_int(clevel) or not 0 <= clevel <= 9:
            raise bad_config(f"blosc clevel must be an integer 0..9, got {clevel!r}")
        if shuffle not in _BLOSC_SHUFFLES:
            raise bad_config(
                f"blosc shuffle must be one of {list(_BLOSC_SHUFFLES)}, got {shuffle!r}"
            )
        if typesize is None and shuffle != "noshuffle":
            raise bad_config("blosc typesize is required unless shuffle is 'noshuffle'")
        if typesize is not None and (not is_int(typesize) or typesize < 1):
            raise bad_config(f"blosc typesize must be a positive integer, got {typesize!r}")
        if not is_int(blocksize) or blocksize < 0:
            raise bad_config(f"blosc blocksize must be an integer >= 0, got {blocksize!r}")
        return cls(cname, clevel, shuffle, typesize, blocksize)

    def configuration(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "cname": self.cname,
            "clevel": self.clevel,
            "shuffle": self.shuffle,
            "blocksize": self.blocksize,
        }
        if self.typesize is not None:
            config["typesize"] = self.typesize
        return config

    def decode(self, data: bytes, limit: int) -> bytes:
        return blosc_decompress(data, limit)

    def encode(self, data: bytes) -> bytes:
        from numcodecs import Blosc  # lazily, as limits.py does: a costly import

        codec = Blosc(
            cname=self.cname,
            clevel=self.clevel,
            shuffle=_BLOSC_SHUFFLES.index(self.shuffle),
            blocksize=self.blocksize,
            typesize=min(self.typesize or 1, 255),
        )
        return bytes(codec.encode(data))


@dataclass(frozen=True)
class Crc32cCodec(BytesBytesCodec):
    """CRC-32C (Castagnoli) of the data, appended as a little-endian uint32."""

    name = "crc32c"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: ArraySpec) -> Crc32cCodec:
        check_keys(config, "crc32c", set(), set())
        return cls()

    def configuration(self) -> dict[str, Any]:
        return {}

    def decode(self, data: bytes, limit: int) -> bytes:
        if len(data) < 4:
            raise CodecError("crc32c data is shorter than its 4-byte checksum", rule="checksum")
        body, stored = data[:-4], int.from_bytes(data[-4:], "little")
        if len(body) > limit:
            raise CodecError(
                f"crc32c payload is {len(body)} bytes, more than the {limit} the "
                "next codec can take",
                rule="decoded-size",
            )
        actual = int(google_crc32c.value(body))
        if actual != stored:
            raise CodecError(
                f"crc32c checksum mismatch: stored {stored:#010x}, data has {actual:#010x}",
                rule="checksum",
            )
        return body

    def encode(self, data: bytes) -> bytes:
        return data + int(google_crc32c.value(data)).to_bytes(4, "little")

    def max_encoded_size(self, size: int) -> int:
        return size + 4

    def encoded_size(self, size: int) -> int | None:
        return size + 4


_CODECS: dict[str, type[Codec]] = {
    c.name: c
    for c in (
        TransposeCodec,
        BytesCodec,
        VlenUtf8Codec,
        VlenBytesCodec,
        GzipCodec,
        ZstdCodec,
        BloscCodec,
        Crc32cCodec,
    )
}


def codec_class(name: str) -> type[Codec] | None:
    """The implementation of codec ``name``, or None if n5fs does not know it."""
    if name == "sharding_indexed":
        from n5fs.codecs.sharding import ShardingCodec  # here: sharding imports this module

        return ShardingCodec
    return _CODECS.get(name)


# --------------------------------------------------------------------------- the chain


@dataclass(frozen=True)
class CodecChain:
    """A parsed ``codecs`` list bound to the decoded representation ``spec`` of one chunk.

    ``specs[i]`` is what ``array_array[i]`` receives; ``specs[-1]`` what ``array_bytes``
    receives. Unknown codecs marked ``must_understand: false`` are skipped (the spec lets
    an implementation ignore them) but kept in ``to_json()``.
    """

    spec: ArraySpec
    array_array: tuple[ArrayArrayCodec, ...]
    array_bytes: ArrayBytesCodec
    bytes_bytes: tuple[BytesBytesCodec, ...]
    specs: tuple[ArraySpec, ...]
    normalized: tuple[Any, ...] = field(compare=False)

    @classmethod
    def parse(cls, value: Any, spec: ArraySpec, what: str = "codecs") -> CodecChain:
        if not isinstance(value, list) or not value:
            raise bad_config(
                f"{what} must be a non-empty list (it needs an array -> bytes codec)", "codec-order"
            )
        aa: list[ArrayArrayCodec] = []
        ab: list[ArrayBytesCodec] = []
        bb: list[BytesBytesCodec] = []
        specs, normalized = [spec], []
        for i, item in enumerate(value):
            ext = parse_extension(item, f"{what}[{i}]")
            impl = codec_class(ext.name)
            if impl is None:
                if ext.must_understand:
                    raise CodecError(
                        f"{what}[{i}]: unknown codec {ext.name!r} (n5fs knows "
                        f"{sorted([*_CODECS, 'sharding_indexed'])}); an unknown "
                        "codec must be marked must_understand=false to be ignored",
                        rule="unknown-codec",
                    )
                normalized.append(item)
                continue
            _check_order(impl, aa, ab, bb, f"{what}[{i}]")
            try:
                codec = impl.from_config(ext.configuration, specs[-1])
            except CodecError as exc:
                raise CodecError(f"{what}[{i}]: {exc.message}", rule=exc.rule) from exc
            normalized.append(codec.to_json())
            if isinstance(codec, ArrayArrayCodec):
                aa.append(codec)
                specs.append(codec.encoded_spec(specs[-1]))
            elif isinstance(codec, ArrayBytesCodec):
                ab.append(codec)
            else:
                assert isinstance(codec, BytesBytesCodec)
                bb.append(codec)
        if not ab:
            raise bad_config(
                f"{what} has no array -> bytes codec (e.g. bytes); the spec requires exactly one",
                "codec-order",
            )
        return cls(spec, tuple(aa), ab[0], tuple(bb), tuple(specs), tuple(normalized))

    def to_json(self) -> list[Any]:
        return list(self.normalized)

    def summary(self) -> str:
        return ", ".join(
            c.summary() for c in (*self.array_array, self.array_bytes, *self.bytes_bytes)
        )

    def _limits(self) -> list[int]:
        """``limits[k]``: the most ``bytes_bytes[k]`` may decode to."""
        limits = [self.array_bytes.max_encoded_size(self.specs[-1])]
        for codec in self.bytes_bytes:
            limits.append(codec.max_encoded_size(limits[-1]))
        return limits

    def _to_array_bytes(self, data: bytes) -> bytes:
        for codec, limit in zip(
            reversed(self.bytes_bytes), reversed(self._limits()[:-1]), strict=True
        ):
            data = codec.decode(data, limit)
        return data

    def decode(self, data: bytes) -> np.ndarray[Any, Any]:
        """The chunk's values, shaped ``spec.shape``; CodecError on any bad byte."""
        array = self.array_bytes.decode(self._to_array_bytes(bytes(data)), self.specs[-1])
        for codec in reversed(self.array_array):
            array = codec.decode(array)
        return array

    def validate(self, data: bytes) -> None:
        """Like decode, but a shard is checked inner chunk by inner chunk."""
        self.array_bytes.validate(self._to_array_bytes(bytes(data)), self.specs[-1])

    def encode(self, array: np.ndarray[Any, Any]) -> bytes:
        values = np.asarray(array, dtype=self.spec.dtype)
        if values.shape != self.spec.shape:
            raise CodecError(
                f"cannot encode shape {values.shape} as a chunk of shape {self.spec.shape}",
                rule="chunk-shape",
            )
        for codec in self.array_array:
            values = codec.encode(values)
        data = self.array_bytes.encode(values, self.specs[-1])
        for bcodec in self.bytes_bytes:
            data = bcodec.encode(data)
        return data

    def max_encoded_size(self) -> int:
        return self._limits()[-1]

    def encoded_size(self) -> int | None:
        """The exact encoded size if no codec's output depends on the values, else None."""
        size = self.array_bytes.encoded_size(self.specs[-1])
        for codec in self.bytes_bytes:
            size = None if size is None else codec.encoded_size(size)
        return size


def _check_order(
    impl: type[Codec],
    aa: list[ArrayArrayCodec],
    ab: list[ArrayBytesCodec],
    bb: list[BytesBytesCodec],
    where: str,
) -> None:
    """Spec: zero or more array->array, exactly one array->bytes, zero or more bytes->bytes."""
    if impl.kind is CodecKind.ARRAY_BYTES and ab:
        raise bad_config(
            f"{where}: second array -> bytes codec {impl.name!r} (after "
            f"{ab[0].name!r}); the spec allows exactly one",
            "codec-order",
        )
    if impl.kind is CodecKind.ARRAY_ARRAY and (ab or bb):
        raise bad_config(
            f"{where}: array -> array codec {impl.name!r} after the array -> bytes codec",
            "codec-order",
        )
    if impl.kind is CodecKind.BYTES_BYTES and not ab:
        raise bad_config(
            f"{where}: bytes -> bytes codec {impl.name!r} before any array -> bytes codec",
            "codec-order",
        )
