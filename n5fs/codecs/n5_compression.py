"""The N5 ``compression`` object of ``attributes.json`` -> an encoder and a bounded decoder.

The N5 spec (saalfeldlab/n5 README) defines ``raw``, ``gzip`` (``level``; ``useZlib`` in N5
Java and TensorStore), ``bzip2`` (``blockSize``), ``xz`` (``preset``) and ``lz4``
(``blockSize``); the N5 Java plugins add ``blosc`` (n5-blosc) and ``zstd`` (n5-zstandard),
which TensorStore also writes. A member is one of the class's ``@CompressionParameter``
fields. N5 Java builds the class with its no-argument constructor and overwrites only the
members present, so it opens any subset; TensorStore, whose spec ``n5fs detect`` hands out,
does not. The rule: a member is *required* when N5 Java or TensorStore cannot open the
document without it; otherwise an absent member takes N5 Java's default. Decoding never
depends on a defaulted member (gzip, bzip2, xz, zstd and blosc payloads describe themselves).

======  ==================  ========  ==========  =============================================
type    member              required  default     why
======  ==================  ========  ==========  =============================================
raw     (none)
gzip    ``level``           no        -1          N5 Java <= 3 and TensorStore default it (N5
                                                  Java 4 writes 6); z5 always writes it
gzip    ``useZlib``         no        false       N5 Java and TensorStore default false; z5 never
                                                  writes it; true means a zlib, not gzip, stream
bzip2   ``blockSize``       no        9           N5 Java and TensorStore default 9
xz      ``preset``          no        6           N5 Java and TensorStore default 6
lz4     ``blockSize``       no        65536       a writer hint: lz4-java's reader ignores it;
                                                  z5 writes its level there (6, or 0, -3... as
                                                  given); any Java int (Gson refuses more)
blosc   ``cname``           **yes**   -           TensorStore, z5 and zarr-python 2 refuse the
                                                  document without it; N5 Java would silently
                                                  take blosclz, a codec nobody named
blosc   ``clevel``          **yes**   -           likewise (N5 Java would take 6)
blosc   ``shuffle``         **yes**   -           likewise (N5 Java would take 0, no shuffle)
blosc   ``blocksize``       no        0 (auto)    N5 Java, TensorStore and z5 default 0
blosc   ``typesize``        no        item size   n5-blosc >= 2024 writes it; absent, we shuffle
                                                  by the dataset's element size when encoding
blosc   ``nthreads``        no        1           a runtime hint (n5-blosc, z5 write it)
zstd    ``level``           no        3           n5-zstandard's default (TensorStore: 0, which
                                                  zstd reads as 3)
zstd    Java extras         no        ignored     ``nbWorkers``, ``windowLog``... change how a
                                                  frame is made, never how it decodes; a
                                                  non-null ``dict`` is refused (we hold none)
======  ==================  ========  ==========  =============================================

Unknown members are ignored, as N5 Java's reader ignores them. A present member of the
wrong JSON type or out of range is refused: it names a codec N5 Java would not build.

Framing of ``lz4`` chunks is detected per chunk (:func:`.lz4_block.decode_n5`): lz4-java's
``LZ4Block`` stream (N5 Java) or one bare LZ4 block (z5). We write N5 Java's framing.

Every ``decode`` is bounded by ``limit`` (:class:`~n5fs.codecs.limits.BoundedDecoder`): a
decompression bomb is refused, never inflated.
"""

from __future__ import annotations

import bz2
import lzma
import reprlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import zstandard

from n5fs.codecs import limits, lz4_block
from n5fs.codecs.limits import BoundedDecoder, CodecError

BLOSC_CNAMES = ("blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd")
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel = 3


def short_repr(value: object) -> str:
    """``repr`` cut to a few dozen characters: error messages quote untrusted JSON."""
    return _SHORT.repr(value)


_ZSTD_MIN_LEVEL = -(1 << 17)
_ZSTD_MAX_LEVEL = 22
#: the range Gson reads into a Java ``int`` member
_JAVA_INT_MIN, _JAVA_INT_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True)
class _Param:
    """One declared member: its JSON name, type, default and allowed values; a ``required``
    member has no default (see the table in the module docs)."""

    name: str
    kind: type
    default: Any
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    required: bool = False


@dataclass(frozen=True)
class N5Compression(BoundedDecoder):
    """A parsed, validated N5 compression; equal objects encode and decode alike.

    ``encode`` writes what N5 Java would write; ``decode`` never passes ``limit``."""

    type: ClassVar[str]
    #: declared parameters, in the order dataclass fields are declared
    params: ClassVar[tuple[_Param, ...]] = ()

    def canonical(self) -> dict[str, Any]:
        """``type`` plus every declared parameter (defaults filled in); extras dropped."""
        return {"type": self.type, **{p.name: getattr(self, _attr(p)) for p in self.params}}

    def summary(self) -> str:
        """Short human form, e.g. ``gzip(level=-1)``; false booleans are left out."""
        parts = [
            f"{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in self.canonical().items()
            if k != "type" and v is not False
        ]
        return f"{self.type}({', '.join(parts)})" if parts else self.type


