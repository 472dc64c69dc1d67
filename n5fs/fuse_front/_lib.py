"""The only import of mfusepy (fallback: fusepy's ``fuse``), and the few libfuse details the
bindings leave out.

Importing this module loads libfuse, so nothing imports it before a mount is asked for
(``n5fs --help`` works without libfuse). libfuse 3 is preferred where both are installed:
mfusepy picks ``libfuse.so.2`` first, which writes in 4 KiB pieces instead of libfuse 3's
1 MiB ones, at a fraction of the throughput (the figures are in ``docs/performance.md``).

:class:`N5fsFUSE` adds what mfusepy's libfuse 3 glue leaves out: readdir hands the kernel
full attributes (READDIRPLUS: ``ls -l`` of 2,000 files costs one getattr instead of 2,001, so
a cold walk that stats every file sends no lookup per file), ``ftruncate`` keeps
its file handle, ``rename`` keeps its ``RENAME_NOREPLACE``/``RENAME_EXCHANGE`` flags (dropping
them would let ``mv -n`` clobber), and each open tells the kernel what to do with the pages it
caches of the file (the operations' ``page_cache``: keep them, ``keep_cache``, when the file
is the version they came from; bypass them, ``direct_io``, for control files, whose size
changes between reads; else drop them, libfuse's default).

:func:`fill_read_buf` answers libfuse's ``read_buf``: for a file the gateway reads from a
local descriptor it hands libfuse that descriptor and offset, and libfuse reads from it into
its own reply buffer in C, outside the GIL. A ``read`` callback would cost a Python bytes
object and two copies of every 128 KiB piece (``os.pread``, then mfusepy's ``memmove``).

:func:`invalidate_path` binds libfuse 3's ``fuse_invalidate_path`` (absent from libfuse 2 and
fusepy: :data:`CAN_INVALIDATE` says which), for :mod:`n5fs.fuse_front.invalidate`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

from n5fs.fuse_front.attrs import BLKSIZE, StatMaker
from n5fs.gateway.namespace.paths import ENCODING, ERRORS, DirListing
from n5fs.gateway.read.reader import PageCache

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from n5fs.gateway import Attr


def _prefer_libfuse3() -> dict[str, str | None]:
    """Point mfusepy at libfuse 3 unless the user chose a library; returns what to restore."""
    keys = ("FUSE_LIBRARY_PATH", "FUSE_LIBRARY_NAME")
    saved = {key: os.environ.get(key) for key in keys}
    if sys.platform.startswith("linux") and not any(saved.values()):
        if ctypes.util.find_library("fuse3"):
            os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
    return saved


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_saved = _prefer_libfuse3()
try:
    import mfusepy as _fuse

    LIBRARY = f"mfusepy {metadata.version('mfusepy')}"
except ImportError:  # pragma: no cover - the fallback binding is not installed in CI
    import fuse as _fuse  # fusepy

    LIBRARY = f"fusepy {metadata.version('fusepy')}"
finally:
    _restore(_saved)

#: the mfusepy releases whose private glue :class:`N5fsFUSE` was written against (pyproject pins
#: the same range); a new major may rename what :func:`check_glue` looks for
SUPPORTED_MFUSEPY = ">=3.0,<4"

#: private module attributes the glue calls or builds on
_GLUE_ATTRS = ("_libfuse", "c_stat", "set_st_attrs", "fuse_version_major", "fuse_version_minor")
#: FUSE methods the glue replaces: mfusepy looks ``<op>_fuse_<major>`` up by name, so a renamed
#: one would leave ours silently unused (``mv -n`` clobbering, ``ls -l`` one getattr per file)
_GLUE_OVERRIDES = ("readdir_fuse_2", "readdir_fuse_3", "truncate_fuse_3", "rename_fuse_3", "open")
#: ctypes structures the glue reads or writes fields of
_GLUE_FIELDS = {"fuse_file_info": ("fh", "direct_io", "keep_cache"), "fuse_context": ("fuse",)}


def _glue_missing(module: Any) -> Iterator[str]:
    name = getattr(module, "__name__", "mfusepy")
    yield from (f"{name}.{attr}" for attr in _GLUE_ATTRS if not hasattr(module, attr))
    fuse_class = getattr(module, "FUSE", None)
    yield from (
        f"{name}.FUSE.{attr}"
        for attr in _GLUE_OVERRIDES
        if not callable(getattr(fuse_class, attr, None))
    )
    for struct, fields in _GLUE_FIELDS.items():
        present = {field[0] for field in getattr(getattr(module, struct, None), "_fields_", ())}
        yield from (f"{name}.{struct}.{field}" for field in fields if field not in present)


def check_glue(module: Any) -> None:
    """Raise ImportError naming every private attribute of mfusepy that :class:`N5fsFUSE`
    overrides or uses and ``module`` lacks: at import, not as a silently plain mount later."""
    missing = list(_glue_missing(module))
    if missing:
        raise ImportError(
            f"{_installed(module)} lacks {', '.join(missing)}, which n5fs's FUSE glue "
            f"overrides or uses; n5fs supports mfusepy {SUPPORTED_MFUSEPY}"
        )


def _installed(module: Any) -> str:
    name = str(getattr(module, "__name__", "mfusepy"))
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


FUSE: Any = _fuse.FUSE
Operations: Any = _fuse.Operations
FuseOSError: type[OSError] = _fuse.FuseOSError
IS_MFUSEPY = _fuse.__name__ == "mfusepy"
if IS_MFUSEPY:
    check_glue(_fuse)


def _libfuse_version() -> tuple[int, int]:
    if IS_MFUSEPY:
        return int(_fuse.fuse_version_major), int(_fuse.fuse_version_minor)
    version = int(_fuse._libfuse.fuse_version())  # fusepy binds libfuse 2 only
    return divmod(version, 10) if version < 100 else divmod(version, 100)


LIBFUSE_VERSION: tuple[int, int] = _libfuse_version()

FUSE_READDIR_PLUS = 1  # libfuse 3 readdir flag: the kernel asked for attributes too
#: ``fuse_conn_info.capable``: an open answered ENOSYS means "opened; send no more opens"
FUSE_CAP_NO_OPEN_SUPPORT = 1 << 17
FUSE_FILL_DIR_PLUS = 2  # filler flag: this entry carries full attributes
_DOT_MODE = 0o040755  # ``.`` and ``..``: a folder (the kernel reads the type alone)
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
#: libfuse's ``enum fuse_buf_flags``: the buffer is a descriptor, read at ``pos``
FUSE_BUF_IS_FD = 1 << 1
FUSE_BUF_FD_SEEK = 1 << 2


class _FuseBuf(ctypes.Structure):
    """libfuse's ``struct fuse_buf`` (libfuse 2.9 to 3.x; later releases append fields)."""

    _fields_ = (
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_int64),  # off_t: libfuse is built with 64-bit offsets
    )


