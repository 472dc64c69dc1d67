"""Reading the zip container (PKWARE APPNOTE 6.3.x), reduced to what an adapter store needs.

Find the end-of-central-directory record (EOCD) in an archive's tail, follow the ZIP64
locator when there is one, parse the central directory into :class:`Member` records, and
decode one member with its output bounded by the size the directory declares. No store I/O
here: callers hand in bytes and a ``fetch(start, stop)``. Every malformed structure raises
:class:`StoreCorrupt` naming the archive (``what``). Writing is :mod:`n5fs.kvstore.zip.writer`.
"""

from __future__ import annotations

import bz2
import functools
import lzma
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from n5fs.errors import InvalidKey, NotSupported, StoreCorrupt
from n5fs.kvstore.keys import check_key

STORED, DEFLATED, BZIP2, LZMA = 0, 8, 12, 14
METHODS = {STORED: "stored", DEFLATED: "deflate", BZIP2: "bzip2", LZMA: "lzma"}
_AES = 99  # WinZip AES: encrypted whatever the flags say

FLAG_ENCRYPTED, FLAG_DESCRIPTOR, FLAG_STRONG, FLAG_UTF8 = 0x1, 0x8, 0x40, 0x800

EOCD = struct.Struct("<4s4H2LH")  # 22 bytes + comment
LOCATOR = struct.Struct("<4sLQL")  # ZIP64 EOCD locator, 20 bytes
EOCD64 = struct.Struct("<4sQ2H2L4Q")  # ZIP64 EOCD record, 56 bytes
CENTRAL = struct.Struct("<4s6H3L5H2L")  # central directory entry, 46 bytes
LOCAL = struct.Struct("<4s5H3L2H")  # local file header, 30 bytes
SIG_EOCD, SIG_LOCATOR, SIG_EOCD64 = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
SIG_CENTRAL, SIG_LOCAL, SIG_DESCRIPTOR = b"PK\x01\x02", b"PK\x03\x04", b"PK\x07\x08"
MAX_FIELD = 0xFFFF  # also the 16-bit "see ZIP64" sentinel
SAT32 = 0xFFFFFFFF  # the 32-bit "see ZIP64" sentinel

LOCAL_HEADER_SIZE = LOCAL.size
#: enough tail to hold the EOCD with the longest comment, plus the ZIP64 locator and record
TAIL_SIZE = EOCD.size + MAX_FIELD + LOCATOR.size + EOCD64.size
MADE_BY = (3 << 8) | 63  # Unix, APPNOTE 6.3
NEW_FILE_ATTR = 0o100644 << 16

Fetch = Callable[[int, int], bytes]
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True, slots=True)
class Member:
    """One central-directory entry; ``header_offset`` is absolute in the archive file."""

    name: str
    raw_name: bytes
    header_offset: int
    csize: int
    size: int
    method: int
    crc: int
    dos_time: int  # date << 16 | time, as stored
    flags: int = 0
    version_made: int = MADE_BY
    version_needed: int = 20
    external_attr: int = NEW_FILE_ATTR
    extra: bytes = b""  # central extra fields other than ZIP64 (kept on rewrite)
    comment: bytes = b""

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")

    @property
    def mtime(self) -> float:
        return dos_to_epoch(self.dos_time)

    def check_readable(self, what: str) -> None:
        """Refuse what we cannot decode, before any byte of it is fetched."""
        if self.flags & (FLAG_ENCRYPTED | FLAG_STRONG) or self.method == _AES:
            raise NotSupported(
                f"{what}: member {self.name!r} is encrypted; n5fs reads only "
                "unencrypted zip members"
            )
        if self.method not in METHODS:
            known = ", ".join(f"{k} ({v})" for k, v in METHODS.items())
            raise NotSupported(
                f"{what}: member {self.name!r} uses compression method "
                f"{self.method}; supported methods are {known}"
            )
        if self.method == STORED and self.csize != self.size:
            raise StoreCorrupt(
                f"{what}: stored member {self.name!r} declares {self.size} bytes "
                f"but holds {self.csize}"
            )


