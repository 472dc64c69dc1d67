"""The formats n5fs knows, in probe order, and lookups by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from n5fs.formats.hdmf import HdmfZarrFormat
from n5fs.formats.n5 import N5Format
from n5fs.formats.zarr2 import Zarr2Format
from n5fs.formats.zarr3 import Zarr3Format

if TYPE_CHECKING:
    from n5fs.formats.base import Consolidation, Format

FORMATS: tuple[Format, ...] = (N5Format(), Zarr2Format(), HdmfZarrFormat(), Zarr3Format())

_BY_NAME = {fmt.name: fmt for fmt in FORMATS}

# Import-time check (ratarmount's habit): a format that probes nothing could never be detected.
for _fmt in FORMATS:
    assert _fmt.probe_names, f"format {_fmt.name!r} declares no probe names"
    assert _fmt.refines is None or _fmt.refines in _BY_NAME, f"{_fmt.name!r} refines unknown"

#: every relative name any format probes: detection fetches these once per folder
PROBE_NAMES: frozenset[str] = frozenset().union(*(f.probe_names for f in FORMATS))
#: every name that is metadata in some format (a commit of one invalidates detection)
METADATA_NAMES: frozenset[str] = frozenset().union(*(f.metadata_names for f in FORMATS))

#: the distinct ways formats keep consolidated metadata (hdmf-zarr shares Zarr v2's)
CONSOLIDATIONS: tuple[Consolidation, ...] = tuple(
    {id(f.consolidation): f.consolidation for f in FORMATS if f.consolidation is not None}.values()
)


def get_format(name: str) -> Format:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known: {', '.join(_BY_NAME)}") from None
