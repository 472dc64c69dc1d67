"""The codecs of the Zarr v3 core spec and zarr-python 3: one class per codec name.

Each parses its configuration against the decoded representation it will receive, so a
configuration that cannot work for this array (a transpose order of the wrong length, a
``bytes`` codec without ``endian`` for ``int32``) is refused when the metadata is written,
not when the first chunk arrives. The registry names them lazily (``registry.py``).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from n5fs.codecs.v3.base import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
from n5fs.codecs.v3.types import ArraySpec, bad_config, check_keys, is_int

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Bound on one variable-length chunk's serialized size: vlen codecs have no size in metadata.
VLEN_MAX_BYTES = 256 << 20


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
        return flat.astype(spec.dtype, copy=False).reshape(spec.shape)  # no copy: read-only

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