class _FuseBufvec(ctypes.Structure):
    """libfuse's ``struct fuse_bufvec`` with its one inline ``fuse_buf`` (mfusepy declares a
    pointer there, which is not the C layout)."""

    _fields_ = (
        ("count", ctypes.c_size_t),
        ("idx", ctypes.c_size_t),
        ("off", ctypes.c_size_t),
        ("buf", _FuseBuf * 1),
    )


def _bind_libc() -> Any:
    """The C library's allocator: libfuse frees what ``read_buf`` hands it."""
    libc = ctypes.CDLL(None)
    libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.calloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


_libc = _bind_libc()
#: zeroed room past our layout for fields a later libfuse appends to ``struct fuse_buf``
_BUFVEC_BYTES = ctypes.sizeof(_FuseBufvec) + 64


def fill_read_buf(
    bufpp: Any, *, fd: int | None = None, size: int = 0, offset: int = 0, data: bytes = b""
) -> None:
    """Answer ``read_buf``: set ``*bufpp`` to a new ``fuse_bufvec`` holding either ``size``
    bytes of descriptor ``fd`` at ``offset`` (libfuse reads them, a short read at the end of
    the file included) or a copy of ``data``. libfuse frees both allocations after the reply;
    ``fd`` must stay open until then (a release cannot come first: the kernel holds the file
    until the read is answered)."""
    vec_address = _libc.calloc(1, _BUFVEC_BYTES)
    if not vec_address:
        raise MemoryError("no memory for a read reply")
    buf = _FuseBufvec.from_address(vec_address).buf[0]
    if fd is not None:
        buf.size, buf.flags, buf.fd, buf.pos = size, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, fd, offset
    elif data:
        mem = _libc.malloc(len(data))
        if not mem:
            _libc.free(vec_address)
            raise MemoryError("no memory for a read reply")
        ctypes.memmove(mem, data, len(data))
        buf.size, buf.mem = len(data), mem
    _FuseBufvec.from_address(vec_address).count = 1
    ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = vec_address


def describe() -> str:
    """Which binding and libfuse serve the mount, for logs and ``n5fs status``."""
    major, minor = LIBFUSE_VERSION
    return f"{LIBRARY}, libfuse {major}.{minor}"


