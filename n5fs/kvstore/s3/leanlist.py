"""ListObjectsV2 without botocore's request pipeline: a LIST page at a fraction of the CPU.

Why: a mount over S3 lists a dataset's chunk tree page by page, and botocore spends most of
a page's CPU in its model-driven parse (every element of every key through generic shape
handlers), several times what ElementTree alone costs. On two cores shared with the reader,
that CPU is the mount's speed. This path sends the request botocore would send (the route
of its first ListObjectsV2, as :mod:`~n5fs.kvstore.s3.lean` learns a GET's, now with a
query) and parses the answer with ElementTree into the part of botocore's answer the store
reads: ``Contents`` (``Key``, ``Size``, ``LastModified``, ``ETag``), ``CommonPrefixes``
(``Prefix``), ``IsTruncated``, ``NextContinuationToken``.

What it keeps, beyond what :mod:`~n5fs.kvstore.s3.lean` keeps (route, credentials, transport,
retries, breaker, throttle):

- **the query is botocore's**: ``list-type=2``, then the request's parameters in the order
  the store passes them (prefix, delimiter, max-keys, continuation token), then the
  ``encoding-type=url`` botocore adds, each percent-encoded as botocore encodes it; the
  route is learned only if botocore's first LIST URL is the route's base plus exactly this
  query and its signature (now over the sorted query) is this path's;
- **the parse is botocore's**: keys and prefixes URL-decoded as botocore decodes them
  (``unquote_plus``, and only when the answer says ``EncodingType`` ``url``), timestamps by
  the client's parser (:func:`~n5fs.kvstore.s3.client.parse_timestamp`), sizes as integers,
  an empty element as ``''``, namespaces ignored. No LIST goes this way until this parse of
  a page botocore fetched, one naming keys or prefixes, equals botocore's parse of the same
  bytes; a difference keeps every LIST on botocore;
- **a page is never short**: an answer that is not whole XML (cut short on the way, damaged)
  is a broken answer, retried as a reset is and failing as one does, never read as a
  shorter page; well-formed XML this path does not expect (another root element, a field
  repeated, a key without a name, a size that is no integer) is asked again through
  botocore. Pagination is the store's, by botocore's paginator's rules;
- **answers**: 200 is read here; transient answers become botocore's ``ClientError`` after
  the policy's retries; any other answer (403, 404 ``NoSuchBucket``, a redirect) is asked
  again through botocore.

State: the learned route and whether the parse was checked (each set once, read without a
lock), and a thread-local: the query a botocore LIST is about and its answer's body (for
learning and the check).
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote_plus
from xml.etree import ElementTree as ET

from botocore import exceptions as bce

from n5fs.kvstore.s3.client import parse_timestamp
from n5fs.kvstore.s3.lean import Fallback, LeanPath

if TYPE_CHECKING:
    import datetime
    from collections.abc import Callable, Mapping

    from botocore.awsrequest import AWSPreparedRequest

    from n5fs.kvstore.s3.lean import _Route
    from n5fs.kvstore.s3.retries import RetryPolicy, SilentEndpoint, Throttle

log = logging.getLogger(__name__)

__all__ = ["LeanLists", "parse_page", "query_of"]

#: the store's ListObjectsV2 arguments -> their query names (botocore's model)
_QUERY_NAMES = {
    "Prefix": "prefix",
    "Delimiter": "delimiter",
    "MaxKeys": "max-keys",
    "ContinuationToken": "continuation-token",
}
#: what botocore's ``percent_encode`` leaves as it is
_SAFE = "-_.~"
#: botocore's namespace stripping of a tag
_NAMESPACE = re.compile("{.*}")
#: the fields of a key and of the page this path reads (the rest is skipped)
_OBJECT_FIELDS = frozenset({"Key", "Size", "LastModified", "ETag"})
_PAGE_FIELDS = frozenset({"IsTruncated", "NextContinuationToken", "EncodingType"})


def query_of(args: Mapping[str, Any]) -> str:
    """The query of botocore's ListObjectsV2 URL for ``args`` (module docstring)."""
    parts = ["list-type=2"]
    for name, value in args.items():
        if value is not None:
            parts.append(f"{_QUERY_NAMES[name]}={quote(str(value), safe=_SAFE)}")
    parts.append("encoding-type=url")
    return "&".join(parts)


def _local(names: dict[str, str], tag: str) -> str:
    name = names[tag] = _NAMESPACE.sub("", tag)
    return name


