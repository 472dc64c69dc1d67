"""Mounts for tests: each in its own process (``n5fs mount --foreground``, the daemon, or a
script around :func:`n5fs.fuse_front.mount.serve`), so a hung mount can always be killed.

A watchdog kills every daemon of a test that overruns, which makes any call stuck on the
mount fail with ENOTCONN instead of hanging the suite; teardown always unmounts. Use the
``mounter`` fixture (import it into the test module, or into conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from n5fs.cli.daemon import read_state, state_path
from n5fs.fuse_front.mounts import mount_entry
from n5fs.locking import ENV as LOCKS_ENV

CLI = [sys.executable, "-m", "n5fs"]
WATCHDOG = 240.0

#: skips a test where this machine cannot mount (no /dev/fuse, no fusermount3)
NEEDS_FUSE = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)


def real_mount(timeout: float = 120) -> list[pytest.MarkDecorator]:
    """The marks of a test that mounts: ``fuse``, a timeout of its own, and :data:`NEEDS_FUSE`."""
    return [pytest.mark.fuse, pytest.mark.timeout(timeout), NEEDS_FUSE]


class Mounter:
    """Starts mounts in child processes, finds their daemons, and always cleans up."""

    def __init__(self, tmp_path: Path, watchdog: float = WATCHDOG) -> None:
        self.tmp = tmp_path
        self.env = {**os.environ, "N5FS_STATE_DIR": str(tmp_path / "state")}
        self.points: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.watchdog = threading.Timer(watchdog, self.kill_all)
        self.watchdog.daemon = True
        self.watchdog.start()

    def mountpoint(self, name: str = "mnt") -> Path:
        path = self.tmp / name
        path.mkdir(exist_ok=True)
        self.points.append(path)
        return path

    def cli(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def foreground(self, source: str, *args: str, name: str = "mnt") -> Path:
        mp = self.mountpoint(name)
        self._start([*CLI, "mount", source, str(mp), "--foreground", *args], mp)
        return mp

    def script(
        self, code: str, *args: str, name: str = "mnt"
    ) -> tuple[Path, subprocess.Popen[bytes]]:
        """Mount with a Python script run as ``python -c code ARGS... MOUNTPOINT``."""
        mp = self.mountpoint(name)
        proc = self._start([sys.executable, "-c", code, *args, str(mp)], mp)
        return mp, proc

    def daemon(self, source: str, *args: str, name: str = "mnt") -> Path:
        mp = self.mountpoint(name)
        result = self.cli("mount", source, str(mp), *args)
        assert result.returncode == 0, result.stderr
        return mp

    def spawn(
        self,
        argv: list[str],
        mp: Path,
        *,
        env: dict[str, str] | None = None,
        stderr: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a mount process and return at once (the test decides when it is ready, e.g.
        on systemd's READY=1); it is killed and its mount detached like the others."""
        if mp not in self.points:
            self.points.append(mp)
        log = stderr or self.tmp / f"{mp.name}.stderr"
        with open(log, "wb") as err:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                argv, env={**self.env, **(env or {})}, stdout=subprocess.DEVNULL, stderr=err
            )
        self.procs.append(proc)
        return proc

    def _start(self, argv: list[str], mp: Path) -> subprocess.Popen[bytes]:
        err = open(self.tmp / f"{mp.name}.stderr", "wb")  # noqa: SIM115 (the child owns it)
        proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while mount_entry(str(mp)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                said = (self.tmp / f"{mp.name}.stderr").read_text()
                pytest.fail(f"{argv[3:]} did not mount (exit {proc.poll()}): {said}")
            time.sleep(0.02)
        os.stat(mp)  # the mount answers
        return proc

    def pid(self, mp: Path) -> int:
        state = read_state(state_path(str(mp)))
        assert state is not None, f"no state file for {mp}"
        return int(state["pid"])

    def _daemon_pids(self) -> list[int]:
        states = (read_state(p) for p in (self.tmp / "state").glob("*.json"))
        return [int(s["pid"]) for s in states if s is not None and "pid" in s]

    def kill_all(self) -> None:
        for pid in self._daemon_pids() + [p.pid for p in self.procs if p.poll() is None]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def cleanup(self) -> None:
        self.watchdog.cancel()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for mp in self.points:
            if mount_entry(str(mp)) is not None:
                subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=False, timeout=30)
        for pid in self._daemon_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def mounter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """A Mounter whose state files live in ``tmp_path/state`` (for this process too). In a
    test marked ``debug_locks`` its mounts run with the lock-order checks on, and a violation
    any of them logged fails the test."""
    monkeypatch.setenv("N5FS_STATE_DIR", str(tmp_path / "state"))
    debug_locks = request.node.get_closest_marker("debug_locks") is not None
    m = Mounter(tmp_path)
    if debug_locks:
        m.env[LOCKS_ENV] = "1"
    try:
        yield m
    finally:
        m.cleanup()
    if debug_locks:
        logged = [
            line
            for log in sorted(tmp_path.glob("*.stderr"))
            for line in log.read_text(errors="replace").splitlines()
            if "LockOrderError" in line
        ]
        assert not logged, "lock-order violations in the mounts:\n" + "\n".join(logged)


def wait_until(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        time.sleep(0.02)
