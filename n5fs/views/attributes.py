"""Attributes across the N5 and Zarr views: N5's keys keep their meaning, nothing is lost.

N5 keeps a node's attributes in the same JSON object as keys its readers give a meaning to:
the dataset keys (``dimensions``, ``blockSize``, ``dataType``, ``compression``, version 0's
``compressionType``) and the root's version ``n5``, and the conventions TensorStore,
neuroglancer, n5-viewer and BigDataViewer read (``units``, ``resolution``, ``axes``,
``downsamplingFactors``, ``pixelResolution``). A Zarr attribute of such a name copied as it
is can make the dataset unreadable (TensorStore's n5 driver refuses ``"units": "counts"``) or
something else (four user attributes named like the dataset keys turn a group into a
dataset). So :func:`to_n5` moves every Zarr attribute that does not *fit* its N5 key into one
object under :data:`NAMESPACE`, and :func:`from_n5` puts them back, unchanged.

What fits (``rank``: the array's; a group has none, so no length is checked):

- the dataset keys, ``compressionType``, ``n5`` and :data:`NAMESPACE` itself: never (they
  are N5's own, or the namespace's);
- ``units``: strings, one per axis; ``resolution``: finite numbers (no booleans), one per
  axis (TensorStore reads both, and refuses any other shape);
- ``axes``: strings, one per axis, the non-empty ones distinct (TensorStore's labels;
  neuroglancer's dimension names);
- ``downsamplingFactors``: finite numbers, one per axis (n5-viewer's scale datasets); on a
  group also a list of such lists, one per scale (BigDataViewer's and neuroglancer's
  multiscale groups);
- ``pixelResolution``: ``{"dimensions": [numbers, one per axis], "unit": str}`` (n5-viewer),
  or the older plain list of numbers, one per axis.

Axis order. N5 lists the fastest-varying axis first, the views reverse the axes, and each
format's per-axis metadata follows its own axes: TensorStore writes the same array's labels
and units as zarr3 ``dimension_names`` (and ``dimension_units``) in Zarr order and as N5
``axes``/``units``/``resolution`` in N5 order. So a fitting per-axis list is reversed on the
way across, both ways (``pixelResolution``'s ``dimensions``; each scale of a group's
``downsamplingFactors``), and keeps naming the same axis.

Axis names. A Zarr v3 array's ``dimension_names`` are N5's ``axes``, reversed, a ``null``
name as ``""`` (TensorStore's unlabeled axis in both formats); names that repeat have no N5
form (TensorStore refuses repeated labels): no ``axes`` then. On such an array an attribute
named ``axes`` always goes to the namespace, so that N5's ``axes`` come back as
``dimension_names`` and the attribute as itself. A Zarr v2 array and every group have no
``dimension_names``: there a fitting ``axes`` attribute is N5's ``axes``, reversed.

Round trips. ``from_n5(to_n5(a))`` is ``a`` for any Zarr attributes (and ``dimension_names``
without repeats); ``to_n5(from_n5(n))`` is ``n`` for the attributes ``to_n5`` makes. An N5
attribute of a conventional name that does not fit shows in Zarr as it is, and a Zarr writer
that writes it back moves it into the namespace. A namespaced attribute wins over a key of
the same name outside it; a :data:`NAMESPACE` that is no JSON object is an ordinary attribute.

Pure functions of JSON values: no state, no locks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from n5fs.formats.n5 import DATASET_KEYS, VERSION0_COMPRESSION_KEY, VERSION_KEY

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: the key of the N5 attribute that holds the Zarr attributes N5 keeps a meaning for
NAMESPACE = "zarr_attributes"
#: keys that are N5's own: never a user attribute outside the namespace
RESERVED = frozenset((*DATASET_KEYS, VERSION0_COMPRESSION_KEY, VERSION_KEY, NAMESPACE))
AXES = "axes"
#: the conventions N5 readers give a meaning to, each a per-axis value
CONVENTIONS = ("units", "resolution", AXES, "downsamplingFactors", "pixelResolution")

DimensionNames = tuple[str | None, ...]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _per_axis(value: Any, rank: int | None, item: str) -> bool:
    """Is ``value`` a list of ``item`` ("str" or "number"), one per axis?"""
    if not isinstance(value, list) or (rank is not None and len(value) != rank):
        return False
    check = _number if item == "number" else (lambda v: isinstance(v, str))
    return all(check(v) for v in value)


def fits(key: str, value: Any, rank: int | None) -> bool:
    """Does ``value`` mean to N5's readers what ``key`` means to them (module docs)?"""
    if key in RESERVED:
        return False
    if key == "units":
        return _per_axis(value, rank, "str")
    if key == "resolution":
        return _per_axis(value, rank, "number")
    if key == AXES:
        named = [v for v in value if v] if _per_axis(value, rank, "str") else None
        return named is not None and len(set(named)) == len(named)
    if key == "downsamplingFactors":
        if _per_axis(value, rank, "number"):
            return True
        scales = rank is None and isinstance(value, list) and value
        return bool(scales) and all(_per_axis(s, None, "number") for s in value)
    if key == "pixelResolution":
        if isinstance(value, dict):
            unit = isinstance(value.get("unit"), str)
            return unit and _per_axis(value.get("dimensions"), rank, "number")
        return _per_axis(value, rank, "number")
    return True


def _reversed(key: str, value: Any) -> Any:
    """A fitting per-axis ``value`` in the other format's axis order."""
    if key == "pixelResolution" and isinstance(value, dict):
        return {**value, "dimensions": value["dimensions"][::-1]}
    if key == "downsamplingFactors" and value and isinstance(value[0], list):
        return [scale[::-1] for scale in value]
    return value[::-1]


def to_n5(
    attrs: Mapping[str, Any],
    rank: int | None = None,
    dimension_names: Sequence[str | None] | None = None,
    *,
    named: bool = False,
) -> dict[str, Any]:
    """The N5 attributes for Zarr ``attrs`` (``rank``: an array's; ``named``: a Zarr v3 array,
    whose axis names are its ``dimension_names``)."""
    out: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for key, value in attrs.items():
        if key in RESERVED or (named and key == AXES):
            kept[key] = value
        elif key in CONVENTIONS:
            if fits(key, value, rank):
                out[key] = _reversed(key, value)
            else:
                kept[key] = value
        else:
            out[key] = value
    if named and dimension_names is not None:
        axes = ["" if name is None else name for name in dimension_names[::-1]]
        if fits(AXES, axes, rank):
            out[AXES] = axes
    if kept:
        out[NAMESPACE] = kept
    return out


def from_n5(
    attrs: Mapping[str, Any], rank: int | None = None, *, named: bool = False
) -> tuple[dict[str, Any], DimensionNames | None]:
    """The Zarr attributes for N5 ``attrs``, and (``named``: for a Zarr v3 array) the
    ``dimension_names`` its ``axes`` are (None: no ``axes`` that fit). N5's own keys (the
    dataset keys, the version) are no attributes: they are left out."""
    out: dict[str, Any] = {}
    names: DimensionNames | None = None
    namespace = attrs.get(NAMESPACE)
    for key, value in attrs.items():
        if key in RESERVED and (key != NAMESPACE or isinstance(namespace, dict)):
            continue
        if key in CONVENTIONS and fits(key, value, rank):
            if named and key == AXES:
                names = tuple(name or None for name in value[::-1])
                continue
            value = _reversed(key, value)
        out[key] = value
    if isinstance(namespace, dict):
        out.update(namespace)
    return out, names
