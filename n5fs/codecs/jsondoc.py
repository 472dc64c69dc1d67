"""The one JSON loader for everything n5fs parses from a store: metadata, attributes, JSON chunks.

Nesting is bounded. Python's decoder recurses once per level and raises ``RecursionError``
somewhere past ~1,000 levels, and every later walk of a parsed document (format checks, the
hdmf link scan, consolidation, ``json.dumps``) recurses too, deeper in the stack of a FUSE call.
A document nested deeper than :data:`MAX_DEPTH` is refused here, as content (``EINVAL`` with
rule ``json-depth``), before any of those walks can overflow. Real metadata stays far below the
bound: OME-Zarr multiscales and NWB specs nest fewer than a dozen levels.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from n5fs.codecs.limits import CodecError

#: the deepest nesting of arrays and objects a document may have
MAX_DEPTH = 128

PairsHook = Callable[[list[tuple[str, Any]]], Any]


def load_json(
    data: bytes | bytearray | memoryview | str,
    *,
    what: str = "document",
    object_pairs_hook: PairsHook | None = None,
    parse_constant: Callable[[str], Any] | None = None,
) -> Any:
    """Parse ``data`` (UTF-8 when bytes) or raise CodecError: rule ``json`` when it is not JSON,
    ``json-depth`` when it nests deeper than :data:`MAX_DEPTH`."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        doc = json.loads(text, object_pairs_hook=object_pairs_hook, parse_constant=parse_constant)
    except RecursionError as exc:
        raise too_deep(what) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"{what} is not valid JSON: {exc}", rule="json") from exc
    if depth(doc) > MAX_DEPTH:
        raise too_deep(what)
    return doc


def too_deep(what: str) -> CodecError:
    return CodecError(
        f"{what} nests arrays/objects more than {MAX_DEPTH} levels deep", rule="json-depth"
    )


def depth(doc: Any) -> int:
    """How deeply ``doc`` nests lists and dicts (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:  # one level past the bound is enough to refuse
            stack.extend((child, level) for child in children)
    return deepest