def _attr(param: _Param) -> str:
    """JSON camelCase name -> dataclass field name (``useZlib`` -> ``use_zlib``)."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in param.name)


@dataclass(frozen=True)
class RawCompression(N5Compression):
    type: ClassVar[str] = "raw"

    def encode(self, data: bytes) -> bytes:
        return bytes(data)

    def decode(self, data: bytes, limit: int) -> bytes:
        if len(data) > limit:
            raise CodecError(
                f"raw payload holds {len(data)} bytes, {len(data) - limit} more than the "
                f"{limit} the block header allows",
                rule="trailing-data",
            )
        return bytes(data)


@dataclass(frozen=True)
class GzipCompression(N5Compression):
    type: ClassVar[str] = "gzip"
    params: ClassVar[tuple[_Param, ...]] = (
        _Param("level", int, -1, -1, 9),
        _Param("useZlib", bool, False),
    )
    level: int = -1
    use_zlib: bool = False

    def encode(self, data: bytes) -> bytes:
        wbits = zlib.MAX_WBITS if self.use_zlib else 16 + zlib.MAX_WBITS
        comp = zlib.compressobj(self.level, zlib.DEFLATED, wbits)
        return comp.compress(data) + comp.flush()

    def decode(self, data: bytes, limit: int) -> bytes:
        if self.use_zlib:
            return limits.zlib_decompress(data, limit, what="gzip (useZlib)")
        return limits.gzip_decompress(data, limit)


@dataclass(frozen=True)
class Bzip2Compression(N5Compression):
    type: ClassVar[str] = "bzip2"
    params: ClassVar[tuple[_Param, ...]] = (_Param("blockSize", int, 9, 1, 9),)
    block_size: int = 9

    def encode(self, data: bytes) -> bytes:
        return bz2.compress(data, self.block_size)

    def decode(self, data: bytes, limit: int) -> bytes:
        return limits.bz2_decompress(data, limit)


@dataclass(frozen=True)
class XzCompression(N5Compression):
    type: ClassVar[str] = "xz"
    params: ClassVar[tuple[_Param, ...]] = (_Param("preset", int, 6, 0, 9),)
    preset: int = 6

    def encode(self, data: bytes) -> bytes:
        return lzma.compress(data, format=lzma.FORMAT_XZ, preset=self.preset)

    def decode(self, data: bytes, limit: int) -> bytes:
        return limits.lzma_decompress(data, limit, fmt=lzma.FORMAT_XZ)


@dataclass(frozen=True)
class BloscCompression(N5Compression):
    """n5-blosc. ``cname``, ``clevel`` and ``shuffle`` are required (module docs); the
    field defaults are n5-blosc's no-argument constructor's, for building one in code."""

    type: ClassVar[str] = "blosc"
    params: ClassVar[tuple[_Param, ...]] = (
        _Param("cname", str, "blosclz", choices=BLOSC_CNAMES, required=True),
        _Param("clevel", int, 6, 0, 9, required=True),
        _Param("shuffle", int, 0, -1, 2, required=True),
        _Param("blocksize", int, 0, 0, _JAVA_INT_MAX),
    )
    cname: str = "blosclz"
    clevel: int = 6
    shuffle: int = 0
    blocksize: int = 0
    #: element size for shuffling (n5-blosc's ``typesize``, else the dataset's)
    typesize: int = field(default=1, compare=False)

    def encode(self, data: bytes) -> bytes:
        from numcodecs import blosc  # late: importing numcodecs is slow; only blosc pays it

        try:
            return bytes(
                blosc.compress(
                    data,
                    self.cname.encode(),
                    self.clevel,
                    self.shuffle,
                    self.blocksize,
                    self.typesize,
                )
            )
        except (RuntimeError, ValueError) as exc:
            raise CodecError(
                f"blosc cannot encode with cname {self.cname!r}: {exc}", rule="compression"
            ) from exc

    def decode(self, data: bytes, limit: int) -> bytes:
        return limits.blosc_decompress(data, limit)


@dataclass(frozen=True)
class ZstdCompression(N5Compression):
    """n5-zstandard (default level 3) and TensorStore's ``zstd``."""

    type: ClassVar[str] = "zstd"
    params: ClassVar[tuple[_Param, ...]] = (
        _Param("level", int, 3, _ZSTD_MIN_LEVEL, _ZSTD_MAX_LEVEL),
    )
    level: int = 3

    def encode(self, data: bytes) -> bytes:
        return zstandard.ZstdCompressor(level=self.level).compress(data)

    def decode(self, data: bytes, limit: int) -> bytes:
        return limits.zstd_decompress(data, limit)


