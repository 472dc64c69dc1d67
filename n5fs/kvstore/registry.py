"""Driver name -> store class, imported on first use, with an install hint on failure.

Outside packages add drivers through the ``n5fs.kvstore`` entry-point group (value
``"module:Class"``; the class has ``spec_type`` and ``from_spec``) or :func:`register_driver`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from n5fs.errors import InvalidSource

if TYPE_CHECKING:
    from collections.abc import Mapping

    from n5fs.kvstore.base import KvStore
    from n5fs.kvstore.spec import StoreSpec

ENTRY_POINT_GROUP = "n5fs.kvstore"


class DriverClass(Protocol):
    spec_type: type[StoreSpec]

    def from_spec(self, spec: Any) -> KvStore: ...


_DRIVERS: dict[str, tuple[str, str]] = {
    "memory": ("n5fs.kvstore.memory:MemoryStore", ""),
    "file": ("n5fs.kvstore.file:FileStore", ""),
    "s3": ("n5fs.kvstore.s3:S3Store", "pip install boto3"),
    "zip": ("n5fs.kvstore.zip:ZipStore", ""),
}

#: read-only view of the registered drivers: name -> ("module:Class", install hint)
DRIVERS: Mapping[str, tuple[str, str]] = MappingProxyType(_DRIVERS)


def register_driver(name: str, target: str, *, replace: bool = False) -> None:
    """Register ``name`` -> ``"module:Class"``; re-registering another target needs ``replace``."""
    if not replace and _DRIVERS.get(name, (target,))[0] != target:
        raise ValueError(f"kvstore driver {name!r} is already registered")
    _DRIVERS[name] = (target, "")


def _from_entry_points(name: str) -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            register_driver(name, ep.value)
            return


def driver_class(name: str) -> DriverClass:
    if name not in _DRIVERS:
        _from_entry_points(name)
    if name not in _DRIVERS:
        raise InvalidSource(
            f"unknown kvstore driver {name!r}; known: {', '.join(sorted(_DRIVERS))}"
        )
    target, hint = _DRIVERS[name]
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        advice = f" ({hint})" if hint else ""
        raise InvalidSource(f"kvstore driver {name!r} cannot load: {exc}{advice}") from exc
    cls: DriverClass = getattr(module, attr)
    return cls


def open_spec(spec: StoreSpec) -> KvStore:
    return driver_class(spec.driver).from_spec(spec)
