"""Where writes wait for their commit: memory first, a local temp file past a threshold.

Nothing here talks to the store; the gateway commits the staged bytes at flush/fsync/rename.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import BinaryIO


class StagedFile:
    """A growable byte buffer with POSIX write semantics (holes read as zeros)."""

    def __init__(
        self, initial: bytes = b"", *, spill_bytes: int = 64 << 20, tmp_dir: str | None = None
    ) -> None:
        self._buf: bytearray | None = bytearray(initial)
        self._file: BinaryIO | None = None
        self._size = len(initial)
        self._spill = spill_bytes
        self._tmp_dir = tmp_dir
        self.lock = threading.RLock()
        if self._size > spill_bytes:
            self._spill_now()

    @property
    def size(self) -> int:
        return self._size

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def _spill_now(self) -> None:
        assert self._buf is not None
        f = tempfile.TemporaryFile(dir=self._tmp_dir, prefix="n5fs-stage-")  # noqa: SIM115
        f.write(memoryview(self._buf)[: self._size])
        self._file = f
        self._buf = None

    def write(self, data: bytes, offset: int) -> int:
        with self.lock:
            end = offset + len(data)
            if self._buf is not None and end > self._spill:
                self._spill_now()
            if self._buf is not None:
                if end > len(self._buf):
                    # Grow geometrically: bytearray's own growth (1/8) would copy a
                    # sequentially written chunk many times over.
                    self._buf.extend(bytes(max(end, 2 * len(self._buf)) - len(self._buf)))
                if offset > self._size:
                    self._buf[self._size : offset] = bytes(offset - self._size)
                self._buf[offset:end] = data
            else:
                assert self._file is not None
                self._file.seek(offset)
                self._file.write(data)
            self._size = max(self._size, end)
            return len(data)

    def read(self, size: int, offset: int) -> bytes:
        with self.lock:
            if offset >= self._size:
                return b""
            size = min(size, self._size - offset)
            if self._buf is not None:
                return bytes(memoryview(self._buf)[offset : offset + size])
            assert self._file is not None
            self._file.seek(offset)
            return self._file.read(size)

    def truncate(self, length: int) -> None:
        with self.lock:
            if self._buf is not None and length > self._spill:
                self._spill_now()
            if self._buf is not None:
                if length > len(self._buf):
                    self._buf.extend(bytes(length - len(self._buf)))
                if length > self._size:  # bytes past the old end read as zeros
                    self._buf[self._size : length] = bytes(length - self._size)
                del self._buf[length:]
            if self._file is not None:
                self._file.truncate(length)
            self._size = length

    def getvalue(self) -> bytes:
        with self.lock:
            if self._buf is not None:
                return bytes(memoryview(self._buf)[: self._size])
            assert self._file is not None
            self._file.seek(0)
            return self._file.read()

    def spill_path(self) -> str | None:
        """A path to the spilled bytes (for streaming uploads), or None while in memory."""
        if self._file is None:
            return None
        self._file.flush()
        return f"/proc/self/fd/{self._file.fileno()}" if os.path.exists("/proc/self/fd") else None

    def close(self) -> None:
        with self.lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._buf = bytearray()
            self._size = 0
