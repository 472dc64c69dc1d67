"""Bytes by key: the bottom layer. ``open_store`` takes a URL, a JSON spec, or a StoreSpec."""

from __future__ import annotations

from n5fs.kvstore.base import ByteRange, KeyInfo, KvStore, Listing
from n5fs.kvstore.registry import open_spec, register_driver
from n5fs.kvstore.spec import StoreSpec, parse_spec, parse_url

__all__ = [
    "ByteRange",
    "KeyInfo",
    "KvStore",
    "Listing",
    "StoreSpec",
    "open_store",
    "parse_spec",
    "parse_url",
    "register_driver",
]


def open_store(source: object, *, read_only: bool = False) -> KvStore:
    """Open the store a URL (``s3://b/p/``, ``file:///x.zip|zip:``, a bare path), a JSON
    spec (dict or text) or a StoreSpec names; ``read_only`` wraps it so mutations raise EROFS."""
    store = open_spec(parse_spec(source))
    if read_only:
        from n5fs.kvstore.wrappers import ReadOnlyStore

        return ReadOnlyStore(store)
    return store
