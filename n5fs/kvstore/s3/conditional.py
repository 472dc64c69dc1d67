"""S3 conditional writes (``If-Match`` / ``If-None-Match``): what a refusal looks like, and
whether an endpoint honours them at all.

Many mounts of one bucket keep metadata consistent only if a PUT can be made conditional.
AWS S3 checks both headers on PutObject and CompleteMultipartUpload; some S3-compatible
servers and proxies drop or ignore them, and then a conditional PUT silently overwrites.
Such an endpoint cannot be recognised by its name, so :func:`probe` asks it: a scratch object
is created twice with ``If-None-Match: *`` (the second must be refused) and written once with
the ``If-Match`` of a wrong ETag (must be refused), then removed.

A refusal arrives as a 412 PreconditionFailed, a 409 ConditionalRequestConflict (two
conditional writes racing on AWS), or a 404 NoSuchKey answering an ``If-Match`` of a key
that is gone: :func:`conflict` makes each a :class:`~n5fs.errors.VersionConflict` (EAGAIN)
naming the key and the version the writer expected.

The scratch object is a temp name of :mod:`n5fs.kvstore.tempnames` (``PARTIAL_SUFFIX`` and
the writer tag) at the store's root, ``.n5fs-probe.<tag><random>.n5fs-partial``: listings
never show it (:func:`is_scratch`), and if the daemon dies mid-probe a later mount's
``sweep`` finds it with one LIST of :data:`SCRATCH_START` (:func:`scratch_leftover`) and
removes it once its writer is dead. Only the probe writes such objects on S3, so that one
LIST (not a walk of the bucket) finds every one.

Stateless: functions over a store and its client; no locks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from n5fs.errors import VersionConflict
from n5fs.kvstore import tempnames
from n5fs.kvstore.s3.errors import ABSENT, CONFLICT
from n5fs.kvstore.tempnames import Leftover

if TYPE_CHECKING:
    from n5fs.kvstore.s3.store import S3Store

log = logging.getLogger(__name__)

#: the name the scratch object's temp name stands for
PROBE_NAME = "n5fs-probe"
#: every scratch object's key starts so (at the store's root)
SCRATCH_START = f".{PROBE_NAME}."
#: :attr:`Leftover.what` of a scratch object a killed prober left
SCRATCH_WHAT = "probe object"
#: an ETag no object has (the MD5 of nothing is d41d8cd9...): the probe's wrong ``If-Match``
WRONG_ETAG = '"00000000000000000000000000000000"'


def conditions(version: str | None) -> dict[str, str]:
    """The request parameters of a write that must find ``key`` at ``version`` (None: absent)."""
    return {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}


def conflict(code: str, key: str, version: str | None, where: str) -> VersionConflict | None:
    """The VersionConflict an S3 error ``code`` answering a conditional write of ``key``
    means, or None for any other failure."""
    if code in CONFLICT or (version is not None and code in ABSENT):
        expected = "absent" if version is None else f"at version {version}"
        found = "absent" if code in ABSENT else "changed by another writer"
        return VersionConflict(
            f"conditional write of {key!r} in {where} refused ({code}): "
            f"expected it {expected}, it is {found}"
        )
    return None


def scratch_key() -> str:
    """A fresh scratch key of this process (hidden from listings, swept once we are dead)."""
    return tempnames.temp_name(PROBE_NAME)


def is_scratch(name: str) -> bool:
    """Whether a key's last segment is an n5fs temp name (listings never show those)."""
    return tempnames.is_partial(name.rpartition("/")[2])


def scratch_leftover(key: str, size: int, mtime: float) -> Leftover | None:
    """What ``validate`` reports and ``sweep`` removes for a scratch object; None for a key
    that is no scratch object."""
    if not (key.startswith(SCRATCH_START) and "/" not in key and tempnames.is_partial(key)):
        return None
    writer = tempnames.writer_of(key)
    return Leftover(
        path=key,
        what=SCRATCH_WHAT,
        size=size,
        mtime=mtime,
        writer=str(writer) if writer is not None else "an unknown writer",
        dead=tempnames.is_dead(key, mtime),
    )


def probe(store: S3Store) -> str | None:
    """None when ``store`` refuses conditional writes that would overwrite, else why not (a
    line for the log and ``n5fs status``). Never raises; removes its scratch object."""
    if not store.traits.writable:
        return "read-only store: conditional writes not probed"
    key = scratch_key()
    try:
        return _ask(store, key)
    except Exception as exc:  # noqa: BLE001 (any answer of the endpoint is a reason)
        return f"conditional writes could not be probed: {_one_line(exc)}"
    finally:
        try:
            store.delete(key)
        except Exception as exc:  # noqa: BLE001 (a leftover for a sweep, not a failure)
            log.warning("could not remove the probe object %r (a sweep will): %s", key, exc)


def _ask(store: S3Store, key: str) -> str | None:
    store.set_if(key, b"", version=None)
    if _accepted(store, key, None):
        return "the endpoint ignored If-None-Match: a second create-only PUT succeeded"
    if _accepted(store, key, WRONG_ETAG):
        return "the endpoint ignored If-Match: a PUT with a wrong ETag succeeded"
    return None


def _accepted(store: S3Store, key: str, version: str | None) -> bool:
    try:
        store.set_if(key, b"probe", version=version)
    except VersionConflict:
        return False
    return True


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
