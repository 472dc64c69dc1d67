"""A soak of a read-write S3 mount under the faults of a real network: writers and readers
through a real mount for a while, then the bucket compared with what the mount acknowledged.

The promise under test is the gateway's: nothing accepted is lost, nothing invalid or corrupt
is stored, no call hangs, the daemon survives. So the soak mounts a bucket through
:mod:`n5fs.testing.s3_proxy` with a mix of faults (:data:`MIXED_FAULTS`) and runs, on threads
of this process:

- file writers: new files of random bytes (acknowledged when ``close()`` returned 0);
- zarr writers: zarr-python arrays, v2 and v3, written whole (acknowledged when the write
  returned);
- ``cp -r`` writers: folders of files copied in (acknowledged when ``cp`` exited 0);
- readers: acknowledged files read back through the mount (read-your-writes).

Every call is timed and its errno counted. Then, with the faults gone: the daemon is alive and
its peak RSS read, the mount is unmounted, each acknowledged file is read straight from the
bucket (lost: absent; corrupt: other bytes), each acknowledged array is read through a fresh
read-only mount with zarr-python, and ``n5fs validate`` judges everything stored (invalid).

Used by ``scripts/soak.py`` (minutes) and by the test suite (seconds). Needs the ``test``
extra (moto, zarr) and a machine that can mount (``/dev/fuse``, ``fusermount3``).

State: the :class:`Soak`'s acknowledged sets and counters under its lock; each worker thread
owns its own names (no two write one key).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from n5fs.kvstore import tempnames
from n5fs.testing.s3_proxy import Fault, fault_proxy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["MIXED_FAULTS", "SoakConfig", "SoakReport", "mixed_faults", "run_soak"]

#: a call slower than this counts as one a user would take for a hang
SLOW_CALL = 30.0
N5FS = [sys.executable, "-m", "n5fs"]


def mixed_faults(scale: float = 1.0) -> list[Fault]:
    """The faults of a bad day on a real network, as shares of requests (``scale`` x)."""
    return [
        Fault("reset_before", probability=0.02 * scale),
        Fault("reset_after", method="PUT", probability=0.02 * scale),
        Fault("reset_mid_body", method="GET", probability=0.03 * scale),
        Fault("status", status=500, code="InternalError", probability=0.01 * scale),
        Fault("status", status=503, code="SlowDown", probability=0.02 * scale),
        Fault("truncate", method="PUT", probability=0.02 * scale),
        Fault("corrupt", probability=0.01 * scale),
        Fault("stall", probability=0.01 * scale, seconds=1.0),
    ]


MIXED_FAULTS = mixed_faults()


@dataclass
class SoakConfig:
    seconds: float = 60.0
    file_writers: int = 3
    zarr_writers: int = 2
    cp_writers: int = 1
    readers: int = 2
    #: the faults in force while the workers run (a new list each run: faults keep counts)
    faults: Callable[[], list[Fault]] = mixed_faults
    #: one-way delay the proxy adds to every request and answer
    latency: float = 0.0
    seed: int = 0
    #: extra ``n5fs mount`` arguments (e.g. ``--staging-size 64M``)
    mount_args: Sequence[str] = ()


@dataclass
class SoakReport:
    seconds: float = 0.0
    acknowledged_files: int = 0
    acknowledged_arrays: int = 0
    lost: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    wrong_reads: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    slow_calls: int = 0
    longest_call: float = 0.0
    #: which kind of call took longest
    longest_what: str = ""
    daemon_alive: bool = False
    peak_rss_mib: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)

    def failures(self) -> list[str]:
        """What breaks the promise (empty: the soak passed). Failed calls are no failure:
        a fault may cost a call an errno, never a lie."""
        out = []
        for name in ("lost", "corrupt", "invalid", "unreadable", "wrong_reads"):
            found = getattr(self, name)
            if found:
                out.append(f"{len(found)} {name.replace('_', ' ')}: {found[:5]}")
        if self.slow_calls:
            out.append(f"{self.slow_calls} calls over {SLOW_CALL:.0f} s")
        if not self.daemon_alive:
            out.append("the daemon died")
        return out

    def table(self) -> str:
        rows = [
            ("run", f"{self.seconds:.0f} s"),
            ("acknowledged", f"{self.acknowledged_files} files, {self.acknowledged_arrays} arrays"),
            ("acknowledged lost", str(len(self.lost))),
            ("corrupt stored", str(len(self.corrupt))),
            ("invalid stored", str(len(self.invalid))),
            ("unreadable stored", str(len(self.unreadable))),
            ("wrong reads", str(len(self.wrong_reads))),
            (
                "calls",
                f"{self.calls} ({self.slow_calls} over {SLOW_CALL:.0f} s, longest {self.longest_call:.1f} s: {self.longest_what or '-'})",
            ),
            ("failed calls", ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "0"),
            (
                "daemon",
                f"{'alive' if self.daemon_alive else 'DEAD'}, peak RSS {self.peak_rss_mib:.0f} MiB",
            ),
            ("requests", ", ".join(f"{k} {v}" for k, v in sorted(self.requests.items()))),
            ("faults injected", ", ".join(f"{k} {v}" for k, v in sorted(self.injected.items()))),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def source_of(endpoint: str, bucket: str, path: str = "soak/") -> str:
    return json.dumps({"driver": "s3", "bucket": bucket, "path": path, "endpoint": endpoint})


def _env(state: Path) -> dict[str, str]:
    return {**os.environ, "N5FS_STATE_DIR": str(state)}


@contextlib.contextmanager
def mounted(source: str, mountpoint: Path, state: Path, *args: str) -> Iterator[int]:
    """``n5fs mount`` (the daemon) at ``mountpoint``; yields its pid; unmounts on exit."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [*N5FS, "mount", source, str(mountpoint), *args],
        env=_env(state),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"n5fs mount failed: {run.stderr.strip()}")
    match = re.search(r"\(pid (\d+)", run.stdout + run.stderr)
    if match is None:
        raise RuntimeError(f"n5fs mount said no pid: {run.stdout} {run.stderr}")
    try:
        yield int(match.group(1))
    finally:
        done = subprocess.run(
            [*N5FS, "unmount", str(mountpoint)],
            env=_env(state),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (``VmHWM``) in MiB; 0 once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Soak:
    """One run's workers and what they were told (module docstring)."""

    def __init__(self, mountpoint: Path, work: Path, config: SoakConfig) -> None:
        self.mp = mountpoint
        self.work = work
        self.config = config
        self.deadline = 0.0
        self._lock = threading.Lock()
        #: key (relative to the mount) -> MD5 of the bytes its writer was told are stored
        self.files: dict[str, bytes] = {}
        #: array path (relative to the mount) -> (seed, zarr format)
        self.arrays: dict[str, tuple[int, Literal[2, 3]]] = {}
        self.report = SoakReport()

    def timed(self, what: str, call: Callable[[], Any]) -> bool:
        """Run one call; count its time and its errno. True if it succeeded."""
        start = time.monotonic()
        ok = True
        try:
            call()
        except OSError as exc:
            ok = False
            name = os.strerror(exc.errno) if exc.errno else type(exc).__name__
            with self._lock:
                self.report.errors[f"{what}: {name}"] += 1
        except Exception as exc:  # noqa: BLE001 - a writer library's own error (zarr's, wrapping an errno) is a failed call, counted
            ok = False
            with self._lock:
                self.report.errors[f"{what}: {type(exc).__name__}"] += 1
        took = time.monotonic() - start
        with self._lock:
            self.report.calls += 1
            if took > self.report.longest_call:
                self.report.longest_call, self.report.longest_what = took, what
            if took > SLOW_CALL and what != "cp -r":
                self.report.slow_calls += 1
        return ok

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    # -- workers ---------------------------------------------------------------------------

    def file_writer(self, n: int) -> None:
        rng = random.Random(self.config.seed * 1000 + n)
        folder = f"files/w{n}"
        self.timed("mkdir", lambda: os.makedirs(self.mp / folder, exist_ok=True))
        i = 0
        while self.running():
            i += 1
            key = f"{folder}/{i}.bin"
            data = rng.randbytes(rng.choice((1 << 10, 16 << 10, 200 << 10)))

            def write(key: str = key, data: bytes = data) -> None:
                with open(self.mp / key, "wb") as f:
                    f.write(data)

            if self.timed("write file", write):
                with self._lock:
                    self.files[key] = hashlib.md5(data, usedforsecurity=False).digest()

    def zarr_writer(self, n: int) -> None:
        import numpy as np
        import zarr

        i = 0
        while self.running():
            i += 1
            seed = self.config.seed * 1000 + n * 100_000 + i
            fmt: Literal[2, 3] = 2 if i % 2 else 3
            path = f"zarr/w{n}_{i}"

            def write(path: str = path, seed: int = seed, fmt: Literal[2, 3] = fmt) -> None:
                arr = zarr.create_array(
                    str(self.mp / path), shape=(32, 32), chunks=(8, 8), dtype="uint16",
                    zarr_format=fmt, compressors=None if fmt == 2 else "auto",
                )  # fmt: skip
                arr[...] = np.random.default_rng(seed).integers(0, 60000, (32, 32), "uint16")

            if self.timed("zarr write", write):
                with self._lock:
                    self.arrays[path] = (seed, fmt)

    def cp_writer(self, n: int) -> None:
        rng = random.Random(self.config.seed * 1000 + 500 + n)
        src = self.work / f"cp-src-{n}"
        src.mkdir(parents=True, exist_ok=True)
        made = {}
        for j in range(12):
            data = rng.randbytes(rng.choice((512, 8 << 10, 64 << 10)))
            (src / f"{j}.bin").write_bytes(data)
            made[f"{j}.bin"] = hashlib.md5(data, usedforsecurity=False).digest()
        self.timed("mkdir", lambda: os.makedirs(self.mp / "cp", exist_ok=True))
        i = 0
        while self.running():
            i += 1
            target = f"cp/w{n}_{i}"
            run = [shutil.which("cp") or "cp", "-r", str(src), str(self.mp / target)]

            def copy(run: list[str] = run) -> None:
                done = subprocess.run(run, capture_output=True, text=True, timeout=600, check=False)
                if done.returncode != 0:
                    raise OSError(0, f"cp exited {done.returncode}: {done.stderr.strip()[:200]}")

            if self.timed("cp -r", copy):
                with self._lock:
                    self.files.update({f"{target}/{name}": md5 for name, md5 in made.items()})

    def reader(self, n: int) -> None:
        rng = random.Random(self.config.seed * 1000 + 900 + n)
        while self.running():
            with self._lock:
                keys = list(self.files)
            if not keys:
                time.sleep(0.05)
                continue
            key = rng.choice(keys)
            got: list[bytes] = []

            def read(key: str = key, got: list[bytes] = got) -> None:
                got.append((self.mp / key).read_bytes())

            read_ok = self.timed("read file", read)
            if read_ok and hashlib.md5(got[0], usedforsecurity=False).digest() != self.files[key]:
                with self._lock:
                    self.report.wrong_reads.append(key)

    def run_workers(self) -> None:
        config = self.config
        kinds: list[tuple[Callable[[int], None], int]] = [
            (self.file_writer, config.file_writers),
            (self.zarr_writer, config.zarr_writers),
            (self.cp_writer, config.cp_writers),
            (self.reader, config.readers),
        ]
        jobs = [(work, n) for work, count in kinds for n in range(count)]
        self.deadline = time.monotonic() + config.seconds
        with ThreadPoolExecutor(len(jobs), thread_name_prefix="soak") as pool:
            for done in [pool.submit(work, n) for work, n in jobs]:
                done.result()


def run_soak(
    upstream: str, bucket: str, work: Path, config: SoakConfig | None = None
) -> SoakReport:
    """Soak a mount of ``bucket`` at ``upstream`` (an S3 endpoint on this machine, such as a
    moto server) through a fault proxy; ``work`` holds mountpoints, state and logs."""
    config = config or SoakConfig()
    state = work / "state"
    soak = Soak(work / "mnt", work, config)
    report = soak.report
    start = time.monotonic()
    with fault_proxy(upstream, seed=config.seed) as proxy:
        proxy.latency = config.latency
        with mounted(source_of(proxy.endpoint, bucket), soak.mp, state, *config.mount_args) as pid:
            proxy.inject(*config.faults())
            soak.run_workers()
            proxy.clear()
            report.daemon_alive = tempnames.process_alive(pid)
            report.peak_rss_mib = peak_rss_mib(pid)
        report.requests = Counter(proxy.counts)
        report.injected = Counter(proxy.injected)
    report.seconds = time.monotonic() - start
    report.acknowledged_files = len(soak.files)
    report.acknowledged_arrays = len(soak.arrays)
    _check_files(upstream, bucket, soak.files, report)
    _check_arrays(upstream, bucket, work, state, soak.arrays, report)
    _check_valid(upstream, bucket, state, report)
    return report


def _check_files(upstream: str, bucket: str, files: dict[str, bytes], report: SoakReport) -> None:
    from n5fs.errors import N5fsError
    from n5fs.kvstore import open_store

    def check(key: str) -> tuple[str, str] | None:
        """What is wrong with ``key`` (the report's list and its entry), None if nothing."""
        try:
            data = store.get(key)
        except N5fsError as exc:  # bytes whose stored checksum they fail: damaged
            return "corrupt", f"{key} ({exc})"[:200]
        if data is None:
            return "lost", key
        if hashlib.md5(data, usedforsecurity=False).digest() != files[key]:
            return "corrupt", key
        return None

    # thousands of GETs: a few at a time, so the client's and the server's work overlap
    with open_store(source_of(upstream, bucket)) as store, ThreadPoolExecutor(4) as pool:
        lists = {"lost": report.lost, "corrupt": report.corrupt}
        for wrong in pool.map(check, sorted(files)):
            if wrong is not None:
                lists[wrong[0]].append(wrong[1])


def _check_arrays(
    upstream: str,
    bucket: str,
    work: Path,
    state: Path,
    arrays: dict[str, tuple[int, Literal[2, 3]]],
    report: SoakReport,
) -> None:
    import numpy as np
    import zarr

    mp = work / "check"
    with mounted(source_of(upstream, bucket), mp, state, "--read-only"):
        for path, (seed, fmt) in sorted(arrays.items()):
            want = np.random.default_rng(seed).integers(0, 60000, (32, 32), "uint16")
            try:
                got = zarr.open_array(str(mp / path), mode="r", zarr_format=fmt)[...]
            except (OSError, ValueError, KeyError, LookupError) as exc:
                report.lost.append(f"{path} ({type(exc).__name__})")
                continue
            if not np.array_equal(got, want):
                report.corrupt.append(path)


def _check_valid(upstream: str, bucket: str, state: Path, report: SoakReport) -> None:
    run = subprocess.run(
        [*N5FS, "validate", "--json", "--allow-empty", source_of(upstream, bucket)],
        env=_env(state),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        doc = json.loads(run.stdout)
    except ValueError:
        report.invalid.append(
            f"validate did not answer (exit {run.returncode}): {run.stderr[-300:]}"
        )
        return
    report.invalid += [f"{f['key']}: {f.get('message', '')}"[:200] for f in doc.get("invalid", ())]
    report.unreadable += [
        f"{f['key']}: {f.get('message', '')}"[:200] for f in doc.get("unreadable", ())
    ]
