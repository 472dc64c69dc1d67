"""Which compressor a view declares for an array, and whether the source's bytes can stay.

A Zarr view of an N5 dataset (or of a Zarr array of the other version) keeps the stored
compression where the target format has the same codec: the N5 gzip payload *is* a gzip
stream, a blosc payload a blosc buffer, a zstd payload a zstd frame, so those chunks are
served as stored (less the N5 header). Where the target has no such codec (N5 bzip2, xz and
lz4 for both Zarr versions; N5 gzip with ``useZlib`` and Zarr v2 ``zlib`` for Zarr v3; any v2
filter; a v3 checksum or a transposition other than F order for v2) the view declares no
compression and serves decoded bytes ("transcoded"), whose size follows from the chunk
shape. :class:`ViewCodec` also names the frame a rebuilt chunk (an N5 end block padded to the
full chunk) is written in, one whose size depends on the payload's length only
(:mod:`n5fs.views.stored`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from n5fs.codecs.n5_compression import (
    BloscCompression,
    GzipCompression,
    RawCompression,
    ZstdCompression,
)
from n5fs.codecs.v3 import BloscCodec, GzipCodec, ZstdCodec
from n5fs.views import stored

if TYPE_CHECKING:
    from n5fs.codecs.n5_compression import N5Compression
    from n5fs.codecs.v2_pipeline import V2Pipeline
    from n5fs.codecs.v3 import BytesBytesCodec

ZARR3 = "zarr3"
ZARR2 = "zarr2"
_SHUFFLE_NAMES = ("noshuffle", "shuffle", "bitshuffle")
#: zlib's own default, for a "level" of -1 (N5 Java's default) that Zarr readers refuse
_DEFAULT_DEFLATE_LEVEL = 6


@dataclass(frozen=True)
class ViewCodec:
    """The compression of a view's chunks.

    ``config`` is the target's JSON for it: a list of Zarr v3 bytes-to-bytes codecs, or a
    Zarr v2 ``compressor`` (None: no compression). ``passthrough``: the source's stored
    payloads are valid as they are; else every chunk is decoded and served raw (``frame`` is
    then :data:`~n5fs.views.stored.RAW`). ``why`` says, for ``detect --as``, why a chunk is
    transcoded.
    """

    config: Any
    passthrough: bool
    frame: stored.StoredFrame = stored.RAW
    why: str = field(default="", compare=False)

    @property
    def transcoded(self) -> bool:
        return not self.passthrough


def raw(target: str, why: str = "") -> ViewCodec:
    """No compression: decoded bytes (``why`` non-empty: the source had one we cannot keep)."""
    return ViewCodec([] if target == ZARR3 else None, passthrough=not why, why=why)


def _level(level: int) -> int:
    return level if 0 <= level <= 9 else _DEFAULT_DEFLATE_LEVEL


def _shuffle_name(shuffle: int) -> str:
    return _SHUFFLE_NAMES[shuffle] if 0 <= shuffle <= 2 else "shuffle"  # -1: blosc's "auto"


def _blosc3(cname: str, clevel: int, shuffle: str, blocksize: int, typesize: int) -> Any:
    config = {
        "cname": cname,
        "clevel": clevel,
        "shuffle": shuffle,
        "typesize": typesize,
        "blocksize": blocksize,
    }
    return {"name": "blosc", "configuration": config}


def _blosc2(cname: str, clevel: int, shuffle: int, blocksize: int) -> Any:
    return {
        "id": "blosc",
        "cname": cname,
        "clevel": clevel,
        "shuffle": shuffle,
        "blocksize": blocksize,
    }


# == N5 compression -> Zarr =======================================================================


def from_n5(compression: N5Compression, target: str, itemsize: int) -> ViewCodec:
    """The view codec of an N5 dataset's ``compression`` in ``target`` (zarr3 or zarr2)."""
    v3 = target == ZARR3
    if isinstance(compression, RawCompression):
        return raw(target)
    if isinstance(compression, GzipCompression):
        level = _level(compression.level)
        if not compression.use_zlib:
            config: Any = (
                [{"name": "gzip", "configuration": {"level": level}}]
                if v3
                else {"id": "gzip", "level": level}
            )
            return ViewCodec(config, True, stored.GZIP)
        if not v3:
            return ViewCodec({"id": "zlib", "level": level}, True, stored.ZLIB)
        return raw(target, "N5 gzip with useZlib is a zlib stream; Zarr v3 has no zlib codec")
    if isinstance(compression, ZstdCompression):
        config = (
            [{"name": "zstd", "configuration": {"level": compression.level, "checksum": False}}]
            if v3
            else {"id": "zstd", "level": compression.level}
        )
        return ViewCodec(config, True, stored.ZSTD)
    if isinstance(compression, BloscCompression):
        c = compression
        config = (
            [_blosc3(c.cname, c.clevel, _shuffle_name(c.shuffle), c.blocksize, itemsize)]
            if v3
            else _blosc2(c.cname, c.clevel, c.shuffle, c.blocksize)
        )
        return ViewCodec(config, True, stored.blosc_frame(itemsize))
    return raw(target, f"N5 {compression.type} has no Zarr codec every reader reads")


# == Zarr v2 <-> Zarr v3 ==========================================================================


