"""The columns of the mount benchmark (scripts/bench_mount.py) and the processes behind them:
how each mounts a store, the child processes that serve the mounts, a watchdog per measured
call, and the bare mfusepy passthrough (``python scripts/bench_peers.py --serve-passthrough``).

Columns: ``n5fs`` / ``n5fs-rw`` (``n5fs mount -f``), ``pt`` / ``pt+kc`` / ``pt+fsync`` (the
passthrough below: the Python-FUSE ceiling), and three peers, each mounted read-only since
they only run the read workloads, with the flags a user who read their manual would pick:

- ``fsspec``: ``fsspec.fuse.run`` over its local or s3fs filesystem, in ``--peer-python``
  (it needs fusepy and libfuse 2); fsspec has no cache or read-only option to choose.
- ``rclone mount`` (local backend: the backing directory; S3: an env-var remote ``moto:``,
  provider Other, the moto endpoint and creds; ``--config /dev/null`` so no user config
  interferes). ``--vfs-cache-mode off``: the default, and like n5fs no disk cache (reads
  stream from the backend through rclone's in-memory buffer); ``--read-only``; directory
  and attribute caches at their defaults (``--dir-cache-time 5m``, ``--attr-timeout 1s``).
  On S3, ``--use-server-modtime``: rclone otherwise HEADs every object for an mtime in its
  own metadata, which boto3-written objects do not carry; the flag makes it show
  LastModified, as n5fs does (rclone's S3 docs advise it for this case).
- ``s3fs`` (s3fs-fuse): ``-f -o url=ENDPOINT -o use_path_request_style -o ro``, creds from
  AWSACCESSKEYID/AWSSECRETACCESSKEY, every cache at its default (stat cache on, no disk
  cache). It mounts buckets only: on the file store its cells read "-".

A peer that cannot run says why in its cells ("not installed"); :func:`peer_variants`
reports each peer's version or the reason once, for the run's header.

Threads: :class:`Mounts` is driven by the main thread, but its watchdog runs on a timer
thread and kills the live daemons, so ``Mounts.live`` is only changed or walked under
``Mounts._lock``; ``Mounts.fired`` is written by the timer and read by the main thread only
after the guarded call has returned (a plain bool: no lock needed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if str(Path(__file__).resolve().parent) not in sys.path:  # imported, not run: find siblings
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_workloads import AWS, BenchError

from n5fs.fuse_front.mounts import MountFailed, mount_entry, unmount

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

TTL = "5"  # n5fs's default --cache-ttl, given to the passthrough's kernel timeouts too
PEERS = ("fsspec", "rclone", "s3fs")
FSSPEC_LAUNCHER = """
import sys
import fsspec, fsspec.fuse
kind, root, mountpoint, endpoint = sys.argv[1:5]
if kind == "s3":
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing",
                           client_kwargs={"region_name": "us-east-1"})
else:
    fs = fsspec.filesystem("file")
fsspec.fuse.run(fs, root, mountpoint, foreground=True)
"""
FSSPEC_VERSIONS = """
import fsspec, fsspec.fuse, fuse
extra = ""
if "s3" in __import__("sys").argv[1:]:
    import s3fs
    extra = f", s3fs {s3fs.__version__}"
