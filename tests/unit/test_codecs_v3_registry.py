"""The ``n5fs.codecs.v3`` package: a lazy registry, no import cycle, one bounded decode."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import numcodecs
import pytest
import zstandard

import n5fs.codecs.v3
from n5fs.codecs.limits import BoundedDecoder, CodecError
from n5fs.codecs.v3 import (
    CODECS,
    ArraySpec,
    BytesBytesCodec,
    Codec,
    CodecChain,
    CodecKind,
    codec_class,
    codec_names,
    parse_data_type,
    register_codec,
)
from n5fs.codecs.v3 import registry as registry_module

PACKAGE = Path(n5fs.codecs.v3.__file__).parent
LE = {"name": "bytes", "configuration": {"endian": "little"}}
#: 1 MiB of zeros: compresses to a few KiB, 16 times LIMIT once inflated
BOMB = bytes(1 << 20)
LIMIT = 1 << 16


def spec(shape: tuple[int, ...] = (4, 4), dtype: str = "int16", fill: Any = 0) -> ArraySpec:
    return ArraySpec(shape, parse_data_type(dtype), fill)


#: one valid configuration (and the decoded representation it is for) per registered codec
CONFIGS: dict[str, tuple[dict[str, Any], ArraySpec]] = {
    "transpose": ({"order": [1, 0]}, spec()),
    "bytes": ({"endian": "big"}, spec()),
    "vlen-utf8": ({}, spec(dtype="string", fill="")),
    "vlen-bytes": ({}, spec(dtype="bytes", fill=b"")),
    "gzip": ({"level": 5}, spec()),
    "zstd": ({"level": 3, "checksum": True}, spec()),
    "blosc": (
        {"cname": "zstd", "clevel": 5, "shuffle": "shuffle", "typesize": 2, "blocksize": 0},
        spec(),
    ),
    "crc32c": ({}, spec()),
    "sharding_indexed": (
        {
            "chunk_shape": [2, 2],
            "codecs": [LE, {"name": "gzip", "configuration": {"level": 1}}],
            "index_codecs": [LE, {"name": "crc32c"}],
            "index_location": "start",
        },
        spec(),
    ),
}


def refused(rule: str, call: Any, *args: Any) -> CodecError:
    with pytest.raises(CodecError) as info:
        call(*args)
    assert info.value.rule == rule, info.value
    return info.value


def built(name: str) -> Codec:
    impl = codec_class(name)
    assert impl is not None
    config, decoded = CONFIGS[name]
    return impl.from_config(config, decoded)


# --------------------------------------------------------------------------- registry


def test_every_registered_codec_has_a_test_configuration() -> None:
    assert sorted(CONFIGS) == codec_names() == sorted(CODECS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_registered_name_resolves_and_round_trips_through_to_json(name: str) -> None:
    impl = codec_class(name)
    assert impl is not None
    assert impl.name == name
    assert codec_class(name) is impl  # resolved once, then cached
    codec = built(name)
    doc = codec.to_json()
    assert doc["name"] == name
    again = impl.from_config(doc.get("configuration", {}), CONFIGS[name][1])
    assert again == codec
    assert again.to_json() == doc
    # and through a whole chain, as zarr.json carries it
    _, decoded = CONFIGS[name]
    if impl.kind is CodecKind.ARRAY_BYTES:
        codecs = [doc]
    elif impl.kind is CodecKind.ARRAY_ARRAY:
        codecs = [doc, LE]
    else:
        codecs = [LE, doc]
    assert CodecChain.parse(codecs, decoded).to_json() == codecs


def test_unknown_codec_name_is_refused_with_the_known_names() -> None:
    assert codec_class("lz5") is None
    error = refused("unknown-codec", CodecChain.parse, [LE, {"name": "lz5"}], spec())
    assert "codecs[1]: unknown codec 'lz5'" in error.message
    assert str(codec_names()) in error.message
    assert "sharding_indexed" in error.message
    assert "must_understand=false" in error.message
    ignorable = [LE, {"name": "lz5", "must_understand": False}]
    assert CodecChain.parse(ignorable, spec()).to_json() == ignorable


def test_registering_another_target_needs_replace() -> None:
    register_codec("gzip", CODECS["gzip"])  # the same target again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register_codec("gzip", "n5fs.codecs.v3.builtin:ZstdCodec")
    assert codec_class("gzip") is type(built("gzip"))
    assert type(built("gzip")).__name__ == "GzipCodec"


def test_a_new_codec_resolves_lazily_and_a_non_codec_target_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(registry_module._CODECS, "test.crc", "placeholder:Nothing")
    register_codec("test.crc", "n5fs.codecs.v3.builtin:Crc32cCodec", replace=True)
    assert codec_class("test.crc") is codec_class("crc32c")
    register_codec("test.crc", "n5fs.codecs.limits:CodecError", replace=True)
    with pytest.raises(TypeError, match="not a Codec class"):
        codec_class("test.crc")


# --------------------------------------------------------------------------- no import cycle


@pytest.mark.parametrize("module", ["sharding", "chain", "registry", "builtin", "base", "types"])
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    code = (
        f"import n5fs.codecs.v3.{module}\n"
        "from n5fs.codecs.v3.chain import CodecChain\n"
        "from n5fs.codecs.v3.sharding import ShardingCodec\n"
        "from n5fs.codecs.v3.types import ArraySpec, parse_data_type\n"
        "s = ArraySpec((4,), parse_data_type('uint8'), 0)\n"
        "c = CodecChain.parse([{'name': 'sharding_indexed', 'configuration': {"
        "'chunk_shape': [2], 'codecs': ['bytes'], 'index_codecs': [{'name': 'bytes', "
        "'configuration': {'endian': 'little'}}]}}], s)\n"
        "assert isinstance(c.array_bytes, ShardingCodec)\n"
        "print(c.decode(c.encode([0, 1, 2, 3])).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1, 2, 3]"


def _package_imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source (functions too)."""
    prefix = "n5fs.codecs.v3"
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            deps |= {n.removeprefix(f"{prefix}.") for n in names if n.startswith(prefix)}
        graph[path.stem] = {"__init__" if d == prefix else d for d in deps}
    return graph


