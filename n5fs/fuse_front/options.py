"""``-o`` options: which belong to n5fs, which to libfuse, and the kernel settings n5fs adds.

n5fs reads ``ro``/``rw`` and its own ``validate=``, ``cache_size=`` and ``cache_ttl=`` (so an
fstab line can carry them); everything else goes to libfuse unchanged, which refuses what it
does not know. n5fs then asks the kernel to cache what the gateway caches, and as long: attr,
entry and negative timeouts equal to the gateway's TTL (one LIST answers the kernel's lookups
as long as it answers the gateway's), ``kernel_cache`` on read-only mounts (re-reads at page
cache speed), and on libfuse 2 ``big_writes`` (else writes arrive in 4 KiB pieces; libfuse 3
negotiates 1 MiB writes by itself and refuses the option). An option the user gives wins.

Two more choices guard other users and the data under the mount point:

- ``allow_other`` brings ``default_permissions``: the kernel then checks the modes n5fs shows
  (files 0644, folders 0755, owned by the mounting user) before a call reaches n5fs, so another
  user can read but not write or delete. Without it the kernel lets every user's call through,
  and n5fs, which stores no modes, would accept it. ``no_default_permissions`` (n5fs's own;
  libfuse does not know it) keeps the old behaviour.
- ``nonempty`` (n5fs's own; libfuse 3 refuses it) lets a mount hide the files of a non-empty
  mount point; without it ``n5fs mount`` refuses such a mount point.

``durable=fsync|commit`` (n5fs's own) says when a commit to a local file store is on disk:
``fsync`` (the default) at the next ``fsync()`` or unmount, as on a local filesystem;
``commit`` before every ``close()`` returns, at two fsyncs per file (docs/semantics.md,
"Durability"). Atomicity is the same either way.

``consistency=ttl|strict`` and ``conditional=auto|off`` (n5fs's own) say how the mount keeps
up with other mounts of the same store (docs/semantics.md, "Many mounts of one bucket"):
``ttl`` (the default) trusts listings and detection for ``cache_ttl`` seconds; ``strict``
asks the store on every lookup (kernel timeouts 0 too). ``conditional=auto`` makes metadata
commits compare-and-swap where the store honours conditional writes (probed at mount);
``off`` keeps last-writer-wins.

``mtime=kept|listing|head`` (n5fs's own): where a file's mtime comes from on S3, whose
listings carry only ``LastModified``: ``kept`` shows the time ``touch``/``cp -a``/``rsync -a``
kept through any n5fs mount (from each folder's times index: one GET per folder that has one,
no request per file), ``listing`` answers ``LastModified`` without a request, ``head`` asks
each file's metadata (one HEAD per stat: times rclone or s3fs-fuse kept too). The default is
``kept`` on a read-write mount (``rsync -a`` into it must see the times it set) and
``listing`` on a read-only one.

``writeback=auto|on|off`` and ``writeback_size=SIZE`` (n5fs's own): whether a commit is
acknowledged once it is validated and journaled on local disk, its upload running behind
(docs/semantics.md, "Write-back"). ``auto`` (the default) is on where a write costs a network
round trip (S3) on a read-write mount, off elsewhere; the journal holds at most
``writeback_size`` (1 GiB) before writers wait.

``as=zarr3|zarr2|npy|n5`` (n5fs's own, ``--as``) mounts a view of the store in that format
(docs/semantics.md, "Views": writes through a Zarr view of N5 data or an N5 view of Zarr data
land in the store's own format; npy is read-only); ``as=native`` is the default.

``read_ahead_kb=N`` (n5fs's own, default 1024, but the kernel's for ``as=npy``, whose readers
map the file and fault pages in, each fault reading and decoding the read-ahead around it; 0
leaves the kernel's) sets the kernel's
read-ahead for the mount (Linux: its ``/sys/class/bdi/<device>/read_ahead_kb``, writable by
root only; elsewhere, or when refused, the kernel's own stays, said in the log). Why: the
kernel asks a FUSE file's bytes in requests no larger than its read-ahead, 128 KiB by default,
although libfuse 3 takes requests of 1 MiB. A reader of 512 KiB chunks then costs five FUSE
round trips through the daemon per chunk instead of one, and on a read-only mount of S3 the
daemon's CPU per byte is much of the mount's speed. gcsfuse recommends the same setting.

``show_control`` (n5fs's own) lists ``/.n5fs/`` in the root folder. Without it the control
folder is reachable by its path only (ZFS's ``snapdir=hidden``), so ``cp -r``, ``tar`` and
``rsync`` of a mount do not carry rejections and stats along; a file manager user who wants
to browse to it asks for it.

:func:`loop_options` sets libfuse 3's ``max_idle_threads``: otherwise some libfuse 3 releases
(3.14 among them) pass their "unlimited" default through a range check that prints "Ignoring
invalid max threads value 4294967295 > max (100000)." on every mount: a bug of libfuse's own
that a user would take for a misconfigured mount.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from n5fs.errors import InvalidSource

if TYPE_CHECKING:
    from collections.abc import Iterable

FuseValue = str | bool

VALIDATE_MODES = ("strict", "warn", "off")
DURABLE_MODES = ("fsync", "commit")
CONSISTENCY_MODES = ("ttl", "strict")
CONDITIONAL_MODES = ("auto", "off")
WRITEBACK_MODES = ("auto", "on", "off")
MTIME_SOURCES = ("kept", "listing")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
#: libfuse options that would fight the cache settings n5fs chooses for read-only mounts
_CACHE_CHOICES = ("kernel_cache", "auto_cache", "noauto_cache", "direct_io")
#: libfuse 2 accepts at most 128 KiB per write request
LIBFUSE2_MAX_WRITE = 128 << 10
#: libfuse 3's default ``max_threads`` (3.12+), and its default ``max_idle_threads`` before
#: 3.12: an idle-thread cap equal to the thread cap changes nothing but the warning
LIBFUSE3_MAX_THREADS = 10
#: the largest thread count libfuse 3 accepts (``FUSE_LOOP_MT_MAX_THREADS``)
LIBFUSE3_THREAD_LIMIT = 100_000
#: the kernel's read-ahead for a mount, in KiB: libfuse 3's largest request (256 pages)
READ_AHEAD_KB = 1024


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``4096`` -> bytes (binary units, as ``du`` and ``free``)."""
    match = _SIZE.match(text)
    if match is None:
        raise InvalidSource(f"cannot read {text!r} as a size; write e.g. 512M, 2G or 1048576")
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def parse_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidSource(f"cannot read {text!r} as seconds; write e.g. 5 or 0.5") from None
    if value < 0:
        raise InvalidSource(f"a time-to-live cannot be negative: {text!r}")
    return value


