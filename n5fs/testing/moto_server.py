"""A moto S3 server in its own process on 127.0.0.1 (a real HTTP server, port 0 read back),
for tests and benchmarks: S3 code is exercised over the wire, never through an in-process
patch of boto3. Needs the ``moto[server]`` package (the ``test`` extra)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

_PORT_LINE = re.compile(rb"Running on http://127\.0\.0\.1:(\d+)")


def _command() -> list[str]:
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "moto.server"]


@contextmanager
def moto_server(startup_timeout: float = 60.0) -> Iterator[str]:
    """Start a server on a free loopback port; yield its endpoint URL; stop it on exit."""
    proc = subprocess.Popen(
        [*_command(), "-H", "127.0.0.1", "-p", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + startup_timeout
    port = None
    seen = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        match = _PORT_LINE.search(line)
        if match:
            port = int(match.group(1))
            break
    if port is None:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError(f"moto_server did not start: {seen.decode(errors='replace')}")
    # Keep draining its log so the server never blocks on a full pipe.
    drain = threading.Thread(target=proc.stdout.read, daemon=True, name="moto-log")
    drain.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(timeout=10)  # the pipe ends with the server
        if not drain.is_alive():  # closing under a blocked read would wait for it
            proc.stdout.close()
