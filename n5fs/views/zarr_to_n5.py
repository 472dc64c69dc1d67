"""What a Zarr array document written through a Zarr view becomes in N5 (``attributes.json``).

The metadata half of :mod:`n5fs.views.writes`: pure functions from a Zarr document (v2
``.zarray``, v3 ``zarr.json``) to the N5 dataset keys (``dimensions`` and ``blockSize``
reversed, ``dataType``, ``compression``), or the reason N5 cannot hold the array
(:class:`~n5fs.errors.Rejected` with the rule broken: ``dataType``, ``fill-value``, ``codec``).
Kept apart from the staging and commit machinery, which does not depend on which codecs N5
has; no state, so no locks.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from n5fs.codecs.n5_compression import compression_from_type, parse_compression
from n5fs.errors import Rejected
from n5fs.formats.base import ArrayNode
from n5fs.formats.n5 import DATA_TYPES, VERSION0_COMPRESSION_KEY, is_dataset_attributes
from n5fs.formats.zarr2 import Zarr2Format
from n5fs.formats.zarr3 import Zarr3ArrayNode, Zarr3Format
from n5fs.views import declared_codecs as codecs
from n5fs.views.attributes import to_n5

_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
#: version 0's compression key: a dataset's, kept when its attributes are rewritten
V0 = VERSION0_COMPRESSION_KEY


def parse_document(view: str, name: str, data: bytes, key: str) -> Any:
    """The node a Zarr document of the ``view``'s version declares (its rules refuse)."""
    fmt = Zarr3Format() if view == "zarr3" else Zarr2Format()
    return fmt.parse_metadata(name, data, path="/" + key)


def n5_attributes(
    view: str, name: str, data: bytes, key: str, current: dict[str, Any]
) -> tuple[dict[str, Any], ArrayNode | None]:
    """The folder's new ``attributes.json`` when the Zarr document ``name`` is written over
    ``current`` (the folder's attributes now), and the array node it declares (None: a group
    or attributes). v3 holds every attribute in ``zarr.json``; v2 in ``.zattrs``, written
    apart from ``.zarray``; a group keeps its ``"n5"`` version. The Zarr attributes become N5
    ones through :func:`~n5fs.views.attributes.to_n5` (what does not fit N5's key of its name
    is kept under ``zarr_attributes``; a v3 array's ``dimension_names`` are its ``axes``)."""
    if name == ".zattrs":
        doc = parse_json(data, key)
        if not isinstance(doc, dict):
            raise refusal(".zattrs must be a JSON object", key, "attributes")
        merged = {k: v for k, v in current.items() if k in KEPT or k in DATASET or k == V0}
        dims = current.get("dimensions") if is_dataset_attributes(current) else None
        rank = len(dims) if isinstance(dims, list) else None
        return {**merged, **to_n5(doc, rank)}, None
    if name == ".zgroup":
        return current, None
    node = parse_document(view, name, data, key)
    if not isinstance(node, ArrayNode):
        group = {k: v for k, v in current.items() if k in KEPT}
        return {**group, **to_n5(node.attributes)}, None
    attrs = dataset_keys(node, parse_json(data, key), key)
    v2 = name == ".zarray"
    kept = {k: v for k, v in current.items() if (k not in DATASET if v2 else k in KEPT)}
    kept.pop(V0, None)
    names = node.dimension_names if isinstance(node, Zarr3ArrayNode) else None
    mapped = to_n5(node.attributes, len(node.shape), names, named=not v2)
    same = stored_compression(view, attrs["compression"], current)
    if same is not None:
        del attrs["compression"]
    return {**kept, **mapped, **attrs, **(same or {})}, node


def stored_compression(
    view: str, compression: dict[str, Any], current: dict[str, Any]
) -> dict[str, Any] | None:
    """The folder's stored compression key (``compression``, or version 0's
    ``compressionType``) when ``compression`` is what the view's document for it maps back to,
    else None. The view shows N5 gzip's ``"level": -1`` (N5 Java's default, which Zarr readers
    refuse) as 6, a bzip2 dataset as raw (its chunks decoded): a writer that writes the view's
    own document back (zarr-python re-saving metadata) means no change of compression, and
    while chunks exist a change would be refused."""
    try:
        itemsize = np.dtype(DATA_TYPES[current["dataType"]]).itemsize
        if "compression" in current:
            stored = {"compression": current["compression"]}
            now = parse_compression(current["compression"], itemsize=itemsize)
        else:
            stored = {VERSION0_COMPRESSION_KEY: current[VERSION0_COMPRESSION_KEY]}
            now = compression_from_type(current[VERSION0_COMPRESSION_KEY])
        shown = codecs.from_n5(now, view, itemsize).config
        if view == codecs.ZARR3:
            back = _v3_compression({"codecs": [{"name": "bytes"}, *shown]}, "")
        else:
            back = _v2_compression({"compressor": shown}, "")
    except (KeyError, TypeError, Rejected):
        return None  # no dataset here, or none the view shows
    return stored if back == compression else None


