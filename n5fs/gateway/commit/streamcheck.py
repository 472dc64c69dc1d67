"""Streaming chunk checks: a chunk's bytes fed piece by piece to the decoders its format
names, the decoded output counted and dropped (at most :data:`OUTPUT_PIECE` at a time), and a
verdict that is only ever *accept* or *not sure*.

Why: :meth:`~n5fs.formats.base.ArrayNode.validate_chunk` decodes a chunk whole and keeps the
decoded copy; that costs more than the decode itself (a bounded one-shot inflate with
``max_length`` is slower than a streaming one, and every fresh multi-MiB buffer pays its page
faults), and it cannot start before the last byte is there. A streaming check
can run while a chunk is written (:mod:`n5fs.gateway.commit.prevalidate`) or on a whole stored
chunk (:func:`passes`).

Soundness is the rule: a check accepts only what ``validate_chunk`` accepts - header, its fit
at the position (the array's own rule), one compressed stream that ends exactly at the end of
the bytes and decodes to exactly the expected size. Anything unusual but legal (concatenated
gzip members, padding after a stream), any flaw and any codec not mirrored here make it
:class:`Unsure`, and the full check decides and words the refusal as it always did.

Formats handled: N5 with raw, gzip (both framings), bzip2 and xz; Zarr v2 without filters,
uncompressed or with zlib, gzip, bz2 or lzma (xz/alone). Everything else (blosc, zstd, lz4,
filters, object arrays, hdmf-zarr, Zarr v3) goes to the full check: blosc and lz4 frames
cannot be decoded piece by piece, and zstandard's streaming decoder cannot bound the output
of one call. Nothing here holds state between calls or takes a lock.
"""

from __future__ import annotations

import bz2
import logging
import lzma
import zlib
from typing import TYPE_CHECKING, Protocol

from n5fs.codecs.limits import STREAM_ERRORS, CodecError, inflater
from n5fs.codecs.n5_compression import (
    Bzip2Compression,
    GzipCompression,
    N5Compression,
    RawCompression,
    XzCompression,
)
from n5fs.codecs.n5_header import BlockHeader, decode_header
from n5fs.formats.n5 import N5ArrayNode
from n5fs.formats.zarr2 import Zarr2ArrayNode

if TYPE_CHECKING:
    from n5fs.formats.base import ArrayNode

log = logging.getLogger(__name__)

Buffer = bytes | memoryview
#: decoded output is produced (and dropped) at most this much at a time
OUTPUT_PIECE = 256 << 10
#: a decoder is fed at most this much input at a time. Why: zlib copies the input its output
#: limit leaves over into ``unconsumed_tail`` at every call, so a 1 MiB write fed whole was
#: copied ~25 times over (~13 MiB of copying per MiB); fed in 64 KiB slices that decode to
#: less than OUTPUT_PIECE, a slice is one call and nothing is left over (faster on the
#: benchmark's gzip N5 blocks than feeding the writer's 1 MiB pieces whole)
FEED_PIECE = 64 << 10


class Unsure(Exception):
    """The check cannot vouch for the chunk: the full check decides."""


# == payload decoders ================================================================================


class _Decoder(Protocol):
    """What zlib's decompress objects, ``bz2.BZ2Decompressor`` and ``lzma.LZMADecompressor``
    have in common."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: Buffer, max_length: int = ..., /) -> bytes: ...


class _Payload(Protocol):
    def feed(self, data: Buffer) -> None:
        """Take the next compressed bytes; raise Unsure at the first doubt."""

    def complete(self) -> bool:
        """Everything fed is one stream that decoded to exactly the expected size."""


class _Raw:
    """N5 raw: the payload is the values; only its length matters."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.total = 0

    def feed(self, data: Buffer) -> None:
        self.total += len(data)
        if self.total > self.expected:
            raise Unsure

    def complete(self) -> bool:
        return self.total == self.expected


