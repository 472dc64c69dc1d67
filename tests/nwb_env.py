"""A virtualenv of its own holding the real NWB writer on Zarr v2: hdmf-zarr 0.13 and pynwb.

hdmf-zarr 0.13.0 is the last release that writes Zarr v2 (0.14 moved to Zarr v3) and needs
``zarr<3``; the test venv holds zarr 3 for every other tier, so the writer cannot live there.
It gets a venv under the cache directory (``$N5FS_TEST_CACHE``, else ``~/.cache/n5fs-tests``),
built once per pinned requirement set and Python version and reused by later runs. An
exclusive lock serialises builders (two pytest processes wait for one build, never race it),
and a marker written last makes a half-built venv (a killed build) count as absent.

A failed build raises :class:`NwbEnvError` carrying pip's output: the tests that need it fail
with that output, never skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: what pip resolved for ``hdmf-zarr==0.13.0 pynwb`` on CPython 3.11 (the writer's stack is
#: pinned; numpy, h5py and pandas float: they do not shape what lands in the store, and numpy's
#: pickles name ``numpy.core`` or ``numpy._core``, both on the plain allow-list)
REQUIREMENTS = (
    "hdmf-zarr==0.13.0",
    "pynwb==4.2.0",
    "hdmf==6.2.0",
    "zarr==2.18.7",
    "numcodecs==0.15.2",
)
#: what the venv must import once built: a build that pip calls a success but cannot run the
#: writer is a failure too
_SMOKE = (
    "import hdmf_zarr, pynwb, zarr; from hdmf_zarr.nwb import NWBZarrIO; "
    "assert zarr.__version__.startswith('2.'), zarr.__version__"
)
PIP_TIMEOUT = 900.0
_READY = "n5fs-ready.json"


class NwbEnvError(RuntimeError):
    """The NWB venv could not be built, or a script in it failed; the message holds the output."""


def cache_dir() -> Path:
    configured = os.environ.get("N5FS_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "n5fs-tests"


def _key() -> str:
    """Requirements, interpreter and machine: a venv is valid for exactly these."""
    facts = [*REQUIREMENTS, sys.implementation.name, platform.python_version(), platform.machine()]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]


def venv_dir() -> Path:
    return cache_dir() / f"nwb-venv-{_key()}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _clean_env() -> dict[str, str]:
    """The caller's environment (pip's configuration included) without what would make the
    venv's Python import the test venv's packages."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(args: list[str], what: str, timeout: float) -> str:
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_clean_env(),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = f"{exc.stdout or ''}{exc.stderr or ''}"
        raise NwbEnvError(f"{what} timed out after {timeout:.0f} s:\n{output}") from exc
    output = f"$ {' '.join(args)}\n{done.stdout}{done.stderr}"
    if done.returncode != 0:
        raise NwbEnvError(f"{what} failed (exit {done.returncode}):\n{output}")
    return output


def _build(venv: Path) -> float:
    """Build the venv from nothing; returns the seconds it took."""
    start = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], "creating the NWB venv", 300)
    pip = [str(_python(venv)), "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
    _run([*pip, "--disable-pip-version-check", *REQUIREMENTS], "pip install", PIP_TIMEOUT)
    _run([str(_python(venv)), "-c", _SMOKE], "importing hdmf-zarr in the NWB venv", 300)
    return time.monotonic() - start


def nwb_python() -> Path:
    """The NWB venv's interpreter, building the venv first if no complete one exists."""
    venv = venv_dir()
    ready = venv / _READY
    if ready.exists():
        return _python(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not ready.exists():  # another process may have built it while we waited
            seconds = _build(venv)
            info = {"requirements": list(REQUIREMENTS), "build_seconds": round(seconds, 1)}
            partial = venv / f"{_READY}.partial"
            partial.write_text(json.dumps(info))
            os.replace(partial, ready)
    return _python(venv)


def build_seconds() -> float | None:
    """How long the cached venv took to build (None before it exists)."""
    ready = venv_dir() / _READY
    if not ready.exists():
        return None
    return float(json.loads(ready.read_text())["build_seconds"])


def run_in_nwb_env(source: str, *args: str, workdir: Path, timeout: float = 300) -> str:
    """Run the Python ``source`` in the NWB venv (as ``workdir/script.py``, so tracebacks show
    its lines) with ``args``; its output, or NwbEnvError with that output."""
    python = nwb_python()
    script = workdir / "script.py"
    script.write_text(source)
    return _run([str(python), str(script), *args], "the NWB writer script", timeout)