@dataclass(frozen=True, slots=True)
class Directory:
    members: tuple[Member, ...]
    comment: bytes
    #: bytes before the archive proper (a self-extractor's stub); member offsets include them
    start: int


@functools.lru_cache(maxsize=4096)  # members of one archive share few timestamps
def dos_to_epoch(dos: int) -> float:
    date, tod = dos >> 16, dos & 0xFFFF
    fields = (
        1980 + (date >> 9),
        (date >> 5) & 0xF,
        date & 0x1F,
        tod >> 11,
        (tod >> 5) & 0x3F,
        (tod & 0x1F) * 2,
        0,
        0,
        -1,
    )
    try:
        return time.mktime(fields)
    except (OverflowError, ValueError):
        return 0.0


def epoch_to_dos(ts: float) -> int:
    t = time.localtime(ts)
    year = min(max(t.tm_year, 1980), 2107)
    if year != t.tm_year:  # DOS dates span 1980-2107: clamp to the nearest end
        return ((year - 1980) << 9 | 1 << 5 | 1) << 16
    return ((year - 1980) << 9 | t.tm_mon << 5 | t.tm_mday) << 16 | (
        t.tm_hour << 11 | t.tm_min << 5 | t.tm_sec // 2
    )


# -- reading the directory -------------------------------------------------------------------


def read_directory(tail: bytes, size: int, fetch: Fetch, what: str) -> Directory:
    """Parse the directory of an archive of ``size`` bytes whose last bytes are ``tail``."""
    tail_at = size - len(tail)
    pos = _find_eocd(tail, what)
    _, disk, cd_disk, on_disk, count, cd_size, cd_offset, clen = EOCD.unpack_from(tail, pos)
    comment = tail[pos + EOCD.size : pos + EOCD.size + clen]
    end = tail_at + pos
    record = _zip64_record(tail, tail_at, pos, fetch, what)
    if record is not None:
        end, (disk, cd_disk, on_disk, count, cd_size, cd_offset) = record
    elif MAX_FIELD in (count, on_disk) or SAT32 in (cd_size, cd_offset):
        raise StoreCorrupt(f"{what}: end record needs ZIP64 values, but no ZIP64 record found")
    if disk or cd_disk or on_disk != count:
        raise NotSupported(f"{what}: archives split over several disks are not supported")
    cd_start = end - cd_size
    start = cd_start - cd_offset
    if cd_start < 0 or start < 0:
        raise StoreCorrupt(
            f"{what}: the central directory ({cd_size} bytes at {cd_offset}) "
            "does not fit before the end record"
        )
    raw = tail[cd_start - tail_at : end - tail_at] if cd_start >= tail_at else fetch(cd_start, end)
    members = _parse_central(raw, count, start, cd_start, what)
    return Directory(members, comment, start)


def _find_eocd(tail: bytes, what: str) -> int:
    """The EOCD whose comment ends the file; else the last plausible one (trailing junk)."""
    fallback = -1
    pos = tail.rfind(SIG_EOCD)
    while pos >= 0:
        if pos + EOCD.size <= len(tail):
            stop = pos + EOCD.size + EOCD.unpack_from(tail, pos)[-1]
            if stop == len(tail):
                return pos
            if stop < len(tail) and fallback < 0:
                fallback = pos
        pos = tail.rfind(SIG_EOCD, 0, pos)
    if fallback < 0:
        raise StoreCorrupt(
            f"{what}: no end-of-central-directory record in the last "
            f"{len(tail)} bytes (not a zip archive, or truncated)"
        )
    return fallback