class _Stream:
    """One zlib/gzip, bzip2 or xz stream, decoded as it arrives, output counted and dropped.
    ``tail``: zlib keeps the input its output limit left over in ``unconsumed_tail``; bz2
    and lzma buffer it themselves and say ``needs_input``."""

    def __init__(self, decoder: _Decoder, expected: int, *, tail: bool) -> None:
        self.decoder = decoder
        self.expected = expected
        self.tail = tail
        self.total = 0
        self.ended = False

    def feed(self, data: Buffer) -> None:
        view = memoryview(data)
        for start in range(0, len(view), FEED_PIECE):
            self._feed(view[start : start + FEED_PIECE])

    def _feed(self, data: Buffer) -> None:
        if self.ended:
            raise Unsure  # bytes after the stream: trailing data, or another gzip member
        try:
            self._decode(data)
        except STREAM_ERRORS as exc:
            raise Unsure from exc
        if self.decoder.eof:
            self.ended = True
            if self.decoder.unused_data:
                raise Unsure

    def _decode(self, data: Buffer) -> None:
        dec = self.decoder
        while True:
            out = dec.decompress(data, OUTPUT_PIECE)
            self.total += len(out)
            if self.total > self.expected:
                raise Unsure  # more than the header allows: the full check refuses the bomb
            if dec.eof:
                return
            if self.tail:
                data = getattr(dec, "unconsumed_tail", b"")
                if not data and len(out) < OUTPUT_PIECE:
                    return
            else:
                data = b""
                if getattr(dec, "needs_input", True):
                    return

    def complete(self) -> bool:
        return self.ended and self.total == self.expected


def _payload(compression: N5Compression, expected: int) -> _Payload | None:
    """A streaming decoder that accepts exactly what ``compression.decode(., expected)``
    followed by the size check accepts in its plain case; None for codecs not handled."""
    if type(compression) is RawCompression:
        return _Raw(expected)
    if type(compression) is GzipCompression:
        wbits = zlib.MAX_WBITS if compression.use_zlib else 16 + zlib.MAX_WBITS
        return _Stream(inflater(wbits), expected, tail=True)
    if type(compression) is Bzip2Compression:
        return _Stream(bz2.BZ2Decompressor(), expected, tail=False)
    if type(compression) is XzCompression:
        return _Stream(lzma.LZMADecompressor(format=lzma.FORMAT_XZ), expected, tail=False)
    return None


def _zarr2_payload(array: Zarr2ArrayNode) -> _Payload | None:
    """A streaming decoder accepting exactly what a Zarr v2 array without filters accepts
    in its plain case (``V2Pipeline.decode``: the compressor's bounded decode, then exactly
    ``chunk_nbytes``; no compressor: exactly that many bytes)."""
    pipeline = array.meta.pipeline
    if pipeline.is_object or pipeline.filters:
        return None
    expected = array.chunk_nbytes
    codec = pipeline.compressor
    if codec is None:
        return _Raw(expected)
    kind = codec.codec_id
    if kind in ("zlib", "gzip"):
        wbits = zlib.MAX_WBITS if kind == "zlib" else 16 + zlib.MAX_WBITS
        return _Stream(inflater(wbits), expected, tail=True)
    if kind == "bz2":
        return _Stream(bz2.BZ2Decompressor(), expected, tail=False)
    if kind == "lzma" and codec.format in (lzma.FORMAT_XZ, lzma.FORMAT_ALONE):
        return _Stream(lzma.LZMADecompressor(format=codec.format), expected, tail=False)
    return None


class _Whole:
    """A chunk that is one compressed stream (Zarr v2): no header."""

    def __init__(self, payload: _Payload) -> None:
        self.payload = payload

    def feed(self, data: Buffer) -> None:
        self.payload.feed(data)

    def complete(self) -> bool:
        return self.payload.complete()


class ChunkParser(Protocol):
    """One chunk checked as its bytes come: feed them in order, then ask."""

    def feed(self, data: Buffer) -> None:
        """Take the next bytes; raise :class:`Unsure` at the first doubt."""

    def complete(self) -> bool:
        """Everything fed makes a chunk the full check accepts."""


