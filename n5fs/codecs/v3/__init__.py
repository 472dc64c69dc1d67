"""Zarr v3 codecs: data types, the codec kinds, the built-in codecs, the chain, sharding.

Modules, each importing only those before it: ``types`` (data types, array specs,
extension points), ``base`` (the codec kinds), ``registry`` (name -> ``"module:Class"``,
resolved on first use), ``builtin`` (the core and zarr-python codecs), ``chain``
(``CodecChain``), ``sharding`` (``sharding_indexed``, built on the chain and found by the
chain through the registry). Import public names from here.
"""

from __future__ import annotations

from n5fs.codecs.v3.base import (
    ArrayArrayCodec,
    ArrayBytesCodec,
    BytesBytesCodec,
    Codec,
    CodecKind,
)
from n5fs.codecs.v3.builtin import (
    VLEN_MAX_BYTES,
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    VlenBytesCodec,
    VlenCodec,
    VlenUtf8Codec,
    ZstdCodec,
)
from n5fs.codecs.v3.chain import CodecChain
from n5fs.codecs.v3.registry import CODECS, codec_class, codec_names, register_codec
from n5fs.codecs.v3.sharding import EMPTY, ShardIndex, ShardingCodec
from n5fs.codecs.v3.types import (
    MAX_ITEMSIZE,
    ArraySpec,
    DataType,
    Extension,
    bad_config,
    check_keys,
    is_int,
    parse_data_type,
    parse_extension,
)

__all__ = [
    # types
    "MAX_ITEMSIZE",
    "ArraySpec",
    "DataType",
    "Extension",
    "bad_config",
    "check_keys",
    "is_int",
    "parse_data_type",
    "parse_extension",
    # codec kinds
    "ArrayArrayCodec",
    "ArrayBytesCodec",
    "BytesBytesCodec",
    "Codec",
    "CodecKind",
    # registry
    "CODECS",
    "codec_class",
    "codec_names",
    "register_codec",
    # built-in codecs
    "VLEN_MAX_BYTES",
    "BloscCodec",
    "BytesCodec",
    "Crc32cCodec",
    "GzipCodec",
    "TransposeCodec",
    "VlenBytesCodec",
    "VlenCodec",
    "VlenUtf8Codec",
    "ZstdCodec",
    # chain and sharding
    "CodecChain",
    "EMPTY",
    "ShardIndex",
    "ShardingCodec",
]