@dataclass(frozen=True)
class Lz4Compression(N5Compression):
    """N5's ``lz4``: N5 Java writes lz4-java's LZ4Block stream, z5 one bare LZ4 block
    (:mod:`.lz4_block`); decoding tells them apart per chunk, encoding writes N5 Java's.

    ``blockSize`` only tells lz4-java's *writer* how to cut the stream (z5 stores its
    compression level there, whatever the user gave: 6, 0, -3), so any Java int is
    accepted."""

    type: ClassVar[str] = "lz4"
    params: ClassVar[tuple[_Param, ...]] = (
        _Param("blockSize", int, lz4_block.DEFAULT_BLOCK_SIZE, _JAVA_INT_MIN, _JAVA_INT_MAX),
    )
    block_size: int = lz4_block.DEFAULT_BLOCK_SIZE

    @property
    def writer_block_size(self) -> int:
        """``blockSize`` when lz4-java's ``LZ4BlockOutputStream`` takes it (64 B .. 32 MiB),
        else its default 64 KiB (a z5 level such as 6 would make 64-byte blocks)."""
        if lz4_block.MIN_BLOCK_SIZE <= self.block_size <= lz4_block.MAX_BLOCK_SIZE:
            return self.block_size
        return lz4_block.DEFAULT_BLOCK_SIZE

    def encode(self, data: bytes) -> bytes:
        return lz4_block.encode(data, self.writer_block_size)

    def decode(self, data: bytes, limit: int) -> bytes:
        return lz4_block.decode_n5(data, limit)


COMPRESSIONS: Mapping[str, type[N5Compression]] = {
    c.type: c
    for c in (
        RawCompression,
        GzipCompression,
        Bzip2Compression,
        XzCompression,
        BloscCompression,
        ZstdCompression,
        Lz4Compression,
    )
}
#: the names N5 version 0 allowed in ``compressionType`` (N5 Java maps them to defaults)
VERSION0_TYPES = ("raw", "gzip", "bzip2", "lz4", "xz")


def _bad(message: str) -> CodecError:
    return CodecError(message, rule="compression")


def _check_required(kind: str, params: tuple[_Param, ...], config: Mapping[str, Any]) -> None:
    missing = [p.name for p in params if p.required and p.name not in config]
    if missing:
        needed = ", ".join(repr(p.name) for p in params if p.required)
        raise _bad(
            f"N5 {kind} compression lacks {', '.join(map(repr, missing))}: it needs {needed} "
            "(TensorStore, z5 and zarr-python 2 cannot open it without them)"
        )


def _param_value(kind: str, param: _Param, config: Mapping[str, Any]) -> Any:
    """The checked value of ``param`` in ``config`` (its default when absent)."""
    value: Any = config.get(param.name, param.default)
    where = f"N5 {kind} compression parameter {param.name!r}"
    # An exact type test: bool is a subclass of int, and JSON true is no compression level.
    exact = type(value) is param.kind
    if not exact:
        raise _bad(f"{where} must be a {param.kind.__name__}, not {short_repr(value)}")
    if param.choices and value not in param.choices:
        raise _bad(f"{where} must be one of {', '.join(param.choices)}, not {short_repr(value)}")
    if param.lo is not None and param.hi is not None and not param.lo <= value <= param.hi:
        raise _bad(f"{where} must be in [{param.lo}, {param.hi}], not {value}")
    return value


def _check_extras(kind: str, config: Mapping[str, Any]) -> None:
    """Refuse the few extras that would change decoding: a zstd dictionary, a bad typesize."""
    if kind == "zstd" and config.get("dict") is not None:
        raise _bad("N5 zstd compression with a dictionary ('dict') is not supported")
    typesize = config.get("typesize")
    if (
        kind == "blosc"
        and typesize is not None
        and not (
            isinstance(typesize, int) and not isinstance(typesize, bool) and 0 <= typesize <= 255
        )
    ):
        raise _bad(
            f"N5 blosc compression parameter 'typesize' must be an int in [0, 255], "
            f"not {short_repr(typesize)}"
        )


def parse_compression(config: object, *, itemsize: int = 1) -> N5Compression:
    """Parse the ``compression`` object; ``itemsize`` is the dataset's element size (blosc
    shuffles by it unless the object states a ``typesize``)."""
    if not isinstance(config, Mapping):
        raise _bad(
            f"N5 'compression' must be a JSON object with a 'type', not {short_repr(config)}"
        )
    kind = config.get("type")
    if not isinstance(kind, str):
        raise _bad(f"N5 'compression' needs a string 'type', got {short_repr(kind)}")
    cls = COMPRESSIONS.get(kind)
    if cls is None:
        raise CodecError(
            f"unknown N5 compression type {short_repr(kind)}; known: {', '.join(COMPRESSIONS)}",
            rule="unknown-compression",
        )
    _check_required(kind, cls.params, config)
    _check_extras(kind, config)
    values = {_attr(p): _param_value(kind, p, config) for p in cls.params}
    if cls is BloscCompression:
        values["typesize"] = config.get("typesize") or itemsize
    return cls(**values)


def compression_from_type(name: object) -> N5Compression:
    """N5 version 0's ``compressionType`` string, with N5 Java's defaults for its type."""
    if name not in VERSION0_TYPES:
        raise CodecError(
            f"unknown N5 version-0 compressionType {short_repr(name)}; "
            f"known: {', '.join(VERSION0_TYPES)}",
            rule="unknown-compression",
        )
    return COMPRESSIONS[str(name)]()
