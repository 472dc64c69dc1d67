"""POSIX calls -> gateway calls. Every operation is one gateway call through one funnel.

The funnel (:meth:`N5fsOperations._run`) turns every exception into the errno the table of
``docs/semantics.md`` ("Errors") promises: mfusepy answers any exception that is not an
``OSError`` with EINVAL, which on this filesystem means "content refused", so nothing may
reach it raw. No format knowledge
lives here. Operations n5fs cannot honour are left undefined so libfuse and the kernel do the
right thing themselves: ``flock``/``fcntl`` locks are then kept by the kernel (they exclude
each other between processes of this machine, which is what TensorStore's ``__lock`` files
and ``flock(1)`` need; a ``lock`` callback answering 0 would grant every lock to everyone).
Extended attributes too, but one: n5fs stores none, so for ``getxattr``, ``setxattr`` and
``removexattr`` libfuse answers ENOSYS, and the kernel stops asking for the life of the mount
and tells callers EOPNOTSUPP (``cp -a`` and ``rsync -aX`` take it for "keeps none"). Before,
every ``ls -l`` of a file cost two getxattr round trips (ENODATA was an answer worth asking
again), and every write(2) one (the kernel's ``security.capability`` check). ``listxattr``
answers "none" instead: ``tar --xattrs`` warns about every file whose list it cannot read.
"""

from __future__ import annotations

import errno
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from n5fs.errors import errno_of
from n5fs.fuse_front._lib import (
    FUSE_CAP_NO_OPEN_SUPPORT,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    FuseOSError,
    Operations,
    current_fuse,
    fill_read_buf,
)
from n5fs.fuse_front.attrs import StatMaker
from n5fs.gateway.namespace.paths import CONTROL
from n5fs.gateway.read.reader import PageCache

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from n5fs.gateway import Attr

log = logging.getLogger(__name__)

T = TypeVar("T")

#: answers to questions ("is it there?"), not faults: logged at DEBUG
_QUIET = frozenset({errno.ENOENT, errno.EEXIST})
#: libfuse3 passes "now" and "leave alone" as these nanosecond values (``utimensat(2)``; its
#: seconds are zero then, and mfusepy adds the two fields)
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
_CONTROL_PREFIX = f"/{CONTROL}/"