def parser_for(array: ArrayNode | None, position: tuple[int, ...]) -> ChunkParser | None:
    """How to check a chunk of ``array`` as it arrives; None when the full check must.
    Exact types: a subclass (hdmf-zarr) may validate differently from what is mirrored here."""
    if type(array) is N5ArrayNode:
        if _payload(array.compression, 0) is None:
            return None
        return _N5Chunk(array, position)
    if type(array) is Zarr2ArrayNode:
        payload = _zarr2_payload(array)
        return None if payload is None else _Whole(payload)
    return None


def handled(array: ArrayNode) -> bool:
    """Can chunks of ``array`` be checked while they arrive?"""
    return parser_for(array, ()) is not None


# == one N5 chunk =====================================================================================


class _N5Chunk:
    """An N5 block: header first (its dims decide the payload's size), then the payload."""

    def __init__(self, array: N5ArrayNode, position: tuple[int, ...]) -> None:
        self.array = array
        self.position = position
        self.head = bytearray()
        self.payload: _Payload | None = None

    def feed(self, data: Buffer) -> None:
        """The header's bytes are kept until it is whole, and no more: the payload goes to its
        decoder as the slices it came in (copying a writer's first 1 MiB piece twice into
        the header's buffer cost a tenth of a gzip block's check)."""
        if self.payload is not None:
            self.payload.feed(data)
            return
        view = memoryview(data).cast("B")
        while len(view):
            take = self._missing()
            self.head += view[:take]
            view = view[take:]
            header = self._header()
            if header is not None:
                self.head = bytearray()
                self.payload = payload = self._payload_after(header)
                if len(view):
                    payload.feed(view)
                return

    def _payload_after(self, header: BlockHeader) -> _Payload:
        try:
            # the array's own rule for a header at this position (dims, varlength cap)
            expected = self.array._expected_bytes(header, self.position)
        except CodecError as exc:
            raise Unsure from exc
        payload = _payload(self.array.compression, expected)
        if payload is None:
            raise Unsure
        return payload

    def _missing(self) -> int:
        """Header bytes still to come (at least one while it is not whole): the 4 of mode
        and number of dimensions first, then as many as those say."""
        have = len(self.head)
        return 4 - have if have < 4 else _header_size(self.head) - have

    def _header(self) -> BlockHeader | None:
        """The header once all its bytes are here (None before)."""
        head = self.head
        if len(head) < 4:
            return None
        needed = _header_size(head)
        if len(head) < needed:
            return None
        try:
            return decode_header(bytes(head[:needed]))
        except CodecError as exc:
            raise Unsure from exc

    def complete(self) -> bool:
        return self.payload is not None and self.payload.complete()


def _header_size(head: bytearray) -> int:
    """The size of the N5 block header that starts with the 4 bytes ``head`` starts with."""
    ndim = int.from_bytes(head[2:4], "big")
    return 4 + 4 * ndim + (4 if head[:2] == b"\x00\x01" else 0)


def passes(array: ArrayNode | None, position: tuple[int, ...] | None, data: bytes) -> bool:
    """Do the streaming decoders accept the whole chunk ``data`` at ``position``? True only
    where :meth:`~n5fs.formats.base.ArrayNode.validate_chunk` accepts it too, and at less
    cost (no decoded copy is kept); False says nothing: the full check then decides."""
    if position is None or array is None or not array.in_grid(position):
        return False
    parser = parser_for(array, position)
    if parser is None:
        return False
    view = memoryview(data)
    try:
        for offset in range(0, len(data), FEED_PIECE):
            parser.feed(view[offset : offset + FEED_PIECE])
    except Unsure:
        return False
    except Exception:  # a bug must not fail a commit the full check would decide
        log.exception("chunk check failed; the full check decides")
        return False
    return parser.complete()
