"""One error tree for all of n5fs, with the errno each error means on a mount.

Every class derives from the builtin that callers already catch (``FileNotFoundError``,
``PermissionError``, ``ValueError`` ...) so plain Python code keeps working, and carries its
errno on the class so the FUSE front maps any error to an errno in one place.
Beware: ``KeyNotFound("k").errno`` is ``None`` (the builtin's slot); use :func:`errno_of`.
"""

from __future__ import annotations

import errno
from typing import ClassVar


class N5fsError(Exception):
    """Base of every n5fs error; a bare one means an I/O failure."""

    errno_code: ClassVar[int] = errno.EIO
    #: an answer the caller acts on, not a fault: the FUSE front logs it at DEBUG
    quiet: ClassVar[bool] = False


class InvalidKey(N5fsError, ValueError):
    """A key that could escape the store: empty, absolute, ``.``/``..`` segments, NUL."""

    errno_code = errno.EINVAL

    def __init__(self, key: str, reason: str = "") -> None:
        self.key = key
        detail = f": {reason}" if reason else ""
        super().__init__(f"invalid key {key!r}{detail}")


class InvalidSource(N5fsError, ValueError):
    """A URL, JSON spec or config that names no usable store."""

    errno_code = errno.EINVAL


class KeyNotFound(N5fsError, FileNotFoundError):
    errno_code = errno.ENOENT


class KeyExists(N5fsError, FileExistsError):
    errno_code = errno.EEXIST


class IsAPrefix(N5fsError, IsADirectoryError):
    """A key names a prefix (a directory) where an object was expected."""

    errno_code = errno.EISDIR


class NotAPrefix(N5fsError, NotADirectoryError):
    """A key would need an existing object to be a prefix (file store: a file in the way)."""

    errno_code = errno.ENOTDIR


class PrefixNotEmpty(N5fsError, OSError):
    errno_code = errno.ENOTEMPTY


class ReadOnly(N5fsError, PermissionError):
    """A mutation of a read-only store or mount."""

    errno_code = errno.EROFS


class AccessDenied(N5fsError, PermissionError):
    """The backend refused the credentials."""

    errno_code = errno.EACCES


class StoreUnavailable(N5fsError, ConnectionError):
    """The backend could not be reached or kept failing after retries."""

    errno_code = errno.EIO


class UploadsPending(StoreUnavailable):
    """Writes a write-back mount accepted could not be uploaded yet: they stay journaled on
    local disk and are tried again (an ``fsync`` or unmount that waited for them fails)."""


class StoreCorrupt(N5fsError, OSError):
    """The backend answered, but with bytes that break its own container (a broken zip)."""

    errno_code = errno.EIO


class NotSupported(N5fsError, OSError):
    """The store cannot do this operation at all."""

    errno_code = errno.ENOTSUP


class FileTooLarge(N5fsError, OSError):
    """A write or truncate that would grow a file past the mount's ``max_file_size``."""

    errno_code = errno.EFBIG


class NoSpace(N5fsError, OSError):
    """Not enough room to write (a spill directory, the disk under an archive)."""

    errno_code = errno.ENOSPC


class VersionConflict(N5fsError, OSError):
    """A conditional write found another version than it expected: another writer (another
    mount of the same bucket) changed or created the key first. Nothing was stored."""

    errno_code = errno.EAGAIN


class DetectionFailed(N5fsError, ValueError):
    """No format, or more than one, where exactly one is needed; the message names them."""

    errno_code = errno.EIO


class Rejected(N5fsError, ValueError):
    """Content that breaks its format; nothing was stored.

    ``path`` is the key, ``fmt`` the format (``n5``, ``zarr2``, ...), ``rule`` a short stable
    name of the broken rule (for logs, ``/.n5fs/rejections`` and tests).
    """

    errno_code = errno.EINVAL

    def __init__(self, message: str, *, path: str = "", fmt: str = "", rule: str = "") -> None:
        self.path = path
        self.fmt = fmt
        self.rule = rule
        self.message = message
        where = f"{path}: " if path else ""
        tag = f" [{fmt}:{rule}]" if fmt or rule else ""
        super().__init__(f"{where}{message}{tag}")


def errno_of(exc: BaseException) -> int:
    """The errno a failed call answers: ours, else the builtin's, else EIO (never EINVAL)."""
    if isinstance(exc, N5fsError):
        return exc.errno_code
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


class StaleVersion(Rejected):
    """A metadata commit refused because the stored document is no longer the version this
    mount read: another mount changed it since. Nothing was stored; reading the file again
    and retrying the write succeeds (the mount dropped what it cached of the key)."""

    errno_code = errno.EAGAIN


class NothingWritten(Rejected):
    """A close of a new file nothing was written to yet, where the format refuses an empty
    file (a chunk, a metadata document): that ``close()`` answers EINVAL. Not recorded as a
    rejection by itself, and quiet in the log: a descriptor still open on the file may write
    it yet (the shell's ``cmd > chunk`` closes its first descriptor before the command
    writes). The refusal is recorded when the last descriptor closes with nothing written."""

    quiet = True
