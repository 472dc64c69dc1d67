"""n5fs: mount any key-value store of chunked array data as a directory tree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "open_store"]

if TYPE_CHECKING:
    from n5fs.kvstore import open_store


def __getattr__(name: str) -> Any:
    # Lazy: `import n5fs` must stay cheap (the CLI's --help, the FUSE front's workers).
    if name == "open_store":
        from n5fs.kvstore import open_store

        return open_store
    raise AttributeError(f"module 'n5fs' has no attribute {name!r}")
