"""Bounded decompression: a decode never produces more than the metadata promises.

A decompression bomb (a few KiB that inflate to GiB) is refused as soon as the output would
pass the limit, without ever holding more than ``limit + 1`` bytes.

Every deflate decode (here and in the streaming checks) goes through :func:`inflater`: ISA-L's
(the ``isal`` package, a dependency) when it imports, else zlib's. Why: a validated ``cp -r``
of gzip chunks is bound by one stream's inflate (a chunk's check ends before its ``close()``
returns and ``cp`` writes one file at a time). Fed in 64 KiB slices, ISA-L (SIMD Huffman
decoding) inflates more input per second of a thread's CPU than zlib and than zlib-ng (the
previous choice), on blocks Python's zlib wrote and on those TensorStore writes alike (the
figures are in ``docs/performance.md``). ISA-L checks the same headers,
checksums and lengths as zlib (``tests/unit/test_inflate.py`` holds them to zlib's verdicts),
keeps the input an output limit left over in ``unconsumed_tail``, and releases the GIL per
call.
Encoding stays on :mod:`zlib`, whose output other tools' tests expect.
"""

from __future__ import annotations

import abc
import bz2
import lzma
import threading
import zlib
from typing import TYPE_CHECKING, Protocol, cast

from n5fs.errors import Rejected

if TYPE_CHECKING:
    from types import ModuleType

    import zstandard


def _fastest_inflate() -> tuple[ModuleType, str]:
    """The fastest zlib-compatible module that imports, and its name for logs."""
    try:
        import isal
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - zlib is as strict, only slower
        return zlib, f"zlib {zlib.ZLIB_RUNTIME_VERSION}"
    return isal_zlib, f"ISA-L (isal {isal.__version__})"


#: the inflate library decodes run on (``INFLATE`` names it for logs and ``n5fs --version``)
_inflate_module, INFLATE = _fastest_inflate()
#: what decoding a corrupt zlib/gzip, bzip2 or xz stream raises (through any inflater)
STREAM_ERRORS: tuple[type[Exception], ...] = (
    zlib.error,
    _inflate_module.error,
    OSError,
    EOFError,
    lzma.LZMAError,
    ValueError,
)


class CodecError(Rejected):
    """Bytes that a codec cannot decode, or that decode to the wrong size."""


class BoundedDecoder(abc.ABC):
    """The one decode protocol of every bytes-to-bytes codec (N5 compressions, Zarr v3
    bytes-to-bytes codecs): ``decode`` never returns, nor holds, more than ``limit`` bytes
    (raising :func:`too_large` instead), so a decompression bomb is refused uninflated."""

    @abc.abstractmethod
    def encode(self, data: bytes) -> bytes:
        """The encoded form of ``data``."""

    @abc.abstractmethod
    def decode(self, data: bytes, limit: int) -> bytes:
        """``data`` decoded; CodecError when corrupt or when it would exceed ``limit``."""


class _Decompressor(Protocol):
    def decompress(self, data: bytes, max_length: int = ...) -> bytes: ...


