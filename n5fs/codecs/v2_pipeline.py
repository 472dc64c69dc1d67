"""Zarr v2 chunk pipeline: ``filters`` then ``compressor``, built with :func:`numcodecs.get_codec`.

Decoding is bounded: the size a stage must produce is computed forward from the chunk's byte
size through every filter whose effect on size is known, so a compressor is asked for exactly
that many bytes (or refused past a cap), using the bounded decoders of
:mod:`n5fs.codecs.limits` wherever the codec has one.

Object arrays (``"|O"``) carry an object codec as their first filter. Their chunks are checked
without building Python objects from untrusted code: a ``pickle`` chunk is *never* unpickled,
only walked by :mod:`n5fs.codecs.pickle_check` (framing, and every global it names on the
allow-list, plus the extra globals a format allows: hdmf-zarr's ``ZarrReference``).

Only the exceptions a codec raises on bad input (:data:`CODEC_INPUT_ERRORS`) become a refusal
(EINVAL); anything else (a MemoryError, a bug in n5fs or numcodecs) propagates as what it is.
"""

from __future__ import annotations

import contextlib
import lzma
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numcodecs
import numpy as np
from numcodecs.compat import ensure_bytes

from n5fs.codecs import limits
from n5fs.codecs.jsondoc import load_json
from n5fs.codecs.limits import CodecError, check_size
from n5fs.codecs.pickle_check import SAFE_PICKLE_GLOBALS, check_pickle
from n5fs.errors import N5fsError

Codec = Any  # numcodecs.abc.Codec; numcodecs ships no type information

#: object codecs zarr v2 accepts as the first filter of an ``"|O"`` array
OBJECT_CODECS = frozenset(
    {"pickle", "json2", "msgpack2", "vlen-utf8", "vlen-bytes", "vlen-array", "categorize"}
)
#: object codecs that build items from a count or a dtype the chunk itself states: safe only
#: as an object array's first filter, where check_objects checks the count before decoding
#: (anywhere else a 4-byte chunk could make vlen-bytes allocate GiB of item slots)
ITEM_CODECS = OBJECT_CODECS - {"categorize"}
#: the widest any known filter makes data (AsType int8 -> complex128); bounds unknown filters
MAX_FILTER_EXPANSION = 16
#: decoded-size cap for object chunks, whose decoded size no metadata states
DEFAULT_OBJECT_LIMIT = 256 << 20
#: what numcodecs (0.13-0.16) codecs raise on bytes they cannot decode, found by feeding each
#: codec garbage, truncated and bit-flipped chunks and wrong-typed buffers: ValueError (and its
#: kin binascii.Error, UnicodeDecodeError, JSONDecodeError), TypeError (an object buffer fed to
#: a numeric filter), RuntimeError (blosc, zstd, lz4, checksum mismatches), IndexError
#: (packbits, fletcher32 on short input), OSError (bz2, gzip.BadGzipFile), EOFError (gzip),
#: zlib.error, lzma.LZMAError. Not MemoryError: that is the machine, not the content.
CODEC_INPUT_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    RuntimeError,
    IndexError,
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
)
#: what numcodecs codec constructors raise on bad parameters (same probing, every codec)
CODEC_CONFIG_ERRORS: tuple[type[Exception], ...] = (TypeError, ValueError)


def build_codec(config: Any, *, what: str) -> Codec:
    """Instantiate one codec from its JSON config; unknown ids and bad parameters are refused."""
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise CodecError(
            f"{what} must be an object with a string 'id', got {config!r:.80}", rule="codec-config"
        )
    codec_id = config["id"]
    try:
        return numcodecs.get_codec(dict(config))
    except numcodecs.errors.UnknownCodecError as exc:
        raise CodecError(
            f"{what}: unknown codec id {codec_id!r} (numcodecs has no such codec)",
            rule="unknown-codec",
        ) from exc
    except CODEC_CONFIG_ERRORS as exc:
        raise CodecError(
            f"{what}: codec {codec_id!r} refuses its configuration: {exc}", rule="codec-config"
        ) from exc


# --- how each known filter changes the byte size (None: not known) -------------------------


def _retyped(decoded: str, encoded: str) -> Callable[[Codec, int], int | None]:
    """Size rule for filters that convert elements from dtype ``decoded`` to ``encoded``."""

    def size(codec: Codec, nbytes: int) -> int | None:
        src = np.dtype(getattr(codec, decoded)).itemsize
        dst = np.dtype(getattr(codec, encoded)).itemsize
        return nbytes // src * dst if src and nbytes % src == 0 else None

    return size