def parse_page(body: bytes) -> dict[str, Any]:
    """The fields the store reads of a ListObjectsV2 answer, as botocore parses (and
    decodes) them. Raises ``ElementTree.ParseError`` for a body that is not whole XML,
    :class:`~n5fs.kvstore.s3.lean.Fallback` for XML this parse does not expect."""
    parser = ET.XMLParser(target=ET.TreeBuilder(), encoding="utf-8")  # botocore's
    parser.feed(body)
    root = parser.close()
    names: dict[str, str] = {}  # tag -> name without namespace
    if _local(names, root.tag) != "ListBucketResult":
        raise Fallback(f"an answer of another kind: {root.tag}")
    page: dict[str, Any] = {}
    contents: list[dict[str, Any]] = []
    prefixes: list[dict[str, Any]] = []
    seen_contents = seen_prefixes = False
    for child in root:
        name = names.get(child.tag) or _local(names, child.tag)
        if name == "Contents":
            seen_contents = True
            obj: dict[str, Any] = {}
            for item in child:
                field = names.get(item.tag) or _local(names, item.tag)
                if field in _OBJECT_FIELDS:
                    if field in obj:
                        raise Fallback(f"a key with two {field}")
                    obj[field] = item.text or ""
            contents.append(obj)
        elif name == "CommonPrefixes":
            seen_prefixes = True
            common: dict[str, Any] = {}
            for item in child:
                if (names.get(item.tag) or _local(names, item.tag)) == "Prefix":
                    if common:
                        raise Fallback("a common prefix with two names")
                    common["Prefix"] = item.text or ""
            if not common:
                raise Fallback("a common prefix without a name")
            prefixes.append(common)
        elif name in _PAGE_FIELDS:
            if name in page:
                raise Fallback(f"a page with two {name}")
            page[name] = child.text or ""
    encoded = page.pop("EncodingType", None) == "url"
    times: dict[str, datetime.datetime] = {}
    try:
        for obj in contents:
            key = obj["Key"]
            if encoded and ("%" in key or "+" in key):
                obj["Key"] = unquote_plus(key)
            if "Size" in obj:
                obj["Size"] = int(obj["Size"])
            text = obj.get("LastModified")
            if text is not None:
                when = times.get(text)
                if when is None:
                    when = times[text] = parse_timestamp(text)
                obj["LastModified"] = when
    except (KeyError, ValueError, TypeError, OverflowError) as exc:
        raise Fallback(f"a key this parse cannot read: {exc!r}") from exc
    if encoded:
        for common in prefixes:
            text = common["Prefix"]
            if "%" in text or "+" in text:
                common["Prefix"] = unquote_plus(text)
    if "IsTruncated" in page:
        page["IsTruncated"] = page["IsTruncated"] == "true"
    if seen_contents:
        page["Contents"] = contents
    if seen_prefixes:
        page["CommonPrefixes"] = prefixes
    return page


def _read_of(page: Mapping[str, Any]) -> dict[str, Any]:
    """What the store reads of botocore's ``page`` (the shape :func:`parse_page` makes)."""
    read = {name: page[name] for name in ("IsTruncated", "NextContinuationToken") if name in page}
    if "Contents" in page:
        read["Contents"] = [
            {name: obj[name] for name in _OBJECT_FIELDS if name in obj} for obj in page["Contents"]
        ]
    if "CommonPrefixes" in page:
        read["CommonPrefixes"] = [
            {"Prefix": common["Prefix"]} for common in page["CommonPrefixes"] if "Prefix" in common
        ]
    return read


class LeanLists(LeanPath):
    """ListObjectsV2 for one store's client (module docstring). ``page(args)`` answers as
    ``client.list_objects_v2(Bucket=..., **args)`` would for what the store reads, or raises
    :class:`~n5fs.kvstore.s3.lean.Fallback`; :meth:`through_botocore` makes the pages
    botocore fetches teach the route and check the parse."""

    operation = "ListObjectsV2"
    stream_output = False
    accepted = frozenset({200})

    def __init__(
        self,
        client: Any,
        policy: RetryPolicy,
        silent: SilentEndpoint,
        throttle: Throttle,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client, policy, silent, throttle, sleep=sleep)
        #: this path's parse of a page equals botocore's (set once)
        self.checked = False
        if self.refused is None:
            client.meta.events.register("before-parse.s3.ListObjectsV2", self._keep_body)

    @property
    def ready(self) -> bool:
        return self._route is not None and self.checked

    def page(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """One page of ``args`` (``Prefix``, ``Delimiter``, ``MaxKeys``,
        ``ContinuationToken``, in the order botocore would be given them)."""
        route = self._route
        if route is None or not self.checked:
            raise Fallback("no route")
        answer: dict[str, Any] = self._exchange(route, f"{route.base}?{query_of(args)}", {})
        return answer

    def through_botocore(
        self, args: Mapping[str, Any], call: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """botocore's page of ``args`` (``call`` asks for it): its request teaches the route,
        its body checks this path's parse, until both are done."""
        if self.checked or self.refused is not None:
            return call()
        local = self._expected
        local.body = None
        try:
            with self.expecting(query_of(args)):
                page = call()
            body = local.body
        finally:
            local.body = None
        if body is not None:
            self._check(body, page)
        return page

    # -- learning and checking ---------------------------------------------------------------

    def _route_of(self, request: AWSPreparedRequest, what: str) -> _Route | str:
        base, _, query = request.url.partition("?")
        if request.method != "GET" or query != what:
            return f"a ListObjectsV2 URL that is not base + this path's query: {request.url}"
        return self._learned(request, base)

    def _keep_body(self, response_dict: Mapping[str, Any], **_: Any) -> None:
        if getattr(self._expected, "key", None) is not None:
            ok = response_dict.get("status_code") == 200
            self._expected.body = response_dict.get("body") if ok else None

    def _check(self, body: bytes, page: Mapping[str, Any]) -> None:
        """Compare this path's parse of ``body`` with botocore's ``page`` (once one names
        keys or prefixes): equal, LISTs take this path from now on; else never."""
        if self._route is None or self.checked or self.refused is not None:
            return
        theirs = _read_of(page)
        if not theirs.get("Contents") and not theirs.get("CommonPrefixes"):
            return  # nothing much to compare yet
        try:
            mine: object = parse_page(body)
        except Exception as exc:  # noqa: BLE001  # any failure is a difference
            mine = exc
        if mine == theirs:
            self.checked = True
            log.debug("s3: lean LISTs from now on")
        else:
            self.refused = "this path's parse of a page differs from botocore's"
            log.info("s3: LISTs stay on botocore's path: %s", self.refused)

    # -- answers -------------------------------------------------------------------------------

    def _accept(self, response: Any) -> dict[str, Any]:
        try:
            return parse_page(response.content or b"")
        except ET.ParseError as exc:
            raise bce.HTTPClientError(
                error=f"a ListObjectsV2 answer that is not whole XML ({exc})"
            ) from exc
