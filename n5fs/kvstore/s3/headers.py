"""What n5fs reads from and writes to S3 object headers: the time ``set_mtime`` gives an
object (user metadata ``x-amz-meta-mtime``, as rclone and s3fs-fuse keep it), and the headers
a server-side copy keeps. :mod:`n5fs.kvstore.s3.store` says why and how they are used.
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

#: the user metadata (``x-amz-meta-mtime``) that holds a time given by set_mtime
MTIME_META = "mtime"
#: headers a copy keeps (HEAD answer names = CopyObject parameter names)
_KEPT_HEADERS = (
    "CacheControl",
    "ContentDisposition",
    "ContentEncoding",
    "ContentLanguage",
    "ContentType",
    "StorageClass",
    "WebsiteRedirectLocation",
)


def format_mtime(mtime: float) -> str:
    """``x-amz-meta-mtime`` text: seconds and nine decimals, as rclone writes it."""
    sign = "-" if mtime < 0 else ""
    whole = math.floor(abs(mtime))
    nanos = round((abs(mtime) - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return f"{sign}{whole}.{nanos:09d}"


def mtime_of(head: Mapping[str, Any]) -> float:
    """The ``mtime`` metadata of a HEAD answer (rclone's fractional seconds or s3fs-fuse's
    whole ones), else its LastModified."""
    text = head.get("Metadata", {}).get(MTIME_META)
    if text is not None:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    last: datetime.datetime = head["LastModified"]
    return last.timestamp()


def copy_args(head: Mapping[str, Any], mtime: float) -> dict[str, Any]:
    """CopyObject parameters that keep what HEAD showed and carry ``mtime``."""
    args: dict[str, Any] = {name: head[name] for name in _KEPT_HEADERS if head.get(name)}
    if isinstance(head.get("Expires"), datetime.datetime):
        args["Expires"] = head["Expires"]
    if head.get("ServerSideEncryption") == "aws:kms" and head.get("SSEKMSKeyId"):
        args.update(ServerSideEncryption="aws:kms", SSEKMSKeyId=head["SSEKMSKeyId"])
    args["Metadata"] = {**head.get("Metadata", {}), MTIME_META: format_mtime(mtime)}
    args["MetadataDirective"] = "REPLACE"
    return args