def refusal(message: str, path: str, rule: str) -> Rejected:
    """A refusal of a write through a Zarr view into N5 (``path`` is the view key)."""
    return Rejected(message, path="/" + path, fmt="n5", rule=rule)


#: N5 keys a group keeps when a Zarr writer rewrites its attributes
KEPT = ("n5",)
DATASET = ("dimensions", "blockSize", "dataType", "compression")


def parse_json(data: bytes, key: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise refusal(f"not JSON: {exc}", key, "json") from exc


def dataset_keys(node: ArrayNode, doc: dict[str, Any], key: str) -> dict[str, Any]:
    """The N5 dataset keys for a Zarr array document, or why N5 cannot hold the array."""
    dtype = node.dtype.newbyteorder("=")
    names = [n for n, code in DATA_TYPES.items() if np.dtype(code) == dtype]
    if not names or dtype.kind == "b":
        raise refusal(f"N5 has no data type for {node.dtype.str}", key, "dataType")
    fill = node.fill_value if isinstance(node, Zarr3ArrayNode) else _v2_fill(doc)
    if fill is not None and not (np.asarray(fill, dtype=dtype) == 0).all():
        why = f"fill value {doc.get('fill_value')!r}: N5 reads a missing block as 0, no other"
        raise refusal(why, key, "fill-value")
    compression = _v3_compression(doc, key) if "codecs" in doc else _v2_compression(doc, key)
    return {
        "dimensions": list(node.shape[::-1]),
        "blockSize": list(node.chunks[::-1]),
        "dataType": names[0],
        "compression": compression,
    }


def _v2_fill(doc: dict[str, Any]) -> Any:
    return doc.get("fill_value") if isinstance(doc.get("fill_value"), (int, float)) else None


def _v3_compression(doc: dict[str, Any], key: str) -> dict[str, Any]:
    chain = list(doc.get("codecs") or [])
    names = [c["name"] if isinstance(c, dict) else c for c in chain]
    if not names or names[0] != "bytes":
        first = names[0] if names else "none"
        why = f"codec {first!r} before 'bytes': N5 stores a block's values in order, unchanged"
        raise refusal(why, key, "codec")
    rest = chain[1:]
    if len(rest) > 1:
        raise refusal(f"codecs {names[1:]}: N5 applies one compression per block", key, "codec")
    if not rest:
        return {"type": "raw"}
    codec = rest[0]
    name = codec["name"] if isinstance(codec, dict) else codec
    config = dict(codec.get("configuration") or {}) if isinstance(codec, dict) else {}
    return _compression(name, config, key)


def _v2_compression(doc: dict[str, Any], key: str) -> dict[str, Any]:
    if doc.get("filters"):
        raise refusal("Zarr v2 filters: N5 has none", key, "codec")
    compressor = doc.get("compressor")
    if compressor is None:
        return {"type": "raw"}
    config = dict(compressor)
    return _compression(str(config.pop("id", "")), config, key)


def _compression(name: str, config: dict[str, Any], key: str) -> dict[str, Any]:
    """The N5 ``compression`` for one Zarr bytes-to-bytes codec."""
    if name in ("gzip", "zlib"):
        level = {"level": config["level"]} if "level" in config else {}
        return {"type": "gzip", "useZlib": name == "zlib", **level}
    if name == "zstd":
        return {"type": "zstd", "level": config.get("level", 3)}
    if name == "blosc":
        shuffle = config.get("shuffle", 1)
        # no typesize: TensorStore refuses it; N5 shuffles by the element size
        return {
            "type": "blosc",
            "cname": config.get("cname", "lz4"),
            "clevel": config.get("clevel", 5),
            "shuffle": _SHUFFLE.get(shuffle, shuffle) if isinstance(shuffle, str) else shuffle,
            "blocksize": config.get("blocksize", 0),
        }
    why = f"codec {name!r}: N5 has no such compression (raw, gzip, zstd, blosc, bzip2, xz, lz4)"
    raise refusal(why, key, "codec")