def current_fuse() -> int:
    """The ``struct fuse *`` of the calling FUSE thread (valid inside a callback only)."""
    context = _fuse._libfuse.fuse_get_context()
    return int(context.contents.fuse or 0)


def _bind_exit_flag() -> Any:
    lib = _fuse._libfuse
    if LIBFUSE_VERSION[0] >= 3:
        lib.fuse_get_session.argtypes = [ctypes.c_void_p]
        lib.fuse_get_session.restype = ctypes.c_void_p
        lib.fuse_session_exited.argtypes = [ctypes.c_void_p]
        lib.fuse_session_exited.restype = ctypes.c_int
        return lambda ptr: lib.fuse_session_exited(lib.fuse_get_session(ptr))
    lib.fuse_exited.argtypes = [ctypes.c_void_p]
    lib.fuse_exited.restype = ctypes.c_int
    return lib.fuse_exited


_exited = _bind_exit_flag()


def loop_exited(fuse_ptr: int) -> bool:
    """Has libfuse been told to leave its loop (its SIGTERM/SIGINT handler ran, or the
    kernel ended the connection)? ``fuse_ptr`` must still be alive (before destroy)."""
    return bool(_exited(ctypes.c_void_p(fuse_ptr)))


def _bind_invalidate() -> Any:
    """libfuse 3's ``int fuse_invalidate_path(struct fuse *, const char *)`` (since 3.2), or
    None: libfuse 2 and fusepy have no way to tell the kernel from the high-level API."""
    if not IS_MFUSEPY or LIBFUSE_VERSION < (3, 2):
        return None
    func = getattr(_fuse._libfuse, "fuse_invalidate_path", None)
    if func is None:  # pragma: no cover - a libfuse 3 built without it
        return None
    func.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    func.restype = ctypes.c_int
    return func


_invalidate = _bind_invalidate()

#: can :func:`invalidate_path` reach the kernel (libfuse >= 3.2 through mfusepy)?
CAN_INVALIDATE = _invalidate is not None


def invalidate_path(fuse_ptr: int, path: str) -> int:
    """Drop the kernel's cached attributes and page cache of ``path`` (an absolute mount
    path). libfuse finds the inode by walking its own node table and sends the kernel
    ``FUSE_NOTIFY_INVAL_INODE``; the dentry itself is not dropped (the high-level API has no
    way to name the parent's inode), so a stale name answers ``getattr`` afresh instead.

    Returns 0, or a negative errno: -ENOENT when libfuse holds no node for the path (nothing
    is cached, nothing to do), -ENOSYS without :data:`CAN_INVALIDATE`. ``fuse_ptr`` must be
    alive (before destroy) and the caller must not run inside a request on the same folder.
    """
    if _invalidate is None:
        return -errno.ENOSYS
    raw = path.encode("utf-8", "surrogateescape")  # as mfusepy decodes the paths it hands us
    return int(_invalidate(ctypes.c_void_p(fuse_ptr), raw))


class DirSource(Protocol):
    """What :class:`N5fsFUSE` needs from the operations object beyond mfusepy's API."""

    to_stat: StatMaker

    def dir_listing(self, path: str, fh: int, offset: int = 0) -> Sequence[tuple[str, Attr]]: ...

    def page_cache(self, path: str, fh: int) -> PageCache: ...

    def attr(self, path: str) -> Attr: ...


def _entries_from(
    ops: DirSource, path: str, fh: int, offset: int
) -> Iterator[tuple[int, str, Attr | None]]:
    """``.``, ``..`` and the snapshot taken at opendir, numbered from 1 so the kernel can
    resume at any offset without the listing being rebuilt (50k entries need ~275 calls)."""
    return _numbered(ops.dir_listing(path, fh, offset), offset)


def _numbered(
    entries: Sequence[tuple[str, Attr]], offset: int
) -> Iterator[tuple[int, str, Attr | None]]:
    """:func:`_entries_from` of a snapshot at hand."""
    if offset < 1:
        yield 1, ".", None
    if offset < 2:
        yield 2, "..", None
    for index in range(max(offset - 2, 0), len(entries)):
        name, attr = entries[index]
        yield index + 3, name, attr


