"""Key grammar, checked in one place.

Keys are ``/``-separated, relative, and never hold empty, ``.`` or ``..`` segments or NUL.
A bad key is a bug upstream (path traversal), not an input to tolerate, so it raises.
Prefixes are ``""`` (the whole store) or a key-like string; a trailing ``/`` is allowed.
Use ``str.removesuffix``/``removeprefix`` for names: ``rstrip(".json")`` strips characters.
"""

from __future__ import annotations

from n5fs.errors import InvalidKey

_BAD_SEGMENTS = frozenset(("", ".", ".."))


def check_key(key: str) -> str:
    """Return ``key`` unchanged if it is a valid object key, else raise InvalidKey."""
    if not key:
        raise InvalidKey(key, "empty")
    if "\x00" in key:
        raise InvalidKey(key, "NUL byte")
    if not _BAD_SEGMENTS.isdisjoint(key.split("/")):  # (every FUSE call checks a few keys)
        # A leading "/" or "//" yields an empty segment; "." and ".." would escape or alias.
        raise InvalidKey(key, "absolute, empty, '.' or '..' segment")
    return key


def check_prefix(prefix: str) -> str:
    """Like check_key, but ``""`` and one trailing ``/`` are allowed."""
    if prefix == "":
        return prefix
    check_key(prefix.removesuffix("/") if prefix.endswith("/") else prefix)
    return prefix


def dir_prefix(prefix: str) -> str:
    """``"a/b"`` -> ``"a/b/"``; ``""`` stays ``""``."""
    check_prefix(prefix)
    return prefix if prefix == "" or prefix.endswith("/") else prefix + "/"


def join(*parts: str) -> str:
    """Join non-empty parts with ``/``; the result is checked."""
    return check_key("/".join(p.strip("/") for p in parts if p.strip("/")))


def parent(key: str) -> str:
    """``"a/b/c"`` -> ``"a/b"``; a top-level key's parent is ``""``."""
    return key.rpartition("/")[0]


def folder_of(key: str) -> str:
    """The folder prefix holding ``key``: ``"a/b/c"`` -> ``"a/b/"``, ``"c"`` -> ``""``.
    ``dir_prefix(parent(key))`` without checking again a key checked where it came in (every
    lookup asks this of a few keys; the check was a third of a lookup's Python time)."""
    head = key.rpartition("/")[0]
    return head + "/" if head else ""


def folders_above(key: str) -> list[str]:
    """``"a/b/c"`` -> ``["", "a/", "a/b/"]``: every folder above ``key``, the root first."""
    out = []
    folder = parent(key)
    while folder:
        out.append(folder + "/")
        folder = parent(folder)
    out.append("")
    return out[::-1]


def basename(key: str) -> str:
    return key.rpartition("/")[2]


def split_path(path: str) -> tuple[str, str]:
    """Split a spec path into (directory prefix with trailing ``/`` or ``""``, leaf name)."""
    head, slash, leaf = path.rstrip("/").rpartition("/")
    if slash and not head:
        return "/", leaf  # "/tmp": the leaf sits in the filesystem root
    return (head + "/" if head else ""), leaf