def v2_to_v3(pipeline: V2Pipeline, itemsize: int) -> ViewCodec:
    """A Zarr v2 array's filters and compressor as Zarr v3 bytes-to-bytes codecs."""
    if pipeline.filters:
        return raw(ZARR3, "Zarr v2 filters have no Zarr v3 codec")
    compressor, _ = pipeline.configs()
    if compressor is None:
        return raw(ZARR3)
    kind = compressor.get("id")
    if kind == "gzip":
        level = _level(int(compressor.get("level", _DEFAULT_DEFLATE_LEVEL)))
        return ViewCodec([{"name": "gzip", "configuration": {"level": level}}], True)
    if kind == "zstd":
        level = int(compressor.get("level", 0))
        config = {"level": level, "checksum": bool(compressor.get("checksum", False))}
        return ViewCodec([{"name": "zstd", "configuration": config}], True)
    if kind == "blosc":
        config = _blosc3(
            str(compressor["cname"]),
            int(compressor["clevel"]),
            _shuffle_name(int(compressor["shuffle"])),
            int(compressor.get("blocksize", 0)),
            itemsize,
        )
        return ViewCodec([config], True)
    return raw(ZARR3, f"Zarr v2 compressor {kind!r} has no Zarr v3 codec every reader reads")


def v3_to_v2(bytes_bytes: tuple[BytesBytesCodec, ...]) -> ViewCodec:
    """A Zarr v3 chain's bytes-to-bytes codecs as one Zarr v2 compressor."""
    if not bytes_bytes:
        return raw(ZARR2)
    if len(bytes_bytes) > 1:
        names = ", ".join(c.name for c in bytes_bytes)
        return raw(ZARR2, f"Zarr v2 holds one compressor, not {names}")
    codec = bytes_bytes[0]
    if isinstance(codec, GzipCodec):
        return ViewCodec({"id": "gzip", "level": codec.level}, True)
    if isinstance(codec, ZstdCodec):
        return ViewCodec({"id": "zstd", "level": codec.level}, True)
    if isinstance(codec, BloscCodec):
        shuffle = _SHUFFLE_NAMES.index(codec.shuffle)
        return ViewCodec(_blosc2(codec.cname, codec.clevel, shuffle, codec.blocksize), True)
    return raw(ZARR2, f"Zarr v3 codec {codec.name!r} has no Zarr v2 compressor")


# == Zarr -> N5 (``--as n5``) =====================================================================

N5 = "n5"
N5_RAW = {"type": "raw"}


def _n5_raw(why: str = "") -> ViewCodec:
    return ViewCodec(dict(N5_RAW), passthrough=not why, why=why)


def _n5_gzip(level: int, use_zlib: bool) -> ViewCodec:
    config = {"type": "gzip", "level": _level(level), "useZlib": use_zlib}
    return ViewCodec(config, True, stored.ZLIB if use_zlib else stored.GZIP)


def _n5_zstd(level: int) -> ViewCodec:
    return ViewCodec({"type": "zstd", "level": level}, True, stored.ZSTD)


def _n5_blosc(cname: str, clevel: int, shuffle: int, blocksize: int, itemsize: int) -> ViewCodec:
    config = {"type": "blosc", "cname": cname, "clevel": clevel, "shuffle": shuffle}
    config["blocksize"] = blocksize
    return ViewCodec(config, True, stored.blosc_frame(itemsize))


def n5_from_v2(pipeline: V2Pipeline, itemsize: int) -> ViewCodec:
    """A Zarr v2 array's filters and compressor as an N5 ``compression``: gzip, zlib (N5
    gzip with ``useZlib``), zstd and blosc payloads are the same streams in both formats."""
    if pipeline.filters:
        return _n5_raw("N5 has no filters")
    compressor, _ = pipeline.configs()
    if compressor is None:
        return _n5_raw()
    kind = compressor.get("id")
    if kind in ("gzip", "zlib"):
        level = int(compressor.get("level", _DEFAULT_DEFLATE_LEVEL))
        return _n5_gzip(level, kind == "zlib")
    if kind == "zstd":
        return _n5_zstd(int(compressor.get("level", 0)))
    if kind == "blosc":
        c = compressor
        shuffle = int(c["shuffle"])
        return _n5_blosc(
            str(c["cname"]),
            int(c["clevel"]),
            shuffle if 0 <= shuffle <= 2 else 1,
            int(c.get("blocksize", 0)),
            itemsize,
        )
    return _n5_raw(f"Zarr v2 compressor {kind!r} has no N5 compression every reader reads")


def n5_from_v3(bytes_bytes: tuple[BytesBytesCodec, ...], itemsize: int) -> ViewCodec:
    """A Zarr v3 chain's bytes-to-bytes codecs as one N5 ``compression``."""
    if not bytes_bytes:
        return _n5_raw()
    if len(bytes_bytes) > 1:
        names = ", ".join(c.name for c in bytes_bytes)
        return _n5_raw(f"N5 holds one compression, not {names}")
    codec = bytes_bytes[0]
    if isinstance(codec, GzipCodec):
        return _n5_gzip(codec.level, False)
    if isinstance(codec, ZstdCodec):
        return _n5_zstd(codec.level)
    if isinstance(codec, BloscCodec):
        shuffle = _SHUFFLE_NAMES.index(codec.shuffle)
        return _n5_blosc(codec.cname, codec.clevel, shuffle, codec.blocksize, itemsize)
    return _n5_raw(f"Zarr v3 codec {codec.name!r} has no N5 compression")


def n5_transcoded(why: str) -> ViewCodec:
    """Every block decoded and served raw (the source's layout or byte order is not N5's)."""
    return _n5_raw(why)


def summary(codec: ViewCodec) -> str:
    """One short line for ``detect --as``: the declared codec, and transcoding if any."""
    config = codec.config
    if isinstance(config, list):
        names = [str(c["name"]) for c in config]
    elif isinstance(config, dict) and "type" in config:  # an N5 compression
        names = [str(config["type"])]
    else:
        names = [] if config is None else [str(config["id"])]
    text = ", ".join(names) or "raw"
    return f"{text} (transcoded: {codec.why})" if codec.why else text
