"""Store specs: values that name a store, parsed from and rendered to TensorStore's forms.

JSON follows TensorStore's kvstore specs (``{"driver": "s3", "bucket": ..., "path": ...}``);
URLs follow its pipeline syntax: a root URL, then ``|``-separated adapters
(``s3://bucket/x.zip|zip:inner/``). ``path`` is always the prefix inside the store (for a zip
``base``, the archive's own key). URLs may drop knobs (endpoint, credentials); JSON keeps all.

n5fs's own S3 knobs (``connect_timeout``, ``read_timeout``, ``max_retries``: see
:mod:`n5fs.kvstore.s3.client` for their defaults) appear in the JSON only when they differ from the
defaults, so a spec that uses none of them stays one TensorStore accepts.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote, unquote

from typing_extensions import Self

from n5fs.errors import InvalidSource

_S = TypeVar("_S", bound="StoreSpec")


@dataclass(frozen=True)
class StoreSpec(abc.ABC):
    """Base of every driver's spec. Subclasses are frozen dataclasses with a ``path``."""

    driver: ClassVar[str]
    #: the URL scheme (root stores) or adapter name (``zip``)
    url_scheme: ClassVar[str]
    path: str = ""

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """TensorStore-compatible JSON."""

    @abc.abstractmethod
    def to_url(self) -> str:
        """The URL pipeline form; knobs that URLs cannot carry are dropped."""

    @classmethod
    @abc.abstractmethod
    def from_json(cls: type[_S], obj: Mapping[str, Any]) -> _S:
        """Parse this driver's JSON (``driver`` already checked)."""

    @classmethod
    @abc.abstractmethod
    def from_url(cls: type[_S], rest: str, base: StoreSpec | None) -> _S:
        """Parse this driver's URL part (after ``scheme://`` or ``name:``)."""

    @property
    def location(self) -> tuple[Any, ...]:
        """What a URL preserves: equal locations name the same objects."""
        return (self.driver, self.path)

    def with_path(self, path: str) -> Self:
        return dataclasses.replace(self, path=path)


def _reject_unknown(obj: Mapping[str, Any], allowed: set[str]) -> None:
    extra = set(obj) - allowed - {"driver", "context"}
    if extra:
        driver = obj.get("driver")
        raise InvalidSource(f"unknown member(s) {sorted(extra)} in {driver!r} spec")