def test_module_imports_form_no_cycle_and_the_registry_imports_no_codec() -> None:
    graph = _package_imports()
    assert set(graph) == {"__init__", "types", "base", "registry", "builtin", "chain", "sharding"}
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError on a cycle
    assert order[-1] == "__init__"
    assert graph["types"] == set()
    assert graph["registry"] <= {"base", "types"}
    assert "sharding" not in graph["chain"]
    assert "chain" in graph["sharding"]


# --------------------------------------------------------------------------- bounded decode


def test_bytes_to_bytes_codecs_are_bounded_decoders() -> None:
    assert issubclass(BytesBytesCodec, BoundedDecoder)
    kinds = {name: codec_class(name) for name in codec_names()}
    bytes_bytes = sorted(n for n, c in kinds.items() if c and c.kind is CodecKind.BYTES_BYTES)
    assert bytes_bytes == ["blosc", "crc32c", "gzip", "zstd"]
    for name in bytes_bytes:
        assert isinstance(built(name), BoundedDecoder)


@pytest.mark.parametrize(
    ("name", "bomb"),
    [
        ("gzip", None),
        ("zstd", None),
        ("zstd", zstandard.ZstdCompressor(write_content_size=False).compress(BOMB)),
        ("blosc", None),
        ("blosc", bytes(numcodecs.Blosc(cname="lz4").encode(BOMB))),
    ],
)
def test_compressor_refuses_a_decompression_bomb(name: str, bomb: bytes | None) -> None:
    codec = built(name)
    assert isinstance(codec, BytesBytesCodec)
    data = codec.encode(BOMB) if bomb is None else bomb
    assert len(data) < LIMIT // 8  # small on disk ...
    error = refused("decoded-size", codec.decode, data, LIMIT)  # ... refused uninflated
    assert str(LIMIT) in error.message
    # the limit is a bound, not a refusal of everything: at exactly the size it decodes
    assert codec.decode(data, len(BOMB)) == BOMB
    small = codec.encode(bytes(LIMIT))
    assert codec.decode(small, LIMIT) == bytes(LIMIT)
    refused("decoded-size", codec.decode, small, LIMIT - 1)


def test_crc32c_refuses_a_bad_checksum_and_an_oversized_payload() -> None:
    codec = built("crc32c")
    assert isinstance(codec, BytesBytesCodec)
    framed = codec.encode(b"payload")
    assert codec.decode(framed, 7) == b"payload"
    flipped = bytes([framed[0] ^ 1]) + framed[1:]
    refused("checksum", codec.decode, flipped, LIMIT)
    refused("checksum", codec.decode, framed[:-1] + bytes([framed[-1] ^ 0x80]), LIMIT)
    refused("checksum", codec.decode, b"abc", LIMIT)
    refused("decoded-size", codec.decode, framed, 6)