def parse_durable(text: str) -> str:
    if text not in DURABLE_MODES:
        raise InvalidSource(f"durable must be one of {', '.join(DURABLE_MODES)}, not {text!r}")
    return text


def parse_choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise InvalidSource(f"{name} must be one of {', '.join(choices)}, not {text!r}")
    return text


def parse_validate(text: str) -> str:
    if text not in VALIDATE_MODES:
        raise InvalidSource(f"validate must be one of {', '.join(VALIDATE_MODES)}, not {text!r}")
    return text


@dataclass
class MountOptions:
    """What ``-o`` said: n5fs's own settings (None = not given) and libfuse's options."""

    read_only: bool = False
    validate: str | None = None
    cache_bytes: int | None = None
    ttl: float | None = None
    #: mount over a non-empty directory (``-o nonempty``), hiding what it holds
    nonempty: bool = False
    #: ``-o no_default_permissions``: ``allow_other`` without the kernel's mode checks
    no_default_permissions: bool = False
    #: ``-o show_control``: ``readdir`` of the root lists ``.n5fs`` (it is always reachable)
    show_control: bool = False
    #: ``-o durable=``: when a commit to a local file store is on disk (fsync or commit)
    durable: str = DURABLE_MODES[0]
    #: ``-o consistency=``: what other mounts' commits this one sees when (ttl or strict)
    consistency: str | None = None
    #: ``-o conditional=``: metadata commits as compare-and-swap where possible (auto) or not
    conditional: str = CONDITIONAL_MODES[0]
    #: ``-o mtime=``: kept times from the folders' indexes (kept), the listing's own
    #: (listing) or asked per stat (head); None: kept on read-write mounts, listing on
    #: read-only ones
    mtime: str | None = None
    #: ``-o writeback=``: acknowledge commits from a local journal and upload behind (on),
    #: commit synchronously (off), or on where a write is a round trip (auto: S3)
    writeback: str = WRITEBACK_MODES[0]
    #: ``-o as=``: the format the mount shows (``native``: the store's own)
    view: str = "native"
    #: ``-o read_ahead_kb=``: the kernel's read-ahead for the mount (0: the kernel's own;
    #: None: not given, :meth:`read_ahead_for` decides)
    read_ahead_kb: int | None = None

    def read_ahead_for(self) -> int:
        """The read-ahead to set: the user's, else :data:`READ_AHEAD_KB`, except for the npy
        view, which keeps the kernel's: it is read through ``mmap`` (``np.load(...,
        mmap_mode="r")``), where each page fault reads the read-ahead around it, and every
        byte of that is chunks decoded; 1 MiB would decode eight times what 128 KiB does."""
        if self.read_ahead_kb is not None:
            return self.read_ahead_kb
        return 0 if self.view == "npy" else READ_AHEAD_KB

    fuse: dict[str, FuseValue] = field(default_factory=dict)