def _str_member(obj: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = obj.get(name, default)
    if not isinstance(value, str):
        raise InvalidSource(f"{obj.get('driver')!r} spec needs {name!r} as a string")
    return value


def _optional_str(obj: Mapping[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidSource(f"{obj.get('driver')!r} spec: {name!r} must be a string")
    return value


@dataclass(frozen=True)
class MemorySpec(StoreSpec):
    driver: ClassVar[str] = "memory"
    url_scheme: ClassVar[str] = "memory"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": "memory"}
        if self.path:
            out["path"] = self.path
        return out

    def to_url(self) -> str:
        return f"memory://{quote(self.path)}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> MemorySpec:
        _reject_unknown(obj, {"path"})
        return cls(path=_str_member(obj, "path", ""))

    @classmethod
    def from_url(cls, rest: str, base: StoreSpec | None) -> MemorySpec:
        return cls(path=unquote(rest))


@dataclass(frozen=True)
class FileSpec(StoreSpec):
    """A local directory (or, as a zip base, a local file). ``path`` is absolute."""

    driver: ClassVar[str] = "file"
    url_scheme: ClassVar[str] = "file"

    def __post_init__(self) -> None:
        if not self.path:
            raise InvalidSource("file spec needs a 'path'")
        if not os.path.isabs(self.path):
            trail = "/" if self.path.endswith("/") else ""
            object.__setattr__(self, "path", os.path.abspath(self.path) + trail)

    def to_json(self) -> dict[str, Any]:
        return {"driver": "file", "path": self.path}

    def to_url(self) -> str:
        return f"file://{quote(self.path)}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FileSpec:
        _reject_unknown(obj, {"path"})
        return cls(path=_str_member(obj, "path"))

    @classmethod
    def from_url(cls, rest: str, base: StoreSpec | None) -> FileSpec:
        path = unquote(rest)
        if not path.startswith("/"):
            raise InvalidSource(f"file URL needs an absolute path (file:///abs/...), got {rest!r}")
        return cls(path=path)


#: S3 request limits; :mod:`n5fs.kvstore.s3.client` explains the choice (one unresponsive request
#: must fail within ~12 s, so that a POSIX call answers EIO within 30 s)
S3_CONNECT_TIMEOUT = 2.0
S3_READ_TIMEOUT = 4.0
S3_MAX_RETRIES = 1
#: the most retries a spec may ask for (each costs up to connect + read timeout)
S3_RETRY_LIMIT = 20


def _seconds(value: object, name: str) -> float:
    """A positive, finite number of seconds (a timeout of 0 would make sockets non-blocking)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSource(f"s3 spec: {name!r} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidSource(f"s3 spec: {name!r} must be more than 0 seconds, got {value!r}")
    return float(value)


def _retries(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSource(f"s3 spec: 'max_retries' must be a whole number, got {value!r}")
    if not 0 <= value <= S3_RETRY_LIMIT:
        raise InvalidSource(
            f"s3 spec: 'max_retries' must be between 0 and {S3_RETRY_LIMIT}, got {value}"
        )
    return value


@dataclass(frozen=True)
class S3Spec(StoreSpec):
    """An S3 bucket and prefix; credentials from boto3's chain unless ``anonymous``.

    ``connect_timeout`` and ``read_timeout`` (seconds; the read timeout bounds each wait for
    the server, not a whole transfer) and ``max_retries`` (after the first attempt) bound
    how long one request may take on an unresponsive server.
    """

    driver: ClassVar[str] = "s3"
    url_scheme: ClassVar[str] = "s3"
    bucket: str = ""
    endpoint: str | None = None
    aws_region: str | None = None
    profile: str | None = None
    anonymous: bool = False
    requester_pays: bool = False
    connect_timeout: float = S3_CONNECT_TIMEOUT
    read_timeout: float = S3_READ_TIMEOUT
    max_retries: int = S3_MAX_RETRIES

    def __post_init__(self) -> None:
        if not self.bucket or "/" in self.bucket:
            raise InvalidSource(f"s3 spec needs a bucket name, got {self.bucket!r}")
        object.__setattr__(
            self, "connect_timeout", _seconds(self.connect_timeout, "connect_timeout")
        )
        object.__setattr__(self, "read_timeout", _seconds(self.read_timeout, "read_timeout"))
        _retries(self.max_retries)

    @property
    def location(self) -> tuple[Any, ...]:
        return (self.driver, self.bucket, self.path)

    @property
    def max_attempts(self) -> int:
        """Attempts per request, the first included."""
        return self.max_retries + 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": "s3", "bucket": self.bucket, "path": self.path}
        if self.endpoint:
            out["endpoint"] = self.endpoint
        if self.aws_region:
            out["aws_region"] = self.aws_region
        if self.anonymous:
            out["aws_credentials"] = {"type": "anonymous"}
        elif self.profile:
            out["aws_credentials"] = {"type": "profile", "profile": self.profile}
        if self.requester_pays:
            out["requester_pays"] = True
        if self.connect_timeout != S3_CONNECT_TIMEOUT:
            out["connect_timeout"] = self.connect_timeout
        if self.read_timeout != S3_READ_TIMEOUT:
            out["read_timeout"] = self.read_timeout
        if self.max_retries != S3_MAX_RETRIES:
            out["max_retries"] = self.max_retries
        return out

    def to_url(self) -> str:
        return f"s3://{self.bucket}/{quote(self.path)}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> S3Spec:
        _reject_unknown(
            obj,
            {
                "bucket",
                "path",
                "endpoint",
                "aws_region",
                "aws_credentials",
                "requester_pays",
                "host_header",
                "connect_timeout",
                "read_timeout",
                "max_retries",
            },
        )
        creds = obj.get("aws_credentials") or {}
        if not isinstance(creds, Mapping):
            raise InvalidSource("s3 spec: 'aws_credentials' must be an object")
        kind = creds.get("type", "default")
        if kind not in ("default", "anonymous", "profile", "environment", "ecs", "imds"):
            raise InvalidSource(f"s3 spec: unsupported aws_credentials type {kind!r}")
        requester_pays = obj.get("requester_pays", False)
        if not isinstance(requester_pays, bool):
            raise InvalidSource("s3 spec: 'requester_pays' must be true or false")
        return cls(
            path=_str_member(obj, "path", ""),
            bucket=_str_member(obj, "bucket"),
            endpoint=_optional_str(obj, "endpoint"),
            aws_region=_optional_str(obj, "aws_region"),
            profile=_optional_str(creds, "profile") if kind == "profile" else None,
            anonymous=kind == "anonymous",
            requester_pays=requester_pays,
            connect_timeout=obj.get("connect_timeout", S3_CONNECT_TIMEOUT),
            read_timeout=obj.get("read_timeout", S3_READ_TIMEOUT),
            max_retries=obj.get("max_retries", S3_MAX_RETRIES),
        )

    @classmethod
    def from_url(cls, rest: str, base: StoreSpec | None) -> S3Spec:
        bucket, _, path = rest.partition("/")
        return cls(bucket=bucket, path=unquote(path))


@dataclass(frozen=True)
class ZipSpec(StoreSpec):
    """A zip archive read through ``base``, whose ``path`` is the archive's key."""

    driver: ClassVar[str] = "zip"
    url_scheme: ClassVar[str] = "zip"
    base: StoreSpec | None = None

    def __post_init__(self) -> None:
        if self.base is None:
            raise InvalidSource("zip spec needs a 'base' naming the archive")
        if not self.base.path or self.base.path.endswith("/"):
            raise InvalidSource(f"zip base must name the archive file, got {self.base.path!r}")

    @property
    def location(self) -> tuple[Any, ...]:
        assert self.base is not None
        return (self.driver, self.base.location, self.path)

    def to_json(self) -> dict[str, Any]:
        assert self.base is not None
        out: dict[str, Any] = {"driver": "zip", "base": self.base.to_json()}
        if self.path:
            out["path"] = self.path
        return out

    def to_url(self) -> str:
        assert self.base is not None
        return f"{self.base.to_url()}|zip:{quote(self.path)}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ZipSpec:
        _reject_unknown(obj, {"base", "path"})
        return cls(path=_str_member(obj, "path", ""), base=parse_spec(obj.get("base")))

    @classmethod
    def from_url(cls, rest: str, base: StoreSpec | None) -> ZipSpec:
        if base is None:
            raise InvalidSource(
                "'zip:' is an adapter: it needs a base before it, e.g. file:///data/x.zip|zip:"
            )
        return cls(path=unquote(rest), base=base)


_BUILTIN: dict[str, type[StoreSpec]] = {
    cls.driver: cls for cls in (MemorySpec, FileSpec, S3Spec, ZipSpec)
}


def spec_class(driver: str) -> type[StoreSpec]:
    """The spec class of a driver: built-in, else the one a registered driver declares."""
    if driver in _BUILTIN:
        return _BUILTIN[driver]
    from n5fs.kvstore.registry import driver_class

    return driver_class(driver).spec_type


def parse_spec(obj: object) -> StoreSpec:
    """A spec from a StoreSpec, a JSON object, JSON text, or a URL."""
    if isinstance(obj, StoreSpec):
        return obj
    if isinstance(obj, str):
        text = obj.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidSource(f"source looks like JSON but does not parse: {exc}") from exc
        else:
            return parse_url(text)
    if not isinstance(obj, Mapping):
        raise InvalidSource(
            f"a store spec must be a URL or a JSON object, got {type(obj).__name__}"
        )
    driver = obj.get("driver")
    if not isinstance(driver, str):
        raise InvalidSource('a JSON store spec needs a \'driver\' string, e.g. {"driver": "file"}')
    return spec_class(driver).from_json(obj)


#: every form a SOURCE may take, for the messages that refuse one
SOURCE_FORMS = (
    "a local path (/data/volume, ./volume)",
    "file:///abs/path/",
    "s3://bucket/prefix/",
    "memory://",
    "demo: (the built-in demo store, as a SOURCE of the n5fs commands)",
    (
        "a zip archive's URL or path followed by |zip: or |zip:inner/prefix/ "
        "(file:///data/x.zip|zip:, s3://bucket/x.zip|zip:inner/)"
    ),
    'a JSON kvstore spec ({"driver": "s3", "bucket": "...", "path": "..."})',
)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(.*)", re.DOTALL)


def parse_url(url: str) -> StoreSpec:
    """Parse a URL pipeline: a root (``scheme://...`` or a bare local path), then adapters."""
    if not url:
        raise InvalidSource("empty source")
    root, *adapters = url.split("|")
    spec: StoreSpec
    if "://" in root:
        scheme, _, rest = root.partition("://")
        cls = _url_class(scheme, root=True)
        spec = cls.from_url(rest, None)
    else:
        _refuse_misspelt_url(root)
        spec = FileSpec(
            path=os.path.abspath(os.path.expanduser(root)) + ("/" if root.endswith("/") else "")
        )
    for part in adapters:
        name, sep, rest = part.partition(":")
        if not sep:
            raise InvalidSource(f"adapter {part!r} needs a colon, e.g. 'zip:' or 'zip:inner/'")
        spec = _url_class(name, root=False).from_url(rest, spec)
    return spec


def _refuse_misspelt_url(root: str) -> None:
    """A root that looks like a URL without its ``//`` (``s3:/bucket/x``, ``file:/data``) is a
    typo, not a relative local path to create: refuse it, saying what was meant. A name with
    a colon that is no known scheme and no ``name:/...`` (``run:3``) stays a local path."""
    found = _SCHEME.fullmatch(root)
    if found is None:
        return
    scheme, rest = found.groups()
    known = {cls.url_scheme for cls in _BUILTIN.values()}
    if scheme == "demo":
        raise InvalidSource(
            f"{root!r}: demo: is the built-in demo store, a SOURCE of the n5fs commands on its "
            "own (n5fs mount demo: DIR), with no path or adapter and not a store URL"
        )
    if scheme == ZipSpec.url_scheme:
        ZipSpec.from_url(rest, None)  # says that zip: is an adapter
    if scheme in known:
        slashes = "///" if scheme == FileSpec.url_scheme else "//"
        raise InvalidSource(
            f"{root!r} is a URL with slashes missing: did you mean "
            f"{scheme}:{slashes}{rest.lstrip('/')}? (a local path of that name: ./{root})"
        )
    if rest.startswith("/"):
        _url_class(scheme, root=True)  # an unknown scheme: the message lists the known forms


def _url_class(scheme: str, *, root: bool) -> type[StoreSpec]:
    for cls in _BUILTIN.values():
        if cls.url_scheme == scheme and (cls is ZipSpec) != root:
            return cls
    if root:
        raise InvalidSource(
            f"unknown URL scheme {scheme!r}; a source is one of: {'; '.join(SOURCE_FORMS)}"
        )
    raise InvalidSource(
        f"unknown URL adapter {scheme!r}; the one adapter is zip:, after the URL or path of a "
        "zip archive: file:///data/x.zip|zip: or s3://bucket/x.zip|zip:inner/prefix/"
    )
