"""Codec name -> implementing class, imported on first use.

Entries are ``"module:Class"`` strings, not classes, so this module imports no codec
module: the chain asks it for ``sharding_indexed`` while ``sharding.py`` builds on the chain,
and only a lazy entry lets both exist without an import cycle (or an import hidden inside a
function). Outside code adds codecs with :func:`register_codec`; clobbering an entry needs
``replace=True``.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING

from n5fs.codecs.v3.base import Codec

if TYPE_CHECKING:
    from collections.abc import Mapping

_BUILTIN = "n5fs.codecs.v3.builtin"

_CODECS: dict[str, str] = {
    "transpose": f"{_BUILTIN}:TransposeCodec",
    "bytes": f"{_BUILTIN}:BytesCodec",
    "vlen-utf8": f"{_BUILTIN}:VlenUtf8Codec",
    "vlen-bytes": f"{_BUILTIN}:VlenBytesCodec",
    "gzip": f"{_BUILTIN}:GzipCodec",
    "zstd": f"{_BUILTIN}:ZstdCodec",
    "blosc": f"{_BUILTIN}:BloscCodec",
    "crc32c": f"{_BUILTIN}:Crc32cCodec",
    "sharding_indexed": "n5fs.codecs.v3.sharding:ShardingCodec",
}
#: "module:Class" -> the class, once imported (keyed by target: a replaced entry re-resolves)
_resolved: dict[str, type[Codec]] = {}

#: read-only view of the registered codecs: name -> "module:Class"
CODECS: Mapping[str, str] = MappingProxyType(_CODECS)


def register_codec(name: str, target: str, *, replace: bool = False) -> None:
    """Register ``name`` -> ``"module:Class"``; re-registering another target needs ``replace``."""
    if not replace and _CODECS.get(name, target) != target:
        raise ValueError(f"zarr v3 codec {name!r} is already registered")
    _CODECS[name] = target


def codec_names() -> list[str]:
    """The codec names n5fs knows, sorted (unknown-codec messages list them)."""
    return sorted(_CODECS)


def codec_class(name: str) -> type[Codec] | None:
    """The implementation of codec ``name``, or None if n5fs does not know it."""
    target = _CODECS.get(name)
    if target is None:
        return None
    if target in _resolved:
        return _resolved[target]
    module, _, attr = target.partition(":")
    found = getattr(importlib.import_module(module), attr)
    if not (isinstance(found, type) and issubclass(found, Codec)):
        raise TypeError(f"zarr v3 codec {name!r}: {target} is not a Codec class")
    _resolved[target] = found
    return found