class GatewayLike(Protocol):
    """The part of :class:`n5fs.gateway.Gateway` the front calls (tests may pass a fake)."""

    read_only: bool

    def stat(self, path: str) -> Attr: ...
    def readdir(self, path: str) -> Sequence[tuple[str, Attr]]: ...
    def readlink(self, path: str) -> str: ...
    def open(self, path: str, flags: int) -> int: ...
    def create(self, path: str, flags: int) -> int: ...
    def read(self, fh: int, size: int, offset: int) -> bytes: ...
    def write(self, fh: int, data: bytes, offset: int) -> int: ...
    def truncate(self, path: str, length: int, fh: int | None = None) -> None: ...
    def flush(self, fh: int) -> None: ...
    def fsync(self, fh: int) -> None: ...
    def release(self, fh: int) -> None: ...
    def unlink(self, path: str) -> None: ...
    def mkdir(self, path: str) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def rename(self, old: str, new: str) -> None: ...
    def link(self, src_path: str, dst_path: str) -> None: ...
    def symlink(self, target: str, path: str) -> None: ...
    def utimens(self, path: str, mtime: float) -> None: ...
    def statfs(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def subscribe(self, callback: Callable[[Sequence[str]], None]) -> None:
        """Call ``callback`` with the absolute paths whose kernel entries went stale, after
        each change took effect (any thread, maybe under the gateway's locks: it must queue,
        never block). Optional: the front looks it up with ``getattr`` (fakes may lack it)."""

    def page_cache(self, fh: int) -> PageCache:
        """What the kernel does with its cached pages of the file ``fh`` opened. Optional,
        as ``subscribe``."""

    def read_fd(self, fh: int, size: int, offset: int) -> int | None:
        """A descriptor libfuse may ``pread`` ``size`` bytes at ``offset`` of ``fh`` from
        itself, None to ask :meth:`read`. Optional, as ``subscribe``."""


class N5fsOperations(Operations):  # type: ignore[misc]  # mfusepy is untyped
    """The FUSE operations of one mount. Thread-safe as far as the gateway is."""

    use_ns = True  # times as integer nanoseconds (mfusepy warns without it)

    def __init__(
        self,
        gateway: GatewayLike,
        *,
        stat: StatMaker | None = None,
        on_init: Callable[[int], None] | None = None,
        on_destroy: Callable[[], None] | None = None,
        settle: Callable[[], object] | None = None,
        zero_opens: bool = False,
    ) -> None:
        self.gateway = gateway
        self._zero_opens_allowed = zero_opens
        self.to_stat = stat or StatMaker(read_only=gateway.read_only)
        self._on_init = on_init
        self._on_destroy = on_destroy
        self._settle = settle
        self._dirs: dict[int, _DirHandle] = {}
        self._dir_fh = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        #: zero-message opens in force (:meth:`engage_zero_opens`): files are read by path;
        #: set once in ``init``, before libfuse hands any request to a thread, then only read
        self.zero_opens = False

    # == the funnel ===============================================================================

    def _run(self, op: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except Exception as exc:
            code = errno_of(exc)  # never EINVAL for a bare exception: that means "refused"
            quiet = code in _QUIET or getattr(exc, "quiet", False)
            level = logging.DEBUG if quiet else logging.WARNING
            log.log(
                level,
                "%s: errno %d (%s): %s",
                op,
                code,
                errno.errorcode.get(code, "?"),
                exc,
                exc_info=code == errno.EIO,
            )
            raise FuseOSError(code) from exc

    def _committing(self, op: str, call: Callable[[], T]) -> T:
        """:meth:`_run` for an operation that may commit: before it answers, the kernel has
        been told what the commit made stale (a refused name, a rewritten ``.zmetadata``), so
        the caller's next call sees the truth. Bounded; see :mod:`n5fs.fuse_front.invalidate`
        for why this wait cannot deadlock here and must never be added to read or write."""
        try:
            return self._run(op, call)
        finally:
            if self._settle is not None:
                self._settle()

    # == metadata =================================================================================

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        return self.to_stat(self.attr(path))

    def attr(self, path: str) -> Attr:
        """What ``getattr`` answers, before it becomes ``st_*`` fields."""
        return self._run("getattr " + path, lambda: self.gateway.stat(path))

    def readlink(self, path: str) -> str:
        return self._run("readlink " + path, lambda: self.gateway.readlink(path))

    def statfs(self, path: str) -> dict[str, int]:
        return self._run("statfs", self.gateway.statfs)

    def chmod(self, path: str, mode: int) -> int:
        return self._accept("chmod", path)

    def chown(self, path: str, uid: int, gid: int) -> int:
        return self._accept("chown", path)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        """Modification times are kept (access times are not): ``rsync -a`` and ``cp -a``
        compare them, so a second run copies nothing."""
        mtime_ns = time.time_ns() if times is None or times[1] == UTIME_NOW else times[1]
        if mtime_ns == UTIME_OMIT:
            return self._accept("utimens", path)
        self._committing(f"utimens {path}", lambda: self.gateway.utimens(path, mtime_ns / 1e9))
        return 0

    def _accept(self, op: str, path: str) -> int:
        """The store keeps no modes, owners or times: accept the change (so ``cp -p``,
        ``rsync -a`` and ``touch`` succeed) once the path is known to exist."""
        self._run(f"{op} {path}", lambda: self.gateway.stat(path))
        return 0

    def listxattr(self, path: str) -> list[str]:
        """None stored (the other xattr calls are left to libfuse: module docstring)."""
        return []

    # == directories ==============================================================================

    def opendir(self, path: str) -> int:
        """Take the listing once; readdir pages through it at the kernel's offsets."""
        entries = self._run("opendir " + path, lambda: self.gateway.readdir(path))
        with self._lock:
            fh = next(self._dir_fh)
            self._dirs[fh] = _DirHandle(entries)
        return fh

    def dir_listing(self, path: str, fh: int, offset: int = 0) -> Sequence[tuple[str, Attr]]:
        """The snapshot of ``fh``; read afresh when the reader starts over (``rewinddir``).
        Attributes stay the gateway's until a readdir-plus request needs them as ``struct
        stat`` (the glue makes them per request: most readdir requests of ``find`` want none)."""
        with self._lock:
            handle = self._dirs.get(fh)
        if handle is None:  # a binding that skips opendir
            return self._run("readdir " + path, lambda: self.gateway.readdir(path))
        if offset == 0 and handle.served:
            handle.entries = self._run("readdir " + path, lambda: self.gateway.readdir(path))
        handle.served = True
        return handle.entries

    def dir_entries(self, path: str, fh: int, offset: int = 0) -> list[tuple[str, dict[str, int]]]:
        """:meth:`dir_listing` with each entry's ``st_*`` dict (fusepy's glue)."""
        return [(name, self.to_stat(attr)) for name, attr in self.dir_listing(path, fh, offset)]

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int] | None, int]]:
        """Names with their attributes, all at once (fusepy's glue; N5fsFUSE pages)."""
        listing = [(name, st, 0) for name, st in self.dir_entries(path, fh)]
        return [(".", None, 0), ("..", None, 0), *listing]

    def releasedir(self, path: str, fh: int) -> int:
        with self._lock:
            self._dirs.pop(fh, None)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._run("mkdir " + path, lambda: self.gateway.mkdir(path))
        return 0

    def rmdir(self, path: str) -> int:
        self._run("rmdir " + path, lambda: self.gateway.rmdir(path))
        return 0

    # == names ====================================================================================

    def unlink(self, path: str) -> int:
        self._committing("unlink " + path, lambda: self.gateway.unlink(path))
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        self._committing(f"rename {old} -> {new}", lambda: self._rename(old, new, flags))
        return 0

    def _rename(self, old: str, new: str, flags: int) -> None:
        if flags & RENAME_EXCHANGE or flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise FuseOSError(errno.EINVAL)  # rename(2): "flags not supported by the fs"
        if flags & RENAME_NOREPLACE and _exists(self.gateway, new):
            raise FuseOSError(errno.EEXIST)
        self.gateway.rename(old, new)

    def link(self, target: str, source: str) -> int:
        """mfusepy's order: ``target`` is the new name, ``source`` the existing file."""
        self._committing(f"link {source} -> {target}", lambda: self.gateway.link(source, target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        """mfusepy's order: ``target`` is the new link's path, ``source`` the text it holds."""
        self._committing(
            f"symlink {target} -> {source}", lambda: self.gateway.symlink(source, target)
        )
        return 0

    # == files ====================================================================================

    def engage_zero_opens(self, kernel_can: bool) -> bool:
        """Called once at init: answer the first open of a file with ENOSYS, after which the
        kernel opens files by itself, sends no OPEN, FLUSH or RELEASE, keeps their pages
        (as ``kernel_cache`` does) and reads by path. Only where the gateway says opens are
        optional (a read-only mount of local files) and the kernel can
        (``FUSE_CAP_NO_OPEN_SUPPORT``), and only with ``kernel_cache`` (a read-only mount's
        default: ``-o auto_cache`` or ``-o direct_io`` keep the opens). Reading 10k small
        files then costs a lookup and a read each instead of four calls."""
        self.zero_opens = kernel_can and bool(getattr(self.gateway, "opens_optional", False))
        return self.zero_opens

    def open(self, path: str, flags: int) -> int:
        if self.zero_opens and not path.startswith(_CONTROL_PREFIX):
            # "opened, and open nothing from now on" (libfuse: zero-message opens); a control
            # entry opened before the first file keeps its handle and direct_io
            raise FuseOSError(errno.ENOSYS)
        return self._run("open " + path, lambda: self.gateway.open(path, flags))

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        return self._run("create " + path, lambda: self.gateway.create(path, flags))

    def direct_io(self, path: str) -> bool:
        """Control files change size between reads: bypass the page cache for them."""
        return path.startswith(_CONTROL_PREFIX)

    def page_cache(self, path: str, fh: int) -> PageCache:
        """What the kernel does with its cached pages of the file ``fh`` opened (the glue sets
        ``direct_io`` or ``keep_cache``): the gateway's answer (:meth:`Gateway.page_cache`);
        libfuse's default (drop them) where it has none. Never raises: the open succeeded."""
        if self.direct_io(path):
            return PageCache.BYPASS
        decide = getattr(self.gateway, "page_cache", None)  # optional: fakes may lack it
        if decide is None:
            return PageCache.DROP
        try:
            return cast("PageCache", decide(fh))
        except Exception:
            log.exception("open %s: cannot tell what to do with cached pages; dropping them", path)
            return PageCache.DROP

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if not fh and self.zero_opens:
            return self._run("read " + path, lambda: self._read_unopened(path, size, offset))
        return self._run("read " + path, lambda: self.gateway.read(fh, size, offset))

    def _read_unopened(self, path: str, size: int, offset: int) -> bytes:
        """The gateway's ``read_unopened``: a control entry, or a file where libfuse calls
        ``read`` instead of ``read_buf`` (present where ``opens_optional`` is true, the only
        gateways zero-message opens are engaged for)."""
        gateway: Any = self.gateway
        return cast("bytes", gateway.read_unopened(path, size, offset))

    def read_buf(self, path: str, bufpp: Any, size: int, offset: int, fh: int) -> int:
        """libfuse's read (it prefers this one): where the gateway reads ``fh`` from a local
        descriptor, libfuse gets the descriptor and reads it itself (no bytes through
        Python); else the bytes :meth:`read` returns."""
        if not fh and self.zero_opens:  # read by path: zero-message opens
            gateway: Any = self.gateway  # has the *_unopened calls (engage_zero_opens)
            fd = self._run("read " + path, lambda: gateway.read_fd_unopened(path, size, offset))
            if fd is None:  # a control entry: rendered
                fill_read_buf(bufpp, data=self.read(path, size, offset, fh))
            else:
                fill_read_buf(bufpp, fd=fd, size=size, offset=offset)
            return 0
        read_fd = getattr(self.gateway, "read_fd", None)  # optional: fakes may lack it
        if read_fd is not None:
            fd = self._run("read " + path, lambda: read_fd(fh, size, offset))
            if fd is not None:
                fill_read_buf(bufpp, fd=fd, size=size, offset=offset)
                return 0
        fill_read_buf(bufpp, data=self.read(path, size, offset, fh))
        return 0

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self._run("write " + path, lambda: self.gateway.write(fh, data, offset))

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._run("truncate " + path, lambda: self.gateway.truncate(path, length, fh))
        return 0

    def flush(self, path: str, fh: int) -> int:
        """Every close() flushes: the commit point, where a refused write answers EINVAL.
        With zero-message opens (a read-only mount: nothing to commit) the kernel is told
        once, by ENOSYS, to send no FLUSH at all."""
        if self.zero_opens:
            raise FuseOSError(errno.ENOSYS)
        self._committing("flush " + path, lambda: self.gateway.flush(fh))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        if not fh and self.zero_opens:
            return 0  # a file the kernel opened itself, on a read-only mount: nothing staged
        self._committing("fsync " + path, lambda: self.gateway.fsync(fh))
        return 0

    def release(self, path: str, fh: int) -> int:
        self._run("release " + path, lambda: self.gateway.release(fh))
        return 0

    # == lifecycle ================================================================================

    def init_with_config(self, conn: Any, config: Any) -> None:
        fuse_ptr = current_fuse()
        if conn is not None:
            log.debug(
                "kernel connection: max_write=%s max_readahead=%s want=%#x",
                conn.max_write,
                conn.max_readahead,
                conn.want,
            )
        kernel_can = conn is not None and bool(conn.capable & FUSE_CAP_NO_OPEN_SUPPORT)
        if self._zero_opens_allowed and self.engage_zero_opens(kernel_can):
            log.info("zero-message opens: the kernel reads files without opening them")
        if self._on_init is not None:
            self._on_init(fuse_ptr)
        sweep = getattr(self.gateway, "sweep_leftovers", None)
        if sweep is not None:
            # What killed writers left (temp files, uploads) goes in the background: the
            # mount answers meanwhile; those files never show in listings anyway.
            threading.Thread(target=sweep, name="n5fs-sweep", daemon=True).start()

    def destroy(self, path: str) -> None:
        """After unmount: commit what is still staged and close the store, once."""
        if self._on_destroy is not None:
            self._on_destroy()
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.gateway.close()
            log.debug("gateway closed")
        except Exception:
            log.exception("closing the store failed; staged writes may be lost")


@dataclass
class _DirHandle:
    entries: Sequence[tuple[str, Attr]]
    served: bool = False


def _exists(gateway: GatewayLike, path: str) -> bool:
    try:
        gateway.stat(path)
    except FileNotFoundError:
        return False
    return True