print(f"fsspec {fsspec.__version__} (fusepy{extra})")
"""
RCLONE_FLAGS = ("--config", "/dev/null", "--vfs-cache-mode", "off", "--read-only")


# == columns =======================================================================================


@dataclass(frozen=True)
class Variant:
    """One column: how to mount the store (``argv`` of a foreground daemon given the mount
    point), or ``argv=None`` for direct access; ``missing`` is the cell text when it cannot
    run here, ``note`` its version or why it cannot run, ``env`` its additions to the
    environment (``None`` removes a variable)."""

    name: str
    argv: Callable[[Path], list[str]] | None = None
    missing: str | None = None
    note: str = ""
    env: Mapping[str, str | None] = field(default_factory=dict)


def n5fs_variant(name: str, source: str, *opts: str) -> Variant:
    return Variant(
        name, lambda mp: [sys.executable, "-m", "n5fs", "mount", source, str(mp), "-f", *opts]
    )


def passthrough_variant(name: str, root: Path, *opts: str) -> Variant:
    script = str(Path(__file__).resolve())
    return Variant(
        name, lambda mp: [sys.executable, script, "--serve-passthrough", str(root), str(mp), *opts]
    )


def peer_variants(python: str, store: str, root: str, endpoint: str = "") -> list[Variant]:
    """The peers over the backing directory (``store`` "file", ``root`` its path) or the moto
    bucket (``store`` "s3", ``root`` the bucket's name)."""
    return [
        fsspec_variant(python, store, root, endpoint),
        rclone_variant(store, root, endpoint),
        s3fs_variant(store, root, endpoint),
    ]


def fsspec_variant(python: str, store: str, root: str, endpoint: str) -> Variant:
    probe = subprocess.run(
        [python, "-c", FSSPEC_VERSIONS, store], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return Variant("fsspec", missing="not installed", note=f"not importable by {python}: {why}")
    return Variant(
        "fsspec",
        lambda mp: [python, "-c", FSSPEC_LAUNCHER, store, root, str(mp), endpoint],
        note=probe.stdout.strip(),
    )


def rclone_variant(store: str, root: str, endpoint: str) -> Variant:
    exe = shutil.which("rclone")
    if exe is None:
        return Variant("rclone", missing="not installed", note="rclone is not on PATH")
    version = version_line([exe, "version"])
    if store == "file":
        return Variant("rclone", lambda mp: [exe, "mount", root, str(mp), *RCLONE_FLAGS],
                       note=version)  # fmt: skip
    remote = {"TYPE": "s3", "PROVIDER": "Other", "ENDPOINT": endpoint, "REGION": "us-east-1",
              "ACCESS_KEY_ID": AWS["AWS_ACCESS_KEY_ID"],
              "SECRET_ACCESS_KEY": AWS["AWS_SECRET_ACCESS_KEY"]}  # fmt: skip
    env: dict[str, str | None] = {f"RCLONE_CONFIG_MOTO_{k}": v for k, v in remote.items()}
    # rclone 1.60's AWS SDK fails to start when AWS_CA_BUNDLE is set ("unable to load custom
    # CA bundle, HTTPClient's transport unsupported type"); moto is plain http: none needed
    env["AWS_CA_BUNDLE"] = None
    flags = (*RCLONE_FLAGS, "--use-server-modtime")
    return Variant(
        "rclone", lambda mp: [exe, "mount", f"moto:{root}", str(mp), *flags], note=version, env=env
    )


def s3fs_variant(store: str, bucket: str, endpoint: str) -> Variant:
    if store == "file":
        return Variant("s3fs", missing="-", note="s3fs-fuse mounts S3 buckets only")
    exe = shutil.which("s3fs")
    if exe is None:
        return Variant("s3fs", missing="not installed", note="s3fs (s3fs-fuse) is not on PATH")
    env = {"AWSACCESSKEYID": AWS["AWS_ACCESS_KEY_ID"],
           "AWSSECRETACCESSKEY": AWS["AWS_SECRET_ACCESS_KEY"]}  # fmt: skip
    opts = ("-o", f"url={endpoint}", "-o", "use_path_request_style", "-o", "ro")
    return Variant(
        "s3fs",
        lambda mp: [exe, bucket, str(mp), "-f", *opts],
        note=version_line([exe, "--version"]).replace(
            "Amazon Simple Storage Service File System", "s3fs-fuse"
        ),
        env=env,
    )


def version_line(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    return (proc.stdout.strip().splitlines() or [argv[0]])[0]


# == mounts ========================================================================================


@dataclass
class Mount:
    path: Path
    proc: subprocess.Popen[bytes] | None = None  # None: direct access, nothing mounted
    log: Path | None = None


class Mounts:
    """Mount daemons in child processes, a watchdog per measured call, and cleanup."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.live: list[Mount] = []
        self.fired = False
        self._lock = threading.Lock()

    def start(self, variant: Variant) -> Mount:
        assert variant.argv is not None
        mp = self.tmp / "mnt" / f"{variant.name}-{uuid.uuid4().hex[:6]}"
        mp.mkdir(parents=True)
        log = self.tmp / "logs" / f"{mp.name}.log"
        log.parent.mkdir(exist_ok=True)
        env = {**self.env, **variant.env}
        child_env = {k: v for k, v in env.items() if v is not None}
        with log.open("wb") as err:
            proc = subprocess.Popen(variant.argv(mp), env=child_env, stdin=subprocess.DEVNULL,
                                    stdout=err, stderr=err)  # fmt: skip
        mount = Mount(mp, proc, log)
        with self._lock:
            self.live.append(mount)
        deadline = time.monotonic() + 90
        while mount_entry(str(mp)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop(mount)
                raise BenchError(f"{variant.name} did not mount: {log.read_text()[-600:]}")
            time.sleep(0.02)
        try:
            with self.guard(f"first stat of {variant.name}", 60):
                os.stat(mp)
        except OSError as exc:
            self.stop(mount)
            raise BenchError(f"{variant.name} mounted but its root fails: {exc}") from exc
        return mount

    def stop(self, mount: Mount) -> None:
        if mount.proc is None:
            return
        if mount_entry(str(mount.path)) is not None:
            try:
                unmount(str(mount.path))
            except MountFailed:
                unmount(str(mount.path), lazy=True)
        try:
            mount.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            mount.proc.kill()
            mount.proc.wait()
        with contextlib.suppress(OSError):
            mount.path.rmdir()
        with self._lock:
            self.live.remove(mount)

    @contextlib.contextmanager
    def guard(self, what: str, seconds: float) -> Iterator[None]:
        """Kill every mount daemon if ``what`` overruns: its calls then fail with ENOTCONN."""
        self.fired = False

        def fire() -> None:
            self.fired = True
            print(f"  watchdog: {what} overran {seconds:g} s; killing the mount daemons")
            self.kill_all()

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def kill_all(self) -> None:
        with self._lock:
            procs = [m.proc for m in self.live if m.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)

    def cleanup(self) -> None:
        self.kill_all()
        with self._lock:
            live, self.live = self.live, []
        for mount in live:
            if mount_entry(str(mount.path)) is not None:
                with contextlib.suppress(MountFailed):
                    unmount(str(mount.path), lazy=True)
            if mount.proc is not None:
                mount.proc.wait()


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(value.split()[0])
    return out


# == the minimal passthrough (run in its own process by --serve-passthrough) ======================


def serve_passthrough(root: str, mountpoint: str, *, kernel_cache: bool, durable: bool) -> None:
    """The Python-FUSE ceiling: every call one syscall on the backing directory. ``durable``
    fsyncs a written file and its directory at close (flush), as n5fs's file store
    commits."""
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # mfusepy would pick libfuse 2 first
    import mfusepy

    written: dict[int, str] = {}

    class Passthrough(mfusepy.Operations):  # type: ignore[misc]  # untyped binding
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            st = os.fstat(fh) if fh is not None else os.lstat(root + path)
            keys = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")
            attrs = {key: getattr(st, key) for key in keys}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path: str, fh: int) -> list[Any]:
            with os.scandir(root + path) as entries:
                kinds = [
                    (e.name, stat.S_IFDIR if e.is_dir(follow_symlinks=False) else stat.S_IFREG, 0)
                    for e in entries
                ]
            return [".", "..", *kinds]

        def open(self, path: str, flags: int) -> int:
            return os.open(root + path, flags)

        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            fd = os.open(root + path, flags | os.O_CREAT, mode)
            written[fd] = root + path
            return fd

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return os.pwrite(fh, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            os.truncate(root + path, length)

        def flush(self, path: str, fh: int) -> None:
            """close(2) waits for flush (not for release): the durable variant syncs here."""
            name = written.get(fh)
            if durable and name is not None:
                os.fsync(fh)
                parent = os.open(os.path.dirname(name), os.O_RDONLY)
                os.fsync(parent)
                os.close(parent)

        def release(self, path: str, fh: int) -> None:
            written.pop(fh, None)
            os.close(fh)

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            os.fsync(fh)

        def unlink(self, path: str) -> None:
            os.unlink(root + path)

        def mkdir(self, path: str, mode: int) -> None:
            os.mkdir(root + path, mode)

        def rmdir(self, path: str) -> None:
            os.rmdir(root + path)

        def rename(self, old: str, new: str) -> None:
            os.rename(root + old, root + new)

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(root + path, mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            os.lchown(root + path, uid, gid)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
            if times is None:
                os.utime(root + path)
            else:
                os.utime(root + path, ns=times)

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(root)
            names = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
            return {name: getattr(sv, name) for name in names}

    opts: dict[str, Any] = {"attr_timeout": TTL, "entry_timeout": TTL, "negative_timeout": TTL}
    if kernel_cache:
        opts["kernel_cache"] = True
    mfusepy.FUSE(Passthrough(), mountpoint, foreground=True, nothreads=False, **opts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="serve the benchmark's bare mfusepy passthrough")
    p.add_argument("--serve-passthrough", nargs=2, required=True, metavar=("ROOT", "MP"))
    p.add_argument("--kernel-cache", action="store_true")
    p.add_argument("--durable", action="store_true")
    args = p.parse_args(argv)
    root, mountpoint = args.serve_passthrough
    serve_passthrough(root, mountpoint, kernel_cache=args.kernel_cache, durable=args.durable)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