class Inflater(Protocol):
    """A zlib decompress object (zlib's or ISA-L's: the same protocol)."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    @property
    def unconsumed_tail(self) -> bytes: ...

    def decompress(self, data: bytes | memoryview, max_length: int = ..., /) -> bytes: ...


def inflater(wbits: int = zlib.MAX_WBITS) -> Inflater:
    """A fresh deflate decoder (``wbits`` as in :func:`zlib.decompressobj`) from the fastest
    library installed."""
    return cast("Inflater", _inflate_module.decompressobj(wbits))


def too_large(limit: int, what: str) -> CodecError:
    return CodecError(
        f"{what} decodes to more than the {limit} bytes the metadata allows "
        "(refused without inflating: possible decompression bomb)",
        rule="decoded-size",
    )


def _bounded(dec: _Decompressor, data: bytes, limit: int, what: str) -> tuple[bytes, bytes]:
    """Run ``dec`` to at most ``limit`` bytes; return (output, unused input)."""
    try:
        out = dec.decompress(data, limit + 1)
    except STREAM_ERRORS as exc:
        raise CodecError(f"{what} stream is corrupt: {exc}", rule="undecodable") from exc
    if len(out) > limit:
        raise too_large(limit, what)
    if not getattr(dec, "eof", True):
        # Either the stream is truncated, or more output waits beyond the limit.
        more = getattr(dec, "needs_input", None)
        if more is False or getattr(dec, "unconsumed_tail", None):
            raise too_large(limit, what)
        raise CodecError(f"{what} stream is truncated", rule="undecodable")
    unused = getattr(dec, "unused_data", b"")
    return out, unused


def zlib_decompress(
    data: bytes, limit: int, *, wbits: int = zlib.MAX_WBITS, what: str = "zlib"
) -> bytes:
    """Decode one zlib/gzip/raw-deflate stream (``wbits`` as in :mod:`zlib`); no trailing data."""
    out, unused = _bounded(inflater(wbits), data, limit, what)
    if unused:
        raise CodecError(f"{what} stream has {len(unused)} trailing bytes", rule="trailing-data")
    return out


def gzip_decompress(data: bytes, limit: int, what: str = "gzip") -> bytes:
    """Decode gzip members (concatenated members allowed, as gzip(1) writes them)."""
    out = bytearray()
    rest = data
    while True:
        part, rest = _bounded(inflater(16 + zlib.MAX_WBITS), rest, limit - len(out), what)
        out += part
        if not rest.strip(b"\x00"):
            return bytes(out)


def bz2_decompress(data: bytes, limit: int, what: str = "bzip2") -> bytes:
    out, unused = _bounded(bz2.BZ2Decompressor(), data, limit, what)
    if unused:
        raise CodecError(f"{what} stream has {len(unused)} trailing bytes", rule="trailing-data")
    return out


def lzma_decompress(
    data: bytes, limit: int, what: str = "xz", fmt: int = lzma.FORMAT_AUTO
) -> bytes:
    out, unused = _bounded(lzma.LZMADecompressor(format=fmt), data, limit, what)
    if unused:
        raise CodecError(f"{what} stream has {len(unused)} trailing bytes", rule="trailing-data")
    return out


def check_size(actual: int, expected: int, what: str) -> None:
    """Refuse a decoded buffer whose size differs from what the metadata promises."""
    if actual != expected:
        raise CodecError(
            f"{what} decodes to {actual} bytes, the metadata requires exactly {expected}",
            rule="decoded-size",
        )


_BLOSC_HEADER = 16
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def blosc_decompress(data: bytes, limit: int, what: str = "blosc") -> bytes:
    """Decode one blosc(1) frame; its header states both sizes, so check before decoding."""
    from numcodecs import Blosc

    if len(data) < _BLOSC_HEADER:
        raise CodecError(f"{what} frame shorter than its 16-byte header", rule="undecodable")
    nbytes = int.from_bytes(data[4:8], "little")
    cbytes = int.from_bytes(data[12:16], "little")
    if nbytes > limit:
        raise too_large(limit, what)
    if cbytes != len(data):
        raise CodecError(
            f"{what} header says {cbytes} compressed bytes, the chunk holds {len(data)}",
            rule="trailing-data" if cbytes < len(data) else "undecodable",
        )
    try:
        return bytes(Blosc().decode(data))
    except (RuntimeError, ValueError) as exc:
        raise CodecError(f"{what} frame is corrupt: {exc}", rule="undecodable") from exc


def _zstd_frame_end(data: bytes, what: str) -> int:
    """Where the first zstd frame ends, from its block headers (no decoding).

    Each block starts with 3 bytes: last-block bit, type (raw, RLE, compressed) and size;
    an RLE block carries one byte, the others ``size`` bytes; a checksum may follow.
    """
    import zstandard

    try:
        pos = zstandard.frame_header_size(data)
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what} frame header is corrupt: {exc}", rule="undecodable") from exc
    has_checksum = bool(data[4] & 0x04)
    while True:
        if pos + 3 > len(data):
            raise CodecError(f"{what} frame is truncated", rule="undecodable")
        header = int.from_bytes(data[pos : pos + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        pos += 3 + (1 if kind == 1 else size)
        if kind == 3:
            raise CodecError(f"{what} frame has a reserved block type", rule="undecodable")
        if last:
            return pos + (4 if has_checksum else 0)


class _ZstdDecoders(threading.local):
    """One ``zstandard.ZstdDecompressor`` per thread: building one per chunk cost several
    times the decode of a small chunk (16x16 uint16), and one object may not be used
    by two threads at once (python-zstandard's rule). Each ``decompress`` call resets the
    decoder's session, so a corrupt or refused frame leaves nothing behind for the next."""

    decompressor: zstandard.ZstdDecompressor | None = None

    def get(self) -> zstandard.ZstdDecompressor:
        if self.decompressor is None:
            import zstandard

            self.decompressor = zstandard.ZstdDecompressor()
        return self.decompressor


_ZSTD = _ZstdDecoders()


def zstd_decompress(data: bytes, limit: int, what: str = "zstd") -> bytes:
    """Decode exactly one zstd frame (with or without a content size), at most ``limit``.

    A stated content size over the limit is refused before any work; an unstated one (Java's
    streaming writers) is bounded by the output buffer. Bytes after the frame are refused.
    """
    import zstandard

    if not data.startswith(_ZSTD_MAGIC):
        raise CodecError(
            f"{what} data does not start with the zstd frame magic", rule="undecodable"
        )
    end = _zstd_frame_end(data, what)
    if end > len(data):
        raise CodecError(f"{what} frame is truncated", rule="undecodable")
    if end < len(data):
        raise CodecError(
            f"{what} data has {len(data) - end} bytes after its frame", rule="trailing-data"
        )
    try:
        size = zstandard.get_frame_parameters(data).content_size
        if size != zstandard.CONTENTSIZE_UNKNOWN and size > limit:
            raise too_large(limit, what)
        return _ZSTD.get().decompress(data, max_output_size=limit)
    except zstandard.ZstdError as exc:
        if "did not decompress full frame" in str(exc) or "Destination buffer" in str(exc):
            # Either truncated, or the output would pass the limit: both refused.
            raise CodecError(
                f"{what} frame is truncated or decodes past {limit} bytes", rule="decoded-size"
            ) from exc
        raise CodecError(f"{what} stream is corrupt: {exc}", rule="undecodable") from exc
