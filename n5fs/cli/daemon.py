"""Going to the background like sshfs, and the state files that say what is mounted where.

:func:`daemonize` forks before any thread exists (a fork keeps only the calling thread: a
boto3 pool or libfuse worker would be left behind holding its locks), ``setsid``, forks
again, and runs the body in the grandchild with stdin/stdout on /dev/null and stderr on a
pipe back to the caller. Until the body says it is ready, everything the daemon prints
(our log lines and libfuse's own messages) flows to the caller, who shows it as the reason
if the daemon dies; once ready, stderr moves to the log file and the caller exits 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from n5fs.errors import N5fsError
from n5fs.fuse_front.mounts import MountFailed

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("n5fs.cli.daemon")

READY_TOKEN = b"\x00n5fs-ready\n"
PID_TAG = b"\x00n5fs-pid "
#: libfuse 3.14 prints this on every mount unless max_idle_threads is set (n5fs sets it:
#: fuse_front/options.py ``loop_options``); dropped here too, for a user's own ``-o`` values
_NOISE = ("Ignoring invalid max threads",)
_LOG_FORMAT = "%(asctime)s n5fs[%(process)d] %(levelname)s %(name)s: %(message)s"
#: a line in that format (the daemon's handler has it from the fork on)
_DAEMON_LOG_LINE = re.compile(r"^\S+ \S+ n5fs\[\d+\] (?P<level>[A-Z]+) [\w.]+: (?P<message>.*)$")


def daemonize(
    body: Callable[[Callable[[], None]], None],
    *,
    what: str,
    log_file: str | None,
    timeout: float,
) -> int | None:
    """Run ``body(ready)`` in a daemon. Returns the daemon's pid once the body calls
    ``ready()``; raises MountFailed with the daemon's words if it exits first, or after
    ``timeout`` seconds (the daemon is then stopped). ``what`` names the job in messages."""
    if threading.active_count() > 1:
        raise MountFailed(
            f"cannot go to the background with {threading.active_count()} threads running "
            "(forking would leave them behind); run with --foreground"
        )
    log_fd = open_log(log_file)  # here, so that a bad path is reported at the terminal
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child (covered by the mount tests)
        code = 2
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            code = _daemon_main(body, write_fd, log_fd)
        except BaseException:  # noqa: BLE001 (whatever it was, the caller must hear of it)
            traceback.print_exc()  # fd 2 is the caller's pipe: it shows this as the reason
        finally:
            os._exit(code)
    os.close(write_fd)
    os.close(log_fd)
    os.waitpid(pid, 0)
    return await_daemon(read_fd, what=what, timeout=timeout)


def open_log(log_file: str | None) -> int:
    """The daemon's log, truncated (one file per mountpoint; each mount starts it afresh)."""
    if log_file is None:
        return os.open(os.devnull, os.O_WRONLY)
    Path(log_file).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def _daemon_main(  # pragma: no cover - runs in the daemon
    body: Callable[[Callable[[], None]], None], status_fd: int, log_fd: int
) -> int:
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(status_fd, 2)  # until ready, every complaint (libfuse's too) reaches the caller
    os.write(status_fd, PID_TAG + str(os.getpid()).encode() + b"\n")
    for handler in logging.getLogger("n5fs").handlers:
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))  # a log file outlives the tty

    def ready() -> None:
        os.dup2(log_fd, 2)
        os.write(status_fd, READY_TOKEN)
        os.close(status_fd)

    try:
        body(ready)
    except N5fsError as exc:
        log.error("%s", exc)  # noqa: TRY400 (the reason is the message)
        return 2
    except Exception:
        log.exception("the daemon failed")
        return 2
    finally:
        logging.shutdown()
    return 0


def await_ready(read_fd: int, *, what: str, timeout: float) -> int:
    """:func:`await_daemon`, returning 0 once the daemon is ready."""
    await_daemon(read_fd, what=what, timeout=timeout)
    return 0