def split_options(text: str) -> list[str]:
    """``a,b=c`` -> ``["a", "b=c"]``; ``\\,`` keeps a comma inside a value (as libfuse)."""
    items, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            current.append(next(chars, "\\"))
        elif char == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def parse_options(groups: Iterable[str]) -> MountOptions:
    """Every ``-o`` group in order; a later option overrides an earlier one."""
    opts = MountOptions()
    for group in groups:
        for item in split_options(group):
            name, has_value, value = item.partition("=")
            _apply(opts, name.strip(), value.strip() if has_value else None)
    return opts


def _apply(opts: MountOptions, name: str, value: str | None) -> None:
    if name in ("ro", "rw") and value is None:
        opts.read_only = name == "ro"
    elif name == "validate" and value is not None:
        opts.validate = parse_validate(value)
    elif name == "durable" and value is not None:
        opts.durable = parse_durable(value)
    elif name == "consistency" and value is not None:
        opts.consistency = parse_choice(name, value, CONSISTENCY_MODES)
    elif name == "mtime" and value is not None:
        opts.mtime = parse_choice(name, value, MTIME_SOURCES)
    elif name == "conditional" and value is not None:
        opts.conditional = parse_choice(name, value, CONDITIONAL_MODES)
    elif name == "writeback" and value is not None:
        opts.writeback = parse_choice(name, value, WRITEBACK_MODES)
    elif name == "as" and value is not None:
        from n5fs.views import parse_view  # light: the views load when one is mounted

        opts.view = parse_view(value)
    elif name == "cache_size" and value is not None:
        opts.cache_bytes = parse_size(value)
    elif name == "cache_ttl" and value is not None:
        opts.ttl = parse_seconds(value)
    elif name == "read_ahead_kb" and value is not None:
        if not value.isdigit():
            raise InvalidSource(f"read_ahead_kb is a number of KiB, not {value!r}")
        opts.read_ahead_kb = int(value)
    elif name in ("subtype", "fsname"):
        pass  # n5fs names its mounts itself: `n5fs status` finds them by subtype
    elif name == "nonempty" and value is None:
        opts.nonempty = True  # checked by n5fs; libfuse 3 refuses the option
    elif name == "show_control" and value is None:
        opts.show_control = True
    elif name == "no_default_permissions" and value is None:
        opts.no_default_permissions = True
        opts.fuse.pop("default_permissions", None)
    else:
        if name == "default_permissions":
            opts.no_default_permissions = False
        opts.fuse[name] = True if value is None else value


def fsname_of(source: str) -> str:
    """The mount's source column (``df``, ``mount``): the source URL, made safe for the
    comma-separated option string."""
    return re.sub(r"[,\s\\]", "_", source) or "n5fs"


def fuse_options(
    opts: MountOptions,
    *,
    read_only: bool,
    ttl: float,
    fsname: str,
    libfuse_major: int,
) -> dict[str, FuseValue]:
    """The keyword arguments for ``FUSE(...)``: n5fs's choices, then the user's on top."""
    chosen: dict[str, FuseValue] = {
        "fsname": fsname_of(fsname),
        "subtype": "n5fs",
        "attr_timeout": _seconds(ttl),
        "entry_timeout": _seconds(ttl),
        "negative_timeout": _seconds(ttl),
    }
    if read_only:
        chosen["ro"] = True
        if not any(name in opts.fuse for name in _CACHE_CHOICES):
            chosen["kernel_cache"] = True
    if libfuse_major == 2:
        chosen["big_writes"] = True
        chosen["max_write"] = str(LIBFUSE2_MAX_WRITE)
    if opts.fuse.get("allow_other") and not opts.no_default_permissions:
        chosen["default_permissions"] = True  # other users get what the modes say, no more
    chosen.update(opts.fuse)
    return chosen


def loop_options(opts: MountOptions, *, libfuse_major: int) -> dict[str, FuseValue]:
    """libfuse 3's worker-pool options: ``max_idle_threads`` equal to the thread cap (the
    user's ``max_threads=``, else libfuse's 10), unless the user set it. Behaviour is as
    without it (idle threads never outnumber threads), but libfuse stays quiet (module
    docstring). Nothing for libfuse 2, which knows neither option."""
    if libfuse_major < 3 or "max_idle_threads" in opts.fuse:
        return {}
    threads = opts.fuse.get("max_threads")
    cap = LIBFUSE3_MAX_THREADS
    if isinstance(threads, str) and threads.isdigit():
        cap = min(max(int(threads), 1), LIBFUSE3_THREAD_LIMIT)
    return {"max_idle_threads": str(cap)}


def _seconds(value: float) -> str:
    return f"{value:g}"


def render(options: dict[str, FuseValue]) -> str:
    """The ``-o`` string libfuse sees, for logs and the state file."""
    return ",".join(k if v is True else f"{k}={v}" for k, v in options.items() if v is not False)
