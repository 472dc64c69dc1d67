"""hdmf-zarr (NWB on Zarr v2): Zarr v2 plus the reserved attributes hdmf-zarr writes.

These are the conventions of hdmf-zarr before 0.14 (the Zarr v2 releases); 0.14 moved to Zarr
v3 and renamed them ``_LINKS``/``_DTYPE``. In a folder's ``.zattrs``:

- ``zarr_link``: a list of links, each ``{"name", "source", "path"}`` (hdmf-zarr may add
  ``object_id``/``source_object_id``). ``source`` is ``"."`` for the same store, else the other
  store's path relative to this one (hdmf-zarr writes ``os.path.relpath`` of it, never an
  absolute path: a store that names ``/home/x/other.zarr`` breaks once copied, so it is
  refused); ``path`` is the target's path inside that store (``"/general/devices/x"``).
- ``zarr_dtype``: on datasets; ``"object"`` (references), ``"scalar"``, a name of hdmf-zarr's
  type mapping (``ZarrIO.__dtypes``: ``"float32"``, ``"text"``, ``"isodatetime"``...), the
  ``__name__`` of the Python or numpy type it resolved (``"float64"``, ``"str_"``), the numpy
  type string its iterative writer stores (``"<f8"``, ``"|S0"``), or for compound data a list
  of ``{"name", "dtype"}`` objects whose string dtypes come from the same set. Any other
  string (``"bogus"``) is refused: hdmf-zarr never writes it and hdmf cannot map it.
- ``.specloc``: on the root group; the path of the group that caches the schema.

Typed objects also carry ``namespace`` and ``neurodata_type``; either that pair or one of the
reserved names marks a folder as hdmf-zarr. Object arrays of references use numcodecs Pickle
(hdmf-zarr's default) or JSON; their chunks are checked by :mod:`n5fs.codecs.v2_pipeline`,
never unpickled. A pickled reference names hdmf-zarr's ``ZarrReference`` class, which every
Zarr v2 object array allows (:data:`~n5fs.formats.zarr2.REFERENCE_PICKLE_GLOBALS`: ``cp -r``
may copy a reference chunk before any hdmf-zarr mark of its hierarchy).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from n5fs.errors import InvalidKey, NotSupported, Rejected
from n5fs.formats.zarr2 import (
    Zarr2ArrayNode,
    Zarr2AttrsNode,
    Zarr2ConsolidatedNode,
    Zarr2Format,
    Zarr2GroupNode,
    load_json,
)
from n5fs.kvstore.keys import check_key

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from n5fs.formats.base import Node

RESERVED_ATTRIBUTES = ("zarr_link", "zarr_dtype", ".specloc")
SAME_STORE = "."
#: an absolute path (POSIX, Windows drive or UNC) or a URL: never what hdmf-zarr writes
_ABSOLUTE_SOURCE = re.compile(r"[/\\]|[A-Za-z]:[/\\]|[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True, slots=True)
class HdmfLink:
    """One ``zarr_link`` entry."""

    name: str
    source: str
    path: str

    @property
    def internal(self) -> bool:
        """Does the link point into the same store (``source`` ``"."``)?"""
        return self.source == SAME_STORE

    @property
    def target(self) -> str:
        """The target's key prefix relative to its store's root (``""`` is the root)."""
        return _store_path(self.path)


def _store_path(path: str) -> str:
    """``"/general//devices/"`` -> ``"general/devices"``; ``.``/``..`` are kept for the check."""
    return "/".join(part for part in path.split("/") if part)


def _bad(rule: str, message: str) -> Rejected:
    return Rejected(message, fmt=HdmfZarrFormat.name, rule=rule)


def _link(entry: Any, index: int) -> HdmfLink:
    fields = ("name", "source", "path")
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in fields):
        raise _bad(
            "zarr-link",
            f"zarr_link[{index}] must be an object with string 'name', "
            f"'source' and 'path', got {entry!r:.80}",
        )
    link = HdmfLink(entry["name"], entry["source"], entry["path"])
    if _ABSOLUTE_SOURCE.match(link.source):
        raise _bad(
            "zarr-link",
            f"zarr_link[{index}] source {link.source[:80]!r} is absolute; hdmf-zarr names the "
            "file a link reaches relative to this file's root ('.' for the same file)",
        )
    if not link.name or "/" in link.name or link.name in (".", "..") or "\x00" in link.name:
        raise _bad(
            "zarr-link", f"zarr_link[{index}] name {link.name!r} is not a single path segment"
        )
    if link.internal and link.target:
        _check_inside(link.target, f"zarr_link[{index}] path {link.path!r}", "zarr-link")
    return link


def _check_inside(target: str, what: str, rule: str) -> None:
    """A same-store path must stay inside the store (no ``..`` past the root, no NUL)."""
    try:
        check_key(target)
    except InvalidKey as exc:
        raise _bad(rule, f"{what} does not name a place inside the store") from exc


def parse_links(attrs: Mapping[str, Any]) -> tuple[HdmfLink, ...]:
    """The links of a ``.zattrs`` document, checked; names must be unique."""
    entries = attrs.get("zarr_link", [])
    if not isinstance(entries, list):
        raise _bad(
            "zarr-link", f"zarr_link must be a list of link objects, got {type(entries).__name__}"
        )
    links = tuple(_link(entry, i) for i, entry in enumerate(entries))
    names = [link.name for link in links]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _bad("zarr-link", f"zarr_link names must be unique; repeated: {duplicates}")
    return links


def link_targets(attrs: Mapping[str, Any]) -> dict[str, str]:
    """Same-store links of a ``.zattrs``: link name -> target path relative to the store root.

    Links into other stores (``source`` not ``"."``) are left out: no path inside this store
    reaches them. :func:`parse_links` returns them too.
    """
    return {link.name: link.target for link in parse_links(attrs) if link.internal}


def symlink_target(folder: str, target: str) -> str:
    """What a symlink at ``folder/<name>`` should hold to reach store path ``target``."""
    return posixpath.relpath("/" + target, "/" + folder)


def with_link(attrs: Mapping[str, Any], name: str, target: str) -> dict[str, Any]:
    """``attrs`` plus (or with a replaced) same-store link ``name`` -> ``target``, as hdmf-zarr
    writes it; for ``ln -s`` inside a store. The result is checked."""
    kept = (
        [e for e in attrs.get("zarr_link", []) if e["name"] != name] if parse_links(attrs) else []
    )
    out = {
        **attrs,
        "zarr_link": [
            *kept,
            {"name": name, "source": SAME_STORE, "path": "/" + _store_path(target)},
        ],
    }
    check_reserved(out)
    return out


def check_reserved(attrs: Mapping[str, Any]) -> None:
    """Refuse malformed hdmf-zarr reserved attributes; any other attribute is free."""
    if "zarr_link" in attrs:
        parse_links(attrs)
    if "zarr_dtype" in attrs:
        _check_zarr_dtype(attrs["zarr_dtype"])
    if ".specloc" in attrs:
        spec = attrs[".specloc"]
        if not isinstance(spec, str) or not spec.strip("/"):
            raise _bad("specloc", f".specloc must name a group path, got {spec!r:.60}")
        _check_inside(_store_path(spec), f".specloc {spec!r}", "specloc")


#: hdmf-zarr's own markers: a scalar dataset, a dataset of references
ZARR_DTYPE_MARKERS = ("scalar", "object")
#: the keys of hdmf-zarr's type mapping (``ZarrIO.__dtypes``), the spec names it resolves
ZARR_DTYPE_NAMES = (
    "float", "float32", "double", "float64", "long", "int64", "uint64", "int", "int32",
    "int16", "int8", "bool", "bool_", "text", "utf", "utf8", "utf-8", "ascii", "bytes",
    "str", "isodatetime", "string_", "uint32", "uint16", "uint8", "ref", "reference",
    "object",
)  # fmt: skip
#: ``__name__`` of the Python and numpy types hdmf-zarr's ``__serial_dtype__`` records for data
#: it typed itself (``type(value).__name__``, ``np.dtype(...).type.__name__``), numpy 1 and 2
NUMPY_TYPE_NAMES = (
    "complex", "bool", "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "longlong", "ulonglong", "float16", "float32", "float64", "float96", "float128",
    "longdouble", "complex64", "complex128", "complex192", "complex256", "clongdouble",
    "str_", "bytes_", "object_", "void", "datetime64", "timedelta64",
)  # fmt: skip
#: ``np.dtype(...).str``, which hdmf-zarr's iterative (data chunk iterator) writer stores:
#: byte order, kind, item size (``"<f8"``, ``"|b1"``, ``"<U0"``, ``"|O"``, ``"<M8[ns]"``)
_NUMPY_TYPESTR = re.compile(r"[<>|](?:O|[biufcSUV][0-9]+|[mM]8(?:\[[0-9]*[A-Za-z]+\])?)")
_ZARR_DTYPE_STRINGS = frozenset((*ZARR_DTYPE_MARKERS, *ZARR_DTYPE_NAMES, *NUMPY_TYPE_NAMES))


def known_zarr_dtype(name: str) -> bool:
    """Is ``name`` a ``zarr_dtype`` string hdmf-zarr writes (and hdmf can map)?"""
    return name in _ZARR_DTYPE_STRINGS or _NUMPY_TYPESTR.fullmatch(name) is not None


_ALLOWED_TEXT = (
    f"{', '.join(map(repr, dict.fromkeys((*ZARR_DTYPE_MARKERS, *ZARR_DTYPE_NAMES))))}; "
    "a Python or numpy type name ("
    f"{', '.join(repr(n) for n in NUMPY_TYPE_NAMES if n not in ZARR_DTYPE_NAMES)}); "
    "or a numpy type string such as '<f8', '|u1', '<U12', '|O'"
)


def _unknown_zarr_dtype(name: str, where: str) -> Rejected:
    return _bad(
        "zarr-dtype",
        f"{where} {name[:80]!r} is not a type hdmf-zarr writes; allowed: {_ALLOWED_TEXT}",
    )


def _check_zarr_dtype(value: Any) -> None:
    if isinstance(value, str) and value:
        if not known_zarr_dtype(value):
            raise _unknown_zarr_dtype(value, "zarr_dtype")
        return
    if isinstance(value, list) and all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and "dtype" in f for f in value
    ):
        for field in value:
            dtype = field["dtype"]
            if isinstance(dtype, str) and not known_zarr_dtype(dtype):
                raise _unknown_zarr_dtype(dtype, f"zarr_dtype field {field['name'][:40]!r} dtype")
        return
    raise _bad(
        "zarr-dtype",
        "zarr_dtype must be a type name or a list of {'name', 'dtype'} "
        f"objects, got {value!r:.80}",
    )


def is_hdmf_attrs(attrs: Any) -> bool:
    """Do these attributes carry hdmf-zarr's marks (a reserved name, or namespace + type)?"""
    if not isinstance(attrs, dict):
        return False
    return any(k in attrs for k in RESERVED_ATTRIBUTES) or (
        "namespace" in attrs and "neurodata_type" in attrs
    )