_SIZE_RULES: dict[str, Callable[[Codec, int], int | None]] = {
    "delta": _retyped("dtype", "astype"),
    "fixedscaleoffset": _retyped("dtype", "astype"),
    "quantize": _retyped("dtype", "astype"),
    "astype": _retyped("decode_dtype", "encode_dtype"),
    "shuffle": lambda _c, n: n,
    "bitround": lambda _c, n: n,
    "packbits": lambda _c, n: 1 + -(-n // 8),
    "base64": lambda _c, n: 4 * -(-n // 3),
    **dict.fromkeys(
        ("crc32", "adler32", "fletcher32", "jenkins_lookup3", "crc32c"), lambda _c, n: n + 4
    ),
}


def encoded_nbytes(codec: Codec, nbytes: int | None) -> int | None:
    """Bytes ``codec`` encodes ``nbytes`` into, when its rule is known."""
    rule = _SIZE_RULES.get(codec.codec_id)
    return None if rule is None or nbytes is None else rule(codec, nbytes)


# --- one bounded decode step ----------------------------------------------------------------


def _lzma(codec: Codec, data: bytes, limit: int) -> bytes | None:
    if codec.format == lzma.FORMAT_RAW:
        return None  # raw streams need filter chains the bounded decoder does not take
    return limits.lzma_decompress(data, limit, fmt=codec.format)


def _lz4(codec: Codec, data: bytes, limit: int) -> bytes | None:
    """numcodecs LZ4 frames start with the decoded size (4 bytes, little-endian): check first."""
    if len(data) < 4:
        raise CodecError("lz4 chunk shorter than its 4-byte size header", rule="undecodable")
    stated = int.from_bytes(data[:4], "little")
    if stated > limit:
        raise limits.too_large(limit, "lz4")
    return None  # the header bounds numcodecs' allocation: let it decode


_BOUNDED: dict[str, Callable[[Codec, bytes, int], bytes | None]] = {
    "zlib": lambda _c, d, n: limits.zlib_decompress(d, n),
    "gzip": lambda _c, d, n: limits.gzip_decompress(d, n),
    "bz2": lambda _c, d, n: limits.bz2_decompress(d, n),
    "blosc": lambda _c, d, n: limits.blosc_decompress(d, n),
    "zstd": lambda _c, d, n: limits.zstd_decompress(d, n),
    "lzma": _lzma,
    "lz4": _lz4,
}


def _nbytes(buf: Any) -> int:
    return int(buf.nbytes) if isinstance(buf, np.ndarray) else memoryview(buf).nbytes


@contextlib.contextmanager
def _refused_input(codec_id: str) -> Iterator[None]:
    """A codec's complaint about its input is a refusal (CodecError, EINVAL); our own errors
    pass as they are, and so does anything a codec does not raise for bad input. numpy's
    floating-point warnings (a NaN cast to an integer by astype) say nothing about validity."""
    try:
        with np.errstate(all="ignore"):
            yield
    except N5fsError:
        raise
    except CODEC_INPUT_ERRORS as exc:
        raise _refusal(codec_id, exc) from exc


def _refusal(codec_id: str, exc: Exception) -> CodecError:
    return CodecError(f"{codec_id} cannot decode the chunk: {exc}", rule="undecodable")


def decode_stage(codec: Codec, buf: Any, exact: int | None, limit: int) -> Any:
    """Decode one stage: at most ``limit`` bytes, exactly ``exact`` when that is known.

    The bounded decoders (:data:`_BOUNDED`) are plain byte codecs: they need neither numpy's
    error state nor a context manager, which cost more than a 512-byte zstd chunk's decode
    (every chunk of a commit or of ``n5fs validate`` passes here)."""
    bounded = _BOUNDED.get(codec.codec_id)
    out = None
    if bounded is not None:
        try:
            out = bounded(codec, bytes(buf), limit)
        except N5fsError:
            raise
        except CODEC_INPUT_ERRORS as exc:
            raise _refusal(codec.codec_id, exc) from exc
    if out is None:
        with _refused_input(codec.codec_id):
            out = codec.decode(buf)
    size = _nbytes(out)
    if size > limit:
        raise limits.too_large(limit, codec.codec_id)
    if exact is not None:
        check_size(size, exact, codec.codec_id)
    return out


# --- object codecs: checked, never executed ---------------------------------------------------


def check_vlen_count(data: Any, count: int, codec_id: str) -> None:
    """VLen chunks start with the item count (4 bytes, little-endian): it must be the chunk's."""
    head = bytes(memoryview(data)[:4])
    if len(head) < 4:
        raise CodecError(f"{codec_id} chunk shorter than its 4-byte item count", rule="undecodable")
    stated = int.from_bytes(head, "little")
    if stated != count:
        raise CodecError(
            f"{codec_id} chunk holds {stated} items, the chunk has {count} elements",
            rule="decoded-size",
        )


def decode_json_objects(data: Any, count: int) -> np.ndarray[Any, Any]:
    """numcodecs JSON chunks are ``[item..., dtype, shape]``; parsed here without trusting dtype."""
    try:
        items = load_json(data, what="json2 chunk")
    except CodecError as exc:
        raise CodecError(exc.message, rule="undecodable") from exc
    if not isinstance(items, list) or len(items) < 2 or not isinstance(items[-1], list):
        raise CodecError("json2 chunk is not [items..., dtype, shape]", rule="undecodable")
    shape = items[-1]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise CodecError(f"json2 chunk states a bad shape {shape!r:.60}", rule="undecodable")
    if len(items) - 2 != count or int(np.prod(shape, dtype=object)) != count:
        raise CodecError(
            f"json2 chunk holds {len(items) - 2} items (shape {shape}), "
            f"the chunk has {count} elements",
            rule="decoded-size",
        )
    out = np.empty(count, dtype=object)
    for i, item in enumerate(items[:-2]):
        out[i] = item  # item by item: numpy would broadcast nested lists
    return out


def _or(size: int | None, cap: int) -> int:
    return cap if size is None else size


# --- the pipeline ---------------------------------------------------------------------------


class V2Pipeline:
    """The ``filters`` + ``compressor`` of one ``.zarray``, with bounded, size-checked decoding.

    ``dtype`` is the array's; for ``"|O"`` the first filter must be an object codec.
    """

    def __init__(
        self,
        compressor: Any,
        filters: Any,
        dtype: np.dtype[Any],
        *,
        object_limit: int = DEFAULT_OBJECT_LIMIT,
    ) -> None:
        if filters is not None and not isinstance(filters, list):
            raise CodecError(
                f"filters must be null or a list, got {filters!r:.60}", rule="codec-config"
            )
        self.filters: tuple[Codec, ...] = tuple(
            build_codec(f, what=f"filters[{i}]") for i, f in enumerate(filters or ())
        )
        self.compressor: Codec | None = (
            None if compressor is None else build_codec(compressor, what="compressor")
        )
        self.dtype = dtype
        self.object_limit = object_limit
        if dtype.hasobject:
            first = self.filters[0].codec_id if self.filters else None
            if first not in OBJECT_CODECS:
                raise CodecError(
                    "an object ('|O') array needs an object codec as its first filter "
                    f"(one of {', '.join(sorted(OBJECT_CODECS))}), got {first!r}",
                    rule="object-codec",
                )
            protocol = getattr(self.filters[0], "protocol", 5)
            if first == "pickle" and (not isinstance(protocol, int) or not -1 <= protocol <= 5):
                raise CodecError(
                    f"pickle protocol must be -1..5, got {protocol!r:.20}", rule="codec-config"
                )
        self._check_placement()

    def _check_placement(self) -> None:
        """Object codecs only where zarr-python could have written them: an item codec as the
        first filter of an object array, categorize converting the array's own dtype. Nothing
        else can hold data, and decoding it could allocate what the chunk states."""
        later = self.filters[1:] if self.is_object else self.filters
        for codec in (*later, self.compressor):
            if codec is not None and codec.codec_id in ITEM_CODECS:
                raise CodecError(
                    f"object codec {codec.codec_id!r} can only be the first filter of an "
                    "object ('|O') array",
                    rule="object-codec",
                )
        for codec in self.filters:
            if codec.codec_id == "categorize" and np.dtype(codec.dtype) != self.dtype:
                raise CodecError(
                    f"categorize converts {np.dtype(codec.dtype)}, the array holds {self.dtype}",
                    rule="codec-config",
                )

    @property
    def is_object(self) -> bool:
        return bool(self.dtype.hasobject)

    def configs(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
        """(compressor, filters) as numcodecs normalises them: defaults filled in."""
        comp = None if self.compressor is None else dict(self.compressor.get_config())
        return comp, [dict(f.get_config()) for f in self.filters] or None

    def summary(self) -> str:
        names = [c.codec_id for c in (*self.filters, self.compressor) if c is not None]
        return " | ".join(names) or "raw"

    # -- decoding ---------------------------------------------------------------------------

    def _sizes(self, nbytes: int | None) -> list[int | None]:
        """Byte size before each filter and after the last one (what the compressor yields)."""
        sizes = [nbytes]
        for codec in self.filters:
            sizes.append(encoded_nbytes(codec, sizes[-1]))
        return sizes

    def _unfilter(self, data: bytes, nbytes: int | None, stop: int) -> Any:
        """Undo the compressor and filters ``stop..`` (in reverse); each stage size-checked."""
        sizes = self._sizes(nbytes)
        cap = self.object_limit if nbytes is None else nbytes * MAX_FILTER_EXPANSION + 4096
        buf: Any = data
        if self.compressor is not None:
            buf = decode_stage(self.compressor, buf, sizes[-1], _or(sizes[-1], cap))
        elif sizes[-1] is not None:
            check_size(len(data), sizes[-1], "uncompressed chunk")
        for i in range(len(self.filters) - 1, stop - 1, -1):
            buf = decode_stage(self.filters[i], buf, sizes[i], _or(sizes[i], cap))
        return buf

    def decode(self, data: bytes, expected_nbytes: int) -> Any:
        """Decoded chunk bytes (a buffer) of exactly ``expected_nbytes``, or CodecError."""
        if self.is_object:
            raise CodecError("object chunks decode to objects, not bytes", rule="object-codec")
        return self._unfilter(data, expected_nbytes, 0)

    def check_objects(
        self, data: bytes, count: int, *, pickle_globals: frozenset[str] = frozenset()
    ) -> None:
        """Check an object chunk of ``count`` elements; never runs code from it.

        ``pickle_globals``: globals a pickle may name beyond :data:`SAFE_PICKLE_GLOBALS` (the
        value classes of the array's format, e.g. hdmf-zarr's references).
        """
        codec = self.filters[0]
        buf = self._unfilter(data, None, 1)
        if codec.codec_id == "pickle":
            allowed = SAFE_PICKLE_GLOBALS | pickle_globals
            check_pickle(bytes(buf), protocol=int(codec.protocol), allowed=allowed)
        elif codec.codec_id == "json2":
            decode_json_objects(buf, count)
        else:
            self._safe_object_decode(codec, buf, count)

    def decode_objects(self, data: bytes, count: int) -> np.ndarray[Any, Any]:
        """The ``count`` objects of a chunk, flat; pickle chunks are refused, never unpickled."""
        codec = self.filters[0]
        if codec.codec_id == "pickle":
            raise CodecError(
                "pickle chunks are never unpickled by n5fs (it would run code from the store)",
                rule="unsafe-codec",
            )
        buf = self._unfilter(data, None, 1)
        if codec.codec_id == "json2":
            return decode_json_objects(buf, count)
        return self._safe_object_decode(codec, buf, count)

    @staticmethod
    def _safe_object_decode(codec: Codec, buf: Any, count: int) -> np.ndarray[Any, Any]:
        if codec.codec_id.startswith("vlen-"):
            check_vlen_count(buf, count, codec.codec_id)
        elif codec.codec_id == "categorize":
            check_size(_nbytes(buf), count * np.dtype(codec.astype).itemsize, "categorize")
        with _refused_input(codec.codec_id):
            out = np.asarray(codec.decode(buf), dtype=object).reshape(-1)
        if out.size != count:
            raise CodecError(
                f"{codec.codec_id} chunk holds {out.size} items, the chunk has {count} elements",
                rule="decoded-size",
            )
        return out

    # -- encoding ---------------------------------------------------------------------------

    def object_fill(self, fill: Any) -> Any:
        """A fill element the object codec can encode (zarr-python 3 writes ``""`` for bytes)."""
        codec_id = self.filters[0].codec_id if self.is_object else ""
        if codec_id == "vlen-bytes":
            return fill.encode() if isinstance(fill, str) else (b"" if fill is None else fill)
        if codec_id == "vlen-utf8" and fill is None:
            return ""
        return fill

    def encode(self, values: np.ndarray[Any, Any]) -> bytes:
        """Chunk bytes as zarr-python 2 writes them: filters in order, then the compressor.

        ``values`` is the full chunk, already laid out in the array's order (C or F).
        """
        buf: Any = values
        for codec in (*self.filters, self.compressor):
            if codec is not None:
                buf = codec.encode(buf)
        return bytes(ensure_bytes(buf))