def _zip64_record(
    tail: bytes, tail_at: int, pos: int, fetch: Fetch, what: str
) -> tuple[int, tuple[int, ...]] | None:
    """(absolute offset, values) of the ZIP64 EOCD record, if a locator precedes the EOCD."""
    at = pos - LOCATOR.size
    if at < 0 or tail[at : at + 4] != SIG_LOCATOR:
        return None
    _, _, recorded, _ = LOCATOR.unpack_from(tail, at)
    # Usually right before the locator; a stub before the archive shifts the recorded offset.
    for where in (tail_at + at - EOCD64.size, recorded):
        if where < 0:
            continue
        i = where - tail_at
        raw = tail[i : i + EOCD64.size] if i >= 0 else fetch(where, where + EOCD64.size)
        if raw[:4] == SIG_EOCD64 and len(raw) == EOCD64.size:
            fields = EOCD64.unpack(raw)
            return where, (fields[4], fields[5], fields[6], fields[7], fields[8], fields[9])
    raise StoreCorrupt(f"{what}: ZIP64 locator points at no ZIP64 end-of-directory record")


def _parse_central(
    raw: bytes, count: int, start: int, cd_start: int, what: str
) -> tuple[Member, ...]:
    members: list[Member] = []
    pos = 0
    while pos < len(raw):
        if pos + CENTRAL.size > len(raw) or raw[pos : pos + 4] != SIG_CENTRAL:
            raise StoreCorrupt(
                f"{what}: central directory entry {len(members)} is damaged "
                f"(no entry signature at directory offset {pos})"
            )
        member, pos = _parse_entry(raw, pos, start, what)
        if member.header_offset + LOCAL_HEADER_SIZE + member.csize > cd_start:
            raise StoreCorrupt(
                f"{what}: member {member.name!r} claims bytes past the start "
                "of the central directory"
            )
        members.append(member)
    # Old writers wrap the 16-bit count past 65535 entries; accept that, nothing else.
    if len(members) % (MAX_FIELD + 1) != count % (MAX_FIELD + 1):
        raise StoreCorrupt(
            f"{what}: end record announces {count} entries, the central "
            f"directory holds {len(members)}"
        )
    return tuple(members)


def _parse_entry(raw: bytes, pos: int, start: int, what: str) -> tuple[Member, int]:
    (
        _,
        made,
        needed,
        flags,
        method,
        tod,
        date,
        crc,
        csize,
        size,
        nlen,
        elen,
        clen,
        _,
        _,
        attr,
        offset,
    ) = CENTRAL.unpack_from(raw, pos)
    at = pos + CENTRAL.size
    stop = at + nlen + elen + clen
    if stop > len(raw):
        raise StoreCorrupt(f"{what}: central directory entry at offset {pos} runs past its end")
    raw_name = raw[at : at + nlen]
    extra = raw[at + nlen : at + nlen + elen]
    size, csize, offset, kept = _apply_zip64(extra, size, csize, offset, what)
    member = Member(
        name=_decode_name(raw_name, flags),
        raw_name=raw_name,
        header_offset=offset + start,
        csize=csize,
        size=size,
        method=method,
        crc=crc,
        dos_time=date << 16 | tod,
        flags=flags,
        version_made=made,
        version_needed=needed,
        external_attr=attr,
        extra=kept,
        comment=raw[at + nlen + elen : stop],
    )
    return member, stop


def _apply_zip64(
    extra: bytes, size: int, csize: int, offset: int, what: str
) -> tuple[int, int, int, bytes]:
    """Replace saturated fields with the ZIP64 extra's values; return the other extras."""
    kept = bytearray()
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if tag != 1:
            kept += extra[pos - 4 - length : pos]
            continue
        values = [v for v in (size, csize, offset) if v == SAT32]
        if len(body) < 8 * len(values):
            raise StoreCorrupt(f"{what}: a ZIP64 extra field is shorter than its entry needs")
        wide = iter(struct.unpack_from(f"<{len(values)}Q", body))
        size, csize, offset = (next(wide) if v == SAT32 else v for v in (size, csize, offset))
    return size, csize, offset, bytes(kept)


def _decode_name(raw: bytes, flags: int) -> str:
    if flags & FLAG_UTF8:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass  # mislabelled by its writer: read it as the legacy code page
    return raw.decode("cp437")


def safe_name(name: str) -> bool:
    """Whether a member name is a safe key (or, ending in ``/``, a safe prefix): never
    absolute, no ``..``, no backslash, no drive letter, nothing :func:`check_key` refuses."""
    if "\\" in name or name.startswith("/") or _DRIVE.match(name):
        return False
    try:
        check_key(name.removesuffix("/"))
    except InvalidKey:
        return False
    return True


