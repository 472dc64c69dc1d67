"""The boto3 client of an S3 store: endpoint and addressing, region, profile, credentials
(or none, for public buckets), timeouts, the connection pool, and the transfer settings of
boto3's managed copies. botocore makes one attempt per request: the retries are
:mod:`~n5fs.kvstore.s3.retries`'s, hooked onto this client by the store.

Why apart from :mod:`~n5fs.kvstore.s3.store`: the store decides what to ask S3; this module decides
how a request travels, and those settings carry reasons of their own (below) that change with
endpoints and networks, not with the store's semantics.

Timeouts. An endpoint that accepts connections but never answers must cost a POSIX call an
EIO, not a hang: one FUSE call may make two S3 requests one after the other (a LIST, then a
batch of parallel GETs), and should answer within 30 s, so one request gets at most ~12 s
with its retries. The defaults (:class:`~n5fs.kvstore.spec.S3Spec`): connect 2 s (a TCP
handshake takes milliseconds; 2 s still covers one lost SYN, retransmitted after 1 s), read
4 s (the longest S3 keeps a client waiting between two bytes of an answer is well under that;
AWS even sends whitespace while a long CopyObject or CompleteMultipartUpload runs), and one
retry after a timeout: 2 attempts x (2 s + 4 s) + the retry's backoff (under 0.1 s) = ~12 s
(faults that answer at once, resets and ``5xx``, get more attempts: they cost a round trip). The read timeout bounds each wait on the socket, not a transfer: a GET
of many megabytes that keeps streaming never times out. A server that stays silent longer
during a large copy needs a larger ``read_timeout``; a slow link, a larger
``connect_timeout``; a flaky one, more ``max_retries`` (flags ``--s3-connect-timeout``,
``--s3-read-timeout``, ``--s3-retries``). DNS lookups are not bounded by these timeouts.
A POSIX call that would make several requests one after another (a lookup per path
component) does not pay this budget for each: once one request has timed out,
:class:`~n5fs.kvstore.s3.retries.SilentEndpoint` fails the other requests at once (one probe
at a time goes out) until an answer arrives or 10 s pass, so the call answers EIO within about
one request's budget, not one budget per request.

Timestamps. botocore parses every timestamp of an answer with dateutil's general parser, some
half a millisecond each: a LIST page of 1,000 keys spent most of its CPU there. Its response
parser takes a timestamp parser of the session's choosing (``set_parser_defaults``):
:func:`parse_timestamp` reads S3's ISO 8601 form (``2026-11-28T09:42:08.000Z``) directly,
into the same value (a UTC ``datetime`` with dateutil's ``tzutc``), and hands every other
form to botocore's own.

Stateless: functions of the spec; a client is thread-safe and belongs to its store.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import TYPE_CHECKING, Any

import boto3
import botocore.session
from boto3.s3.transfer import TransferConfig
from botocore import UNSIGNED
from botocore import exceptions as bce
from botocore.config import Config
from botocore.utils import parse_timestamp as botocore_timestamp

from n5fs.errors import InvalidSource

if TYPE_CHECKING:
    from n5fs.kvstore.spec import S3Spec

__all__ = [
    "TRANSFER_THREADS",
    "checksum_args",
    "client_for",
    "parse_timestamp",
    "transfer_config",
]

#: threads of one managed transfer (a multipart copy)
TRANSFER_THREADS = 8
#: requests the store's user may have in flight from threads of its own (a gateway's
#: read-ahead: dozens of GETs at once to hide a distant endpoint's latency)
CALLER_THREADS = 72


#: S3's timestamps in XML answers: UTC, seconds, optionally milliseconds
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?Z\Z")
#: the UTC botocore's own parser puts in a value (dateutil's ``tzutc``)
_UTC = botocore_timestamp("1970-01-01T00:00:00Z").tzinfo


def parse_timestamp(value: Any) -> datetime.datetime:
    """What botocore's parser makes of ``value``, read directly when it is S3's ISO 8601 form
    (module docstring)."""
    match = _ISO.match(value) if isinstance(value, str) else None
    if match is None:
        parsed: datetime.datetime = botocore_timestamp(value)
        return parsed
    year, month, day, hour, minute, second, fraction = match.groups()
    micro = int(fraction.ljust(6, "0")) if fraction else 0
    return datetime.datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micro, _UTC
    )


def custom_endpoint(spec: S3Spec) -> bool:
    """S3-compatible servers (MinIO, Ceph, moto) rarely resolve ``bucket.host``: use paths."""
    return bool(
        spec.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )


def client_for(spec: S3Spec, max_workers: int) -> Any:
    """A thread-safe boto3 client: the spec's endpoint, region, profile, credentials,
    timeouts and retries (module docstring).

    Its connection pool has room for the store's workers, one managed transfer (a multipart
    copy) and the requests of its user's own threads, so none waits on a socket held by
    another, and no connection is opened for one request and dropped after it.
    """
    config = Config(
        # one attempt: the retries are n5fs's own (:mod:`~n5fs.kvstore.s3.retries`)
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=spec.connect_timeout,
        read_timeout=spec.read_timeout,
        max_pool_connections=max_workers + TRANSFER_THREADS + CALLER_THREADS,
        s3={"addressing_style": "path"} if custom_endpoint(spec) else {},
        signature_version=UNSIGNED if spec.anonymous else None,
    )
    try:
        core = botocore.session.get_session()
        parsers = core.get_component("response_parser_factory")
        parsers.set_parser_defaults(timestamp_parser=parse_timestamp)
        session = boto3.Session(botocore_session=core, profile_name=spec.profile)
        return session.client(
            "s3", endpoint_url=spec.endpoint, region_name=spec.aws_region, config=config
        )
    except (bce.BotoCoreError, ValueError) as exc:
        raise InvalidSource(f"cannot set up s3 access for {spec.to_url()}: {exc}") from exc


def checksum_args(client: Any) -> dict[str, str]:
    """Mirror s3transfer: with default flexible checksums, parts carry a CRC32."""
    when = getattr(client.meta.config, "request_checksum_calculation", None)
    return {"ChecksumAlgorithm": "CRC32"} if when == "when_supported" else {}


def transfer_config(threshold: int, part_size: int) -> TransferConfig:
    """boto3's managed transfers: multipart above ``threshold``, in parts of ``part_size``."""
    return TransferConfig(
        multipart_threshold=threshold,
        multipart_chunksize=part_size,
        max_concurrency=TRANSFER_THREADS,
    )
