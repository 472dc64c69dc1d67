"""Views: the store shown in another format, translated on the fly (``--as``).

``native`` (the default) is the store as it is: the gateway itself. ``zarr3`` and ``zarr2``
show every N5 dataset and every Zarr array of the other version as a Zarr array of that
version (:mod:`n5fs.views.zarr`); ``npy`` shows every array as one ``.npy`` file
(:mod:`n5fs.views.npy`); ``n5`` shows every numeric Zarr array as an N5 dataset
(:mod:`n5fs.views.n5`). A view sits between the gateway and the FUSE front
(:class:`~n5fs.views.base.View`). The Zarr views of an N5 hierarchy and the N5 view of a Zarr
hierarchy take writes, which land in the store's own format (:mod:`n5fs.views.writes`,
:mod:`n5fs.views.n5_writes`); every other view answers EROFS.

This module stays light (the CLI reads ``--as`` with it before anything is mounted); the
views themselves are imported when one is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from n5fs.errors import InvalidSource

if TYPE_CHECKING:
    from n5fs.gateway import Gateway
    from n5fs.views.base import View
    from n5fs.views.tree import ViewTree

__all__ = ["NATIVE", "VIEW_FORMATS", "make_tree", "open_view", "parse_view"]

NATIVE = "native"
#: what ``--as`` accepts
VIEW_FORMATS = (NATIVE, "zarr3", "zarr2", "npy", "n5")


def parse_view(text: str) -> str:
    """``--as`` / ``-o as=`` / ``as = "..."``: one of :data:`VIEW_FORMATS`."""
    value = text.strip().lower()
    if value not in VIEW_FORMATS:
        raise InvalidSource(f"unknown view {text!r}: --as takes {', '.join(VIEW_FORMATS)}")
    return value


def make_tree(gateway: Gateway, fmt: str) -> ViewTree:
    """The namespace of view ``fmt`` (not ``native``) over ``gateway``."""
    from n5fs.views.access import StoreAccess
    from n5fs.views.n5 import N5Tree
    from n5fs.views.npy import NpyTree
    from n5fs.views.zarr import ZarrTree

    fmt = parse_view(fmt)
    if fmt == NATIVE:
        raise ValueError("the native view is the gateway itself")
    access = StoreAccess(gateway)
    if fmt == "n5":
        return N5Tree(access)
    return NpyTree(access) if fmt == "npy" else ZarrTree(access, fmt)


def open_view(gateway: Gateway, fmt: str) -> View:
    """The store behind ``gateway`` as ``fmt`` shows it (writable where the view can be)."""
    from n5fs.views.base import View

    return View(gateway, make_tree(gateway, fmt))
