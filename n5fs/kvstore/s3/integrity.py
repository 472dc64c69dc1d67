"""End-to-end integrity of S3 transfers: bytes are acknowledged only once the store is known to
hold exactly them, and bytes read are handed on only once they are known to be the object's.

Why: the network between n5fs and an endpoint can cut a body short, and an endpoint (or a
proxy on the way) can store what it received and answer ``200``; a connection can break after
a PUT reached the server, so the writer cannot know whether it landed; a GET's body can break
half-way. A gateway whose promise is "nothing invalid stored, nothing accepted lost" must not
take any of these for success.

Writes:

- every PUT and every part carries ``Content-MD5`` (S3 refuses a body that does not match it
  with ``BadDigest``, which the retry policy retries) besides the CRC32 botocore adds;
- the answer is checked: its ETag is the MD5 of the bytes for a single PUT, the MD5 of the parts'
  MD5s with ``-N`` for a multipart upload (:func:`expected_etag`), wherever the ETag is an MD5
  (not for SSE-KMS or SSE-C objects, :func:`etag_is_md5`); a mismatch is a failed attempt;
- a write whose outcome is unknown (the connection broke after the body went, or a retried
  create was refused because the first attempt had landed) is resolved by a HEAD before the
  caller hears anything (:func:`holds`): success only if the store holds exactly these bytes
  (same MD5 ETag, or the same full-object CRC32 where the ETag is no MD5).

Reads (:func:`read_body`): a body that breaks is resumed from the byte reached with a ranged
GET carrying ``If-Match`` of the first answer's ETag (a replaced object is read again from the
start, never stitched); a whole-object read is checked against the object's full CRC32 if the
store keeps one, else against an MD5 ETag; a mismatch is read again, then StoreUnavailable
(EIO), never wrong bytes.

Stateless: functions of a request's bytes and answers; no locks.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import zlib
from typing import TYPE_CHECKING, Any

from botocore import exceptions as bce
from urllib3 import exceptions as u3e

from n5fs.errors import StoreUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

__all__ = [
    "BODY_FAULTS",
    "Digest",
    "etag_is_md5",
    "expected_etag",
    "holds",
    "read_body",
]

#: a body is read in pieces of this size, so a break keeps what came before it
PIECE = 1 << 20
#: resumptions of one read, and whole re-reads after a checksum mismatch or a replaced object
RESUMES = 6
REREADS = 2
#: what a breaking body raises while it is read
BODY_FAULTS = (
    bce.ResponseStreamingError,
    bce.IncompleteReadError,
    bce.ReadTimeoutError,
    bce.ConnectionClosedError,
    u3e.ProtocolError,
    u3e.ReadTimeoutError,
    ConnectionError,
    TimeoutError,
)
#: what a request raises when botocore read its error answer's body (a 404's) and that broke:
#: botocore lets these through unwrapped, unretried. Anything botocore raised itself comes
#: after its (our policy's) retries and is final.
ERROR_BODY_FAULTS = (u3e.HTTPError,)
#: set in an answer whose body botocore did not check against its checksum (an answer of
#: :mod:`~n5fs.kvstore.s3.lean`): :func:`read_body` checks it
UNCHECKED = "N5fsUnchecked"
_MD5_ETAG = re.compile(r'^"?[0-9a-fA-F]{32}(-\d+)?"?$')


class Digest:
    """The MD5 (and its ``Content-MD5`` header form) and CRC32 of a value, computed once."""

    __slots__ = ("content_md5", "crc32", "md5")

    def __init__(self, data: bytes | memoryview) -> None:
        digest = hashlib.md5(data, usedforsecurity=False).digest()
        self.md5 = digest
        self.content_md5 = base64.b64encode(digest).decode()
        self.crc32 = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def expected_etag(digests: Sequence[Digest], *, multipart: bool = False) -> str:
    """The ETag S3 gives an object of these parts' bytes: the MD5 of the bytes for one PUT
    (one digest), the MD5 of the parts' MD5s and ``-N`` for a ``multipart`` upload."""
    if not multipart:
        return f'"{digests[0].md5.hex()}"'
    combined = hashlib.md5(b"".join(d.md5 for d in digests), usedforsecurity=False).hexdigest()
    return f'"{combined}-{len(digests)}"'