class _StatFiller:
    """Fills one ``struct stat`` field by field: from an entry's :class:`Attr` (readdir-plus;
    ``maker`` says how, as :class:`~n5fs.fuse_front.attrs.StatMaker`'s ``st_*`` dicts do) or
    from such a dict.

    Why: readdir-plus fills one per entry, and a dict per entry handed to mfusepy's generic
    ``set_st_attrs`` (a loop of ``getattr``/``setattr``, a memset included) cost several times
    these assignments, and making the dict as much again. The fields common to
    every entry (owner, block size) are set once; each entry sets all the others, so nothing
    of one entry leaks into the next. A dict of another shape goes to ``set_st_attrs``."""

    _KEYS = frozenset(
        ("st_mode", "st_nlink", "st_size", "st_blocks", "st_blksize", "st_uid", "st_gid",
         "st_atime", "st_mtime", "st_ctime")
    )  # fmt: skip

    def __init__(self, st: Any, maker: StatMaker | None = None) -> None:
        self.st = st
        self.maker = maker
        self.times = (st.st_atimespec, st.st_mtimespec, st.st_ctimespec)  # views into st
        self.dirty = True  # fields other than ours may be set, or ours unset: start over

    def _reset(self, uid: int, gid: int) -> None:
        st = self.st
        ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
        st.st_uid, st.st_gid, st.st_blksize = uid, gid, BLKSIZE
        self.dirty = False

    def __call__(self, attrs: Attr | dict[str, int]) -> None:
        if isinstance(attrs, dict):
            self._fill_dict(attrs)
            return
        maker = self.maker
        assert maker is not None, "an Attr needs the StatMaker"
        if self.dirty:
            self._reset(maker.uid, maker.gid)
        st = self.st
        st.st_mode, st.st_nlink, st.st_size, st.st_blocks, mtime_ns = maker.fields(attrs)
        sec, nsec = divmod(mtime_ns, 1_000_000_000)
        for spec in self.times:
            spec.tv_sec, spec.tv_nsec = sec, nsec

    def _fill_dict(self, attrs: dict[str, int]) -> None:
        if attrs.keys() != self._KEYS:
            ctypes.memset(ctypes.byref(self.st), 0, ctypes.sizeof(self.st))
            _fuse.set_st_attrs(self.st, attrs, use_ns=True)
            self.dirty = True
            return
        if self.dirty:
            self._reset(attrs["st_uid"], attrs["st_gid"])
        st = self.st
        st.st_mode = attrs["st_mode"]
        st.st_nlink = attrs["st_nlink"]
        st.st_size = attrs["st_size"]
        st.st_blocks = attrs["st_blocks"]
        st.st_blksize = attrs["st_blksize"]
        st.st_uid = attrs["st_uid"]
        st.st_gid = attrs["st_gid"]
        atime, mtime, ctime = self.times
        atime.tv_sec, atime.tv_nsec = divmod(attrs["st_atime"], 1_000_000_000)
        mtime.tv_sec, mtime.tv_nsec = divmod(attrs["st_mtime"], 1_000_000_000)
        ctime.tv_sec, ctime.tv_nsec = divmod(attrs["st_ctime"], 1_000_000_000)


#: libfuse >= 3.10 can tell the kernel not to FLUSH a descriptor at close (FOPEN_NOFLUSH)
_NOFLUSH = IS_MFUSEPY and any(f[0] == "noflush" for f in _fuse.fuse_file_info._fields_)

