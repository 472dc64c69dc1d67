"""Writing a zip archive into a seekable local file, ZIP64 only where a field overflows.

A rewrite copies unchanged members' compressed bytes as they are (read in large sequential
blocks through :class:`ArchiveReader`, so a remote base sees few requests) and adds new ones;
the caller then puts the finished file in place in one atomic step.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO

from n5fs.errors import StoreCorrupt
from n5fs.kvstore.zip import format as zf

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

#: a field at or past this value needs its ZIP64 form (module globals: tests lower them)
ZIP64_LIMIT = 0xFFFFFFFF
COUNT_LIMIT = 0xFFFF
_COPY_BLOCK = 8 << 20


class ArchiveReader:
    """Reads an existing archive in large blocks through ``fetch`` (sequential use is cheap)."""

    def __init__(self, fetch: zf.Fetch, size: int, what: str) -> None:
        self._fetch, self._size, self._what = fetch, size, what
        self._at, self._buf = 0, b""

    def read(self, start: int, n: int) -> bytes:
        if not self._at <= start or start + n > self._at + len(self._buf):
            stop = min(self._size, max(start + n, start + _COPY_BLOCK))
            self._at, self._buf = start, self._fetch(start, stop)
        data = self._buf[start - self._at : start - self._at + n]
        if len(data) != n:
            raise StoreCorrupt(f"{self._what}: a member runs past the archive's end")
        return data

    def chunks(self, start: int, n: int) -> Iterator[bytes]:
        for at in range(start, start + n, _COPY_BLOCK):
            yield self.read(at, min(_COPY_BLOCK, start + n - at))

    def member_data(self, m: zf.Member) -> Iterator[bytes]:
        """A member's compressed bytes, found through its local header."""
        head = self.read(m.header_offset, zf.LOCAL_HEADER_SIZE)
        at = m.header_offset + zf.local_data_offset(head, m, self._what)
        yield from self.chunks(at, m.csize)


def encode_name(name: str) -> tuple[bytes, int]:
    """Raw name bytes and the flag that says how they are encoded (UTF-8 unless ASCII)."""
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), zf.FLAG_UTF8


def _zip64_needed(member: zf.Member) -> bool:
    return member.size >= ZIP64_LIMIT or member.csize >= ZIP64_LIMIT


def _local_header(m: zf.Member) -> bytes:
    wide = _zip64_needed(m)
    extra = struct.pack("<2H2Q", 1, 16, m.size, m.csize) if wide else b""
    csize, size = (zf.SAT32, zf.SAT32) if wide else (m.csize, m.size)
    needed = max(m.version_needed, 45 if wide else 20)
    return (
        zf.LOCAL.pack(
            zf.SIG_LOCAL,
            needed,
            m.flags,
            m.method,
            m.dos_time & 0xFFFF,
            m.dos_time >> 16,
            m.crc,
            csize,
            size,
            len(m.raw_name),
            len(extra),
        )
        + m.raw_name
        + extra
    )


def _descriptor(m: zf.Member) -> bytes:
    fmt = "<4sL2Q" if _zip64_needed(m) else "<4s3L"
    return struct.pack(fmt, zf.SIG_DESCRIPTOR, m.crc, m.csize, m.size)


def _central_entry(m: zf.Member) -> bytes:
    wide: list[int] = []
    size, csize, offset = m.size, m.csize, m.header_offset
    if size >= ZIP64_LIMIT:
        wide.append(size)
        size = zf.SAT32
    if csize >= ZIP64_LIMIT:
        wide.append(csize)
        csize = zf.SAT32
    if offset >= ZIP64_LIMIT:
        wide.append(offset)
        offset = zf.SAT32
    zip64 = struct.pack(f"<2H{len(wide)}Q", 1, 8 * len(wide), *wide) if wide else b""
    extra = zip64 + m.extra if len(zip64) + len(m.extra) <= zf.MAX_FIELD else zip64
    needed = max(m.version_needed, 45 if wide else 20)
    return (
        zf.CENTRAL.pack(
            zf.SIG_CENTRAL,
            m.version_made,
            needed,
            m.flags,
            m.method,
            m.dos_time & 0xFFFF,
            m.dos_time >> 16,
            m.crc,
            csize,
            size,
            len(m.raw_name),
            len(extra),
            len(m.comment),
            0,
            0,
            m.external_attr,
            offset,
        )
        + m.raw_name
        + extra
        + m.comment
    )


