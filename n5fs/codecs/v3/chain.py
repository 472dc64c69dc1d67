"""The Zarr v3 codec chain: ``array -> array``*, one ``array -> bytes``, ``bytes -> bytes``*.

A chain is parsed against the *decoded representation* it will see (chunk shape, data
type, fill value), as the core spec's ``compute_encoded_representation_type`` does, so a
configuration that cannot work for this array is refused when the metadata is written,
not when the first chunk arrives. Every decode is bounded: each ``bytes -> bytes`` stage
may produce at most what the next stage could legally consume, so a decompression bomb is
refused before it inflates. Codecs are looked up by name in ``registry.py``, which imports
them lazily: sharding (an array -> bytes codec holding two chains) builds on this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from n5fs.codecs.limits import CodecError
from n5fs.codecs.v3.base import (
    ArrayArrayCodec,
    ArrayBytesCodec,
    BytesBytesCodec,
    Codec,
    CodecKind,
)
from n5fs.codecs.v3.registry import codec_class, codec_names
from n5fs.codecs.v3.types import ArraySpec, bad_config, parse_extension


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
                        f"{codec_names()}); an unknown "
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
