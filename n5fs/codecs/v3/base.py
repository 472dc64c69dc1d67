"""The three kinds of Zarr v3 codec, as abstract bases a chain can order and bound.

``BytesBytesCodec`` is also a :class:`~n5fs.codecs.limits.BoundedDecoder`: v3 compressors
and N5 compressions share the one bounded-decode protocol, ``decode(data, limit)``, so a
decompression bomb is refused the same way whichever format stored it.
"""

from __future__ import annotations

import abc
import enum
from typing import TYPE_CHECKING, Any, ClassVar

from n5fs.codecs.limits import BoundedDecoder

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np

    from n5fs.codecs.v3.types import ArraySpec


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


class BytesBytesCodec(Codec, BoundedDecoder):
    """A compressor or checksum: one bounded-decode protocol with the N5 compressions."""

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