def _end_records(count: int, cd_offset: int, cd_size: int, comment: bytes) -> bytes:
    out = b""
    if count >= COUNT_LIMIT or cd_offset >= ZIP64_LIMIT or cd_size >= ZIP64_LIMIT:
        record_at = cd_offset + cd_size
        out += zf.EOCD64.pack(
            zf.SIG_EOCD64,
            zf.EOCD64.size - 12,
            zf.MADE_BY,
            45,
            0,
            0,
            count,
            count,
            cd_size,
            cd_offset,
        )
        out += zf.LOCATOR.pack(zf.SIG_LOCATOR, 0, record_at, 1)
    short_count = count if count < COUNT_LIMIT else zf.MAX_FIELD
    return (
        out
        + zf.EOCD.pack(
            zf.SIG_EOCD,
            0,
            0,
            short_count,
            short_count,
            cd_size if cd_size < ZIP64_LIMIT else zf.SAT32,
            cd_offset if cd_offset < ZIP64_LIMIT else zf.SAT32,
            len(comment),
        )
        + comment
    )


class ArchiveWriter:
    """Writes an archive into a seekable local file: members in order, then the directory.

    New members are deflated (level 6) unless that does not make them smaller; then they are
    stored, as zip tools do (chunks are mostly compressed already; JSON metadata is not).
    """

    def __init__(self, out: BinaryIO, level: int = 6) -> None:
        self._out = out
        self._level = level
        self._members: list[zf.Member] = []
        #: header offset -> data offset of every member written (saves a read per member)
        self.data_offsets: dict[int, int] = {}

    def write_raw(self, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            self._out.write(chunk)

    def copy_member(self, member: zf.Member, data: Iterable[bytes]) -> None:
        """Copy a member's compressed bytes as they are, under a fresh local header."""
        new = replace(member, header_offset=self._out.tell())
        self._put_header(new)
        self.write_raw(data)
        if new.flags & zf.FLAG_DESCRIPTOR:
            self._out.write(_descriptor(new))
        self._members.append(new)

    def add(
        self, name: str, size: int, mtime: float, chunks: Callable[[], Iterable[bytes]]
    ) -> None:
        """Add a new member of ``size`` bytes; ``chunks()`` yields its bytes (called twice
        when the member ends up stored)."""
        raw_name, flags = encode_name(name)
        member = zf.Member(
            name,
            raw_name,
            self._out.tell(),
            size,
            size,
            zf.DEFLATED,
            0,
            zf.epoch_to_dos(mtime),
            flags,
        )
        self._put_header(member)  # a placeholder of the final length, patched below
        data_at = self._out.tell()
        crc, csize = self._deflate(chunks())
        if csize >= size:
            self._out.seek(data_at)
            self._out.truncate()
            crc, csize = 0, size
            for chunk in chunks():
                self._out.write(chunk)
                crc = zlib.crc32(chunk, crc)
            member = replace(member, method=zf.STORED)
        end = self._out.tell()
        member = replace(member, crc=crc, csize=csize)
        self._out.seek(member.header_offset)
        self._out.write(_local_header(member))
        self._out.seek(end)
        self._members.append(member)

    def _put_header(self, member: zf.Member) -> None:
        header = _local_header(member)
        self.data_offsets[member.header_offset] = member.header_offset + len(header)
        self._out.write(header)

    def _deflate(self, chunks: Iterable[bytes]) -> tuple[int, int]:
        comp = zlib.compressobj(self._level, zlib.DEFLATED, -zlib.MAX_WBITS)
        crc = csize = 0
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)
            piece = comp.compress(chunk)
            csize += len(piece)
            self._out.write(piece)
        piece = comp.flush()
        self._out.write(piece)
        return crc, csize + len(piece)

    def finish(self, comment: bytes) -> tuple[zf.Member, ...]:
        """Write the central directory and end records; return the members as written."""
        cd_offset = self._out.tell()
        for member in self._members:
            self._out.write(_central_entry(member))
        cd_size = self._out.tell() - cd_offset
        self._out.write(
            _end_records(len(self._members), cd_offset, cd_size, comment[: zf.MAX_FIELD])
        )
        return tuple(self._members)