def local_data_offset(head: bytes, member: Member, what: str) -> int:
    """Bytes from the start of a member's local header to its data (header is >= 30 bytes)."""
    if len(head) < LOCAL_HEADER_SIZE or head[:4] != SIG_LOCAL:
        raise StoreCorrupt(
            f"{what}: member {member.name!r} has no local header at offset {member.header_offset}"
        )
    nlen, elen = LOCAL.unpack_from(head)[-2:]
    return LOCAL_HEADER_SIZE + int(nlen) + int(elen)


# -- decoding one member ---------------------------------------------------------------------


class _Inflater:
    """deflate, bzip2 and lzma behind one call: push input, take at most ``n`` bytes out."""

    def __init__(self, member: Member, first: bytes, what: str) -> None:
        self._what = f"{what}: member {member.name!r}"
        self._tail = b""
        self._zlib = member.method == DEFLATED
        self.first = first
        self._dec: Any
        if self._zlib:
            self._dec = zlib.decompressobj(-zlib.MAX_WBITS)
        elif member.method == BZIP2:
            self._dec = bz2.BZ2Decompressor()
        else:
            self._dec = self._lzma(first)

    def _lzma(self, first: bytes) -> lzma.LZMADecompressor:
        # Zip's LZMA: version (2 bytes), properties length (2), properties, raw LZMA1 stream.
        plen = int.from_bytes(first[2:4], "little") if len(first) >= 4 else 0
        props = first[4 : 4 + plen]
        if plen < 5 or len(props) < plen:
            raise StoreCorrupt(f"{self._what}: LZMA header is damaged")
        self.first = first[4 + plen :]
        lc_lp_pb = props[0]
        filters = [
            {
                "id": lzma.FILTER_LZMA1,
                "dict_size": int.from_bytes(props[1:5], "little"),
                "lc": lc_lp_pb % 9,
                "lp": lc_lp_pb // 9 % 5,
                "pb": lc_lp_pb // 45,
            }
        ]
        try:
            return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=filters)
        except lzma.LZMAError as exc:
            raise StoreCorrupt(f"{self._what}: LZMA properties are invalid: {exc}") from exc

    @property
    def eof(self) -> bool:
        return bool(self._dec.eof)

    def pull(self, data: bytes, n: int) -> bytes:
        try:
            if not self._zlib:
                return bytes(self._dec.decompress(data, n))
            out = bytes(self._dec.decompress(self._tail + data, n))
            self._tail = self._dec.unconsumed_tail
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
            raise StoreCorrupt(f"{self._what}: compressed data is corrupt: {exc}") from exc
        return out


def decode(member: Member, blocks: Iterator[bytes], stop: int, *, full: bool, what: str) -> bytes:
    """The first ``stop`` decoded bytes of a compressed member, fed from ``blocks``.

    Output never passes ``stop + 1`` bytes: with ``full`` one byte beyond the declared size
    proves the member lies about it (a decompression bomb) and it is refused.
    """
    limit = stop + 1 if full else stop
    dec = _Inflater(member, next(blocks, b""), what)
    out = bytearray()
    data = dec.first
    while len(out) < limit and not dec.eof:
        piece = dec.pull(data, limit - len(out))
        data = b""
        if piece:
            out += piece
            continue
        more = next(blocks, None)
        if more is None:
            break
        data = more
    if len(out) > stop:
        raise StoreCorrupt(
            f"{what}: member {member.name!r} inflates past its declared size of "
            f"{member.size} bytes (refused: possible decompression bomb)"
        )
    if len(out) < stop:
        raise StoreCorrupt(
            f"{what}: member {member.name!r} is truncated: {len(out)} of {stop} bytes decode"
        )
    return bytes(out)


def check_crc(member: Member, data: bytes, what: str) -> None:
    if zlib.crc32(data) != member.crc:
        raise StoreCorrupt(f"{what}: member {member.name!r} fails its CRC-32 check")
