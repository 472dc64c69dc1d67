"""A progress bar on stderr when it is a terminal; silent otherwise (pipes, CI, journald)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from typing_extensions import Self

if TYPE_CHECKING:
    from collections.abc import Callable


def _fmt_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """Polls ``sample() -> (done, total, bytes, total_known)`` and redraws one line."""

    def __init__(
        self,
        sample: Callable[[], tuple[int, int, int, bool]],
        *,
        label: str = "chunks",
        stream: TextIO | None = None,
        interval: float = 0.2,
    ) -> None:
        self._sample = sample
        self._label = label
        self._stream = stream if stream is not None else sys.stderr
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()
        self.enabled = self._stream.isatty()

    def line(self, width: int = 30) -> str:
        done, total, nbytes, known = self._sample()
        elapsed = max(time.monotonic() - self._start, 1e-6)
        rate = nbytes / elapsed / 1e6
        if not known or total == 0:
            return f"listing... {done} {self._label} checked, {rate:.1f} MB/s"
        frac = min(done / total, 1.0)
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = _fmt_eta((total - done) * elapsed / done) if done else "?"
        return f"[{bar}] {done}/{total} {self._label} {frac:6.1%} {rate:.1f} MB/s ETA {eta}"

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._stream.write("\r\x1b[K" + self.line())
            self._stream.flush()

    def __enter__(self) -> Self:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True, name="n5fs-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._stream.write("\r\x1b[K" + self.line() + "\n")
            self._stream.flush()