def await_daemon(read_fd: int, *, what: str, timeout: float) -> int | None:
    """Read the daemon's status pipe until it says ready (its pid, as it announced it),
    closes without (MountFailed with its words), or the time is up (the daemon is stopped;
    MountFailed)."""
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while READY_TOKEN not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _stop_daemon(buf)
                raise MountFailed(f"{what}: no answer within {timeout:g} s; gave up")
            readable, _, _ = select.select([read_fd], [], [], min(remaining, 1.0))
            if readable:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    said = "\n  ".join(daemon_lines(buf)) or "the daemon exited without a word"
                    raise MountFailed(f"{what} failed:\n  {said}")
                buf += chunk
    finally:
        os.close(read_fd)
    for line in daemon_lines(buf):
        shown = terminal_line(line)
        if shown is not None:
            print(shown, file=sys.stderr)  # the daemon's warnings from before it was ready
    return daemon_pid(buf)


def terminal_line(line: str) -> str | None:
    """A line the daemon logged before it was ready, as the terminal shows n5fs's own
    (``n5fs: WARNING: ...``); None for what is not n5fs's (libfuse speaks for itself)."""
    match = _DAEMON_LOG_LINE.match(line)
    if match is not None:
        return f"n5fs: {match['level']}: {match['message']}"
    return line if line.startswith("n5fs") else None


def daemon_lines(buf: bytes) -> list[str]:
    """What the daemon said, without the protocol lines and libfuse's noise."""
    text = buf.replace(READY_TOKEN, b"").decode(errors="replace")
    return [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith("\x00") and not line.startswith(_NOISE)
    ]


def daemon_pid(buf: bytes) -> int | None:
    """The pid the daemon announced first thing on its pipe (None if it had no time to)."""
    start = buf.find(PID_TAG)
    end = buf.find(b"\n", start)
    if start < 0 or end < 0:
        return None
    try:
        return int(buf[start + len(PID_TAG) : end])
    except ValueError:
        return None


def _stop_daemon(buf: bytes) -> None:
    pid = daemon_pid(buf)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


# == state files ==================================================================================


def state_dir() -> Path:
    """``$N5FS_STATE_DIR``, else ``$XDG_RUNTIME_DIR/n5fs``, ``/run/n5fs`` (root) or
    ``/tmp/n5fs-UID``."""
    explicit = os.environ.get("N5FS_STATE_DIR")
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "n5fs"
    if os.geteuid() == 0:
        return Path("/run/n5fs")
    return Path(tempfile.gettempdir()) / f"n5fs-{os.geteuid()}"


def state_path(mountpoint: str) -> Path:
    digest = hashlib.sha256(os.path.abspath(mountpoint).encode()).hexdigest()[:16]
    return state_dir() / f"{digest}.json"


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def remove_state(path: Path, pid: int) -> None:
    """Remove the state file if ``pid`` wrote it (a newer mount may own it by now)."""
    state = read_state(path)
    if state is not None and state.get("pid") == pid:
        path.unlink(missing_ok=True)


def remove_state_if_unchanged(path: Path, state: dict[str, Any]) -> bool:
    """Remove the state file if it still holds ``state``; True if removed.

    A daemon mounting at the same place may replace the file between the caller's judgement
    and this removal, so the file is first renamed to a private name (atomic: whichever
    version is current is taken) and compared there; one that changed is linked back (never
    over a newer one) and kept. For that instant the file is absent: a ``status`` then misses
    the mount, an ``unmount`` its log file; neither loses what the file says.
    """
    held = path.with_name(f".{path.name}.prune-{os.getpid()}")
    try:
        path.rename(held)
    except FileNotFoundError:
        return False  # removed meanwhile (its daemon exited, or another prune)
    if read_state(held) == state:
        held.unlink()
        return True
    with contextlib.suppress(FileExistsError):
        os.link(held, path)
    held.unlink()
    return False


def process_alive(pid: int) -> bool:
    """Running (a zombie is not: it only waits for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` has exited; False if it still runs after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