def etag_is_md5(answer: Mapping[str, Any]) -> bool:
    """Whether an answer's ETag is an MD5 of the bytes: S3 makes it one unless the object is
    encrypted with a KMS or a customer key (and other servers follow it)."""
    etag = answer.get("ETag")
    if not isinstance(etag, str) or not _MD5_ETAG.match(etag):
        return False
    sse = str(answer.get("ServerSideEncryption", ""))
    return not sse.startswith("aws:kms") and not answer.get("SSECustomerAlgorithm")


def same_etag(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip('"').lower() == b.strip('"').lower()


def stored_exactly(answer: Mapping[str, Any], etag: str, crc32: str | None) -> bool | None:
    """Whether the object an answer (PUT, Complete or HEAD) describes holds the bytes whose
    ETag is ``etag`` (and full-object CRC32 ``crc32``, if one); None when it cannot tell."""
    if etag_is_md5(answer):
        return same_etag(answer.get("ETag"), etag)
    echoed = answer.get("ChecksumCRC32")
    if crc32 is not None and isinstance(echoed, str) and "-" not in echoed:
        return echoed == crc32
    return None


def holds(head: Callable[[], Mapping[str, Any] | None], etag: str, crc32: str | None) -> bool:
    """Whether the store holds exactly the bytes of ``etag``/``crc32`` now (a HEAD, with the
    checksum asked for); a store that cannot tell is taken as not holding them."""
    try:
        answer = head()
    except (bce.BotoCoreError, bce.ClientError) as exc:
        log.warning("s3: could not learn whether a write landed: %s", exc)
        return False
    return answer is not None and bool(stored_exactly(answer, etag, crc32))


def _uncounted(_: str) -> None:
    """Counts nothing (for callers that keep no counts)."""


def read_body(
    get: Callable[..., dict[str, Any]],
    key: str,
    where: str,
    range_header: str | None = None,
    count: Callable[[str], None] = _uncounted,
) -> tuple[dict[str, Any], bytes]:
    """The answer of ``get(**args)`` and its body read whole, resumed where it breaks and
    checked where it can be (module docstring). ``range_header`` is the HTTP range asked for
    (None: the whole object, whose checksum is then checked). ``get`` raises ClientError for
    an answer that is no object (absent, an empty range); the caller handles those.

    botocore checks a whole object's full checksum itself when the answer carries one (it asks
    for it on every GET) and its body arrives in one piece; a resumed body, or an object with
    no such checksum, is checked here. ``count`` is told each ``s3_reads_again`` (a read
    begun anew) and ``s3_reads_resumed`` (a body resumed by range)."""
    for reread in range(REREADS + 1):
        if reread:
            count("s3_reads_again")
        try:
            answer = get(**({"Range": range_header} if range_header else {}))
        except ERROR_BODY_FAULTS as exc:
            log.debug("s3: the answer to a GET of %r broke (%s); asking again", key, exc)
            continue
        try:
            read = _pieces(get, answer, key, where, count)
        except bce.ChecksumError as exc:  # botocore's check of an unbroken body
            log.warning("s3: %r in %s read back damaged (read %d): %s", key, where, reread + 1, exc)
            continue
        if read is None:
            continue  # replaced while it was read: read it again
        pieces, resumed = read
        data = b"".join(pieces) if len(pieces) != 1 else pieces[0]
        whole = "ContentRange" not in answer
        checked = not resumed and not answer.get(UNCHECKED) and _checksummed(answer)
        if not whole or _intact(answer, data, checked=checked):
            return answer, data
        log.warning("s3: %r in %s read back damaged (read %d)", key, where, reread + 1)
    raise StoreUnavailable(
        f"s3: {key!r} in {where} could not be read intact ({REREADS + 1} reads: the answer "
        "broke, a checksum did not match, or the object kept changing while it was read)"
    )


def _span(answer: Mapping[str, Any]) -> tuple[int, int | None]:
    """The first and last byte (inclusive; None: to the end) an answer's body holds."""
    content_range = answer.get("ContentRange")
    if isinstance(content_range, str):
        match = re.match(r"bytes (\d+)-(\d+)/", content_range)
        if match:
            return int(match.group(1)), int(match.group(2))
    return 0, None


def _pieces(
    get: Callable[..., dict[str, Any]],
    answer: dict[str, Any],
    key: str,
    where: str,
    count: Callable[[str], None],
) -> tuple[list[bytes], bool] | None:
    """The body of ``answer`` in pieces, and whether a break was resumed (None: the object
    was replaced meanwhile, or a resumption did not answer the range asked for)."""
    pieces: list[bytes] = []
    got = 0
    first, last = _span(answer)
    body = answer["Body"]
    etag = answer.get("ETag")
    for resume in range(RESUMES + 1):
        try:
            while piece := body.read(PIECE):
                pieces.append(piece)
                got += len(piece)
        except BODY_FAULTS as exc:
            _close(body)
            if resume == RESUMES or etag is None:
                raise StoreUnavailable(
                    f"s3: the body of {key!r} in {where} broke {resume + 1} times "
                    f"({got} bytes read): {exc}"
                ) from exc
            log.debug("s3: body of %r broke after %d bytes (%s); resuming", key, got, exc)
            count("s3_reads_resumed")
        else:
            return pieces, resume > 0
        wanted = f"bytes={first + got}-{'' if last is None else last}"
        try:
            again = get(Range=wanted, IfMatch=etag)
        except bce.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("PreconditionFailed", "412"):
                return None
            raise
        except ERROR_BODY_FAULTS as exc:
            log.debug("s3: resuming %r broke too (%s)", key, exc)
            body = _Broken(exc)
            continue
        if _span(again)[0] != first + got:
            _close(again["Body"])
            return None  # a server that ignored the range: read it again whole
        body = again["Body"]
    raise AssertionError("unreachable: the loop returns or raises")


class _Broken:
    """A body whose request broke before it began: reading it raises that fault."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def read(self, _: int) -> bytes:
        raise self.exc

    def close(self) -> None:
        """Nothing to close."""


def _close(body: Any) -> None:
    try:
        body.close()
    except Exception:  # a broken connection may fail to close too
        log.debug("s3: closing a broken body failed", exc_info=True)


#: the full-object checksums botocore checks on a GET that carries one
_CHECKSUMS = (
    "ChecksumCRC32",
    "ChecksumCRC32C",
    "ChecksumCRC64NVME",
    "ChecksumSHA1",
    "ChecksumSHA256",
)


def _full_object(value: object) -> bool:
    return isinstance(value, str) and "-" not in value


def _checksummed(answer: Mapping[str, Any]) -> bool:
    return answer.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT" and any(
        _full_object(answer.get(name)) for name in _CHECKSUMS
    )


def _intact(answer: Mapping[str, Any], data: bytes, *, checked: bool) -> bool:
    """Whether a whole object's bytes match its full CRC32 (else SHA-256, SHA-1) or its MD5
    ETag; True when botocore ``checked`` them already, or where the store gives neither (then
    only the length was checked, by the body)."""
    if checked:
        return True
    if answer.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
        crc = answer.get("ChecksumCRC32")
        if _full_object(crc):
            return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode() == crc
        for name, algorithm in (("ChecksumSHA256", "sha256"), ("ChecksumSHA1", "sha1")):
            expected = answer.get(name)
            if _full_object(expected):
                digest = hashlib.new(algorithm, data).digest()
                return base64.b64encode(digest).decode() == expected
    etag = answer.get("ETag")
    if etag_is_md5(answer) and _full_object(etag):
        return same_etag(hashlib.md5(data, usedforsecurity=False).hexdigest(), etag)
    return True