# --- nodes and format -----------------------------------------------------------------------


@dataclass(frozen=True)
class HdmfArrayNode(Zarr2ArrayNode):
    fmt: ClassVar[str] = "hdmf-zarr"


@dataclass(frozen=True)
class HdmfGroupNode(Zarr2GroupNode):
    fmt: ClassVar[str] = "hdmf-zarr"

    @property
    def links(self) -> dict[str, str]:
        """Same-store links of this group (name -> store-relative target)."""
        return link_targets(self.attrs)


@dataclass(frozen=True)
class HdmfAttrsNode(Zarr2AttrsNode):
    fmt: ClassVar[str] = "hdmf-zarr"

    @property
    def links(self) -> dict[str, str]:
        return link_targets(self.raw)


@dataclass(frozen=True)
class HdmfConsolidatedNode(Zarr2ConsolidatedNode):
    fmt: ClassVar[str] = "hdmf-zarr"


class HdmfZarrFormat(Zarr2Format):
    """Zarr v2 whose ``.zattrs`` carry hdmf-zarr's reserved attributes, checked when present."""

    name: ClassVar[str] = "hdmf-zarr"
    refines: ClassVar[str | None] = "zarr2"
    array_node: ClassVar[type[Zarr2ArrayNode]] = HdmfArrayNode
    group_node: ClassVar[type[Zarr2GroupNode]] = HdmfGroupNode
    attrs_node: ClassVar[type[Zarr2AttrsNode]] = HdmfAttrsNode
    consolidated_node: ClassVar[type[Zarr2ConsolidatedNode]] = HdmfConsolidatedNode

    def claims(self, name: str, context: str | None, load: Callable[[], bytes]) -> bool:
        """Zarr v2's names inside an hdmf-zarr hierarchy, and a ``.zattrs`` carrying
        hdmf-zarr's marks anywhere (it makes its folder hdmf-zarr)."""
        if name not in self.metadata_names:
            return False
        if context == self.name:
            return True
        if name != ".zattrs":
            return False
        try:
            return is_hdmf_attrs(load_json(load()))
        except Rejected:
            return False  # not JSON: Zarr v2's claim refuses it

    def links(self, node: Node | None) -> dict[str, str]:
        """Same-store links of an hdmf-zarr group: name -> target's store path (``""`` the
        root, no trailing ``/``). Arrays have none: hdmf-zarr links only from groups."""
        return link_targets(node.attrs) if isinstance(node, HdmfGroupNode) else {}

    def link_update(self, node: Node | None, name: str, target: str | None) -> tuple[str, bytes]:
        """The group's ``.zattrs`` with link ``name`` -> ``target`` (a store path, resolved and
        checked inside the store by the caller) added or replaced, or removed when ``target``
        is None; laid out as the gateway always wrote it (``json.dumps(doc, indent=2)``)."""
        if not isinstance(node, HdmfGroupNode):
            raise NotSupported(
                "symlinks exist only as hdmf-zarr links, in an hdmf-zarr group's folder"
            )
        if target is not None:
            doc = with_link(node.attrs, name, target)
        else:
            doc = dict(node.attrs)
            entries = doc.get("zarr_link", [])
            doc["zarr_link"] = [e for e in entries if e["name"] != name]  # checked on parse
        return ".zattrs", json.dumps(doc, indent=2).encode()

    def matches(self, probes: Mapping[str, bytes]) -> bool:
        """Zarr v2, and the folder's ``.zattrs`` carries hdmf-zarr's marks."""
        if not super().matches(probes) or ".zattrs" not in probes:
            return False
        try:
            return is_hdmf_attrs(load_json(probes[".zattrs"]))
        except Rejected:
            return False

    def check_attributes(self, attrs: dict[str, Any]) -> dict[str, Any]:
        check_reserved(attrs)
        return attrs