if IS_MFUSEPY:

    class _PlusFUSE(_fuse.FUSE):  # type: ignore[misc]  # mfusepy is untyped
        """mfusepy's FUSE with readdir-plus, ftruncate handles, rename flags and the page
        cache decided per open. Methods named ``*_fuse_3`` replace mfusepy's glue for
        libfuse 3."""

        def _path(self, raw: bytes | None) -> str:
            return "" if raw is None else raw.decode(self.encoding, self.errors)

        def _fill(
            self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any, plus: bool
        ) -> int:
            """Answer one readdir request from the opendir snapshot. Attributes are made only
            for a request that asks for them (READDIRPLUS): for a plain one the kernel reads
            ``st_mode`` alone (the entry's type), so ``find``, which stats nothing, pays for
            no attributes past the first request (the kernel asks for them at offset 0)."""
            ops = self.operations
            st = _fuse.c_stat()
            fill = _StatFiller(st, ops.to_stat)
            mode = ops.to_stat.mode
            encoding, errors = self.encoding, self.errors
            v2 = LIBFUSE_VERSION[0] == 2
            entries = ops.dir_listing(self._path(path), fip.contents.fh, offset)
            if isinstance(entries, DirListing) and (encoding, errors) == (ENCODING, ERRORS):
                return self._fill_listing(entries, buf, filler, offset, plus)
            for next_offset, name, attr in _numbered(entries, offset):
                flags = 0
                if attr is None:
                    st.st_mode = _DOT_MODE
                elif plus:
                    fill(attr)
                    flags = FUSE_FILL_DIR_PLUS
                else:
                    st.st_mode = mode(attr)  # the kernel reads the type alone from it
                raw = name.encode(encoding, errors)
                full = (
                    filler(buf, raw, st, next_offset)
                    if v2
                    else filler(buf, raw, st, next_offset, flags)
                )
                if full != 0:
                    break
            return 0

        def _fill_listing(
            self, entries: DirListing, buf: Any, filler: Any, offset: int, plus: bool
        ) -> int:
            """:meth:`_fill` from a :class:`DirListing`: each stored file's name goes to the
            kernel as the bytes the listing keeps, and its attributes are made (a ``stat`` in
            a listing of names) only for a READDIRPLUS request: the listing never becomes
            ``(name, Attr)`` pairs, nor a name a ``str``."""
            ops = self.operations
            st = _fuse.c_stat()
            fill = _StatFiller(st, ops.to_stat)
            mode = ops.to_stat.mode
            file_mode = mode(entries.file_attr)
            # The kernel asks for attributes at a folder's first request whatever the reader
            # will do, and later only once lookups showed it someone stats the entries: ``ls
            # -l``, not ``ls`` or ``find``. So the first request gets the attributes known
            # without a ``stat`` (a listing of names knows none), the later ones all.
            ask = offset > 0
            v2 = LIBFUSE_VERSION[0] == 2

            def add(raw: bytes, at: int, flags: int) -> int:
                return int(filler(buf, raw, st, at) if v2 else filler(buf, raw, st, at, flags))

            st.st_mode = _DOT_MODE
            if offset < 1 and add(b".", 1, 0) != 0:
                return 0
            if offset < 2 and add(b"..", 2, 0) != 0:
                return 0
            for index, raw, attr in entries.raw_from(max(offset - 2, 0)):
                flags = 0
                if plus:
                    attr = attr or entries.stored_attr(index, ask=ask)
                    if attr is not None:
                        fill(attr)
                        flags = FUSE_FILL_DIR_PLUS
                    else:  # a plain entry: the kernel looks it up if it is stat-ed
                        st.st_mode = file_mode
                else:
                    st.st_mode = file_mode if attr is None else mode(attr)
                if add(raw, index + 3, flags) != 0:
                    break
            return 0

        def getattr_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
            """getattr (every lookup) without a dict: the entry's :class:`Attr` fills
            ``struct stat`` field by field, as readdir-plus does (mfusepy's generic route
            builds a dict and sets it key by key)."""
            if path is None:  # an open file's attributes without its name: mfusepy's route
                return int(super().getattr_fuse_3(path, buf, fip))
            ops = self.operations
            _StatFiller(buf.contents, ops.to_stat)(ops.attr(self._path(path)))
            return 0

        def readdir_fuse_2(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any) -> int:
            return self._fill(path, buf, filler, offset, fip, plus=False)

        def readdir_fuse_3(
            self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any, flags: int
        ) -> int:
            return self._fill(path, buf, filler, offset, fip, plus=bool(flags & FUSE_READDIR_PLUS))

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            fh = fip.contents.fh if fip else None
            return int(self.operations.truncate(self._path(path), length, fh) or 0)

        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            return int(self.operations.rename(self._path(old), self._path(new), flags) or 0)

        def create(self, path: bytes, mode: int, fip: Any) -> int:
            """mfusepy's ``create`` asks ``inspect.signature`` of the operation at every call
            (a tenth of the daemon's time in a ``cp -r`` of small chunks); ours takes flags."""
            info = fip.contents
            info.fh = self.operations.create(self._path(path), mode, info.flags)
            return 0

        def open(self, path: bytes, fip: Any) -> int:
            result = super().open(path, fip)
            info = fip.contents
            mode = self.operations.page_cache(self._path(path), info.fh)
            if mode is PageCache.BYPASS:
                info.direct_io = 1
            elif mode is PageCache.KEEP:
                info.keep_cache = 1
            if _NOFLUSH and not info.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
                # A read-only descriptor commits nothing at close (another descriptor's
                # writes are committed by that one's close), so its close(2) need not wait
                # for a FLUSH round trip: one of five calls per small file read (Linux >=
                # 5.12; older kernels ignore the flag and flush, which is harmless).
                info.noflush = 1
            return int(result or 0)

    N5fsFUSE: Any = _PlusFUSE
else:  # pragma: no cover - fusepy: its own glue, without the extras
    N5fsFUSE = _fuse.FUSE
