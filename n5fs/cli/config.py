"""The per-mount TOML file of ``n5fs mount --config`` (``/etc/n5fs/NAME.toml`` for the unit
``n5fs@NAME.service``).

The whole file is checked before anything is mounted: an unknown key (with the nearest known
one), a value of the wrong type, a bad size or mode, or S3 settings for a source that is not on
S3 fail at start with the file, the key and the reason (exit 2), so a typo never turns into a
mount with silently different settings. Settings become the same ``-o`` options an fstab line
would carry, placed before the command line's own, so that a command-line flag wins.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from n5fs.errors import InvalidSource
from n5fs.fuse_front.options import (
    CONSISTENCY_MODES,
    VALIDATE_MODES,
    parse_seconds,
    parse_size,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping

    from n5fs.kvstore.spec import StoreSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ConfigError", "MountConfig", "S3Settings", "apply_config", "load_config"]

LOG_LEVELS = ("debug", "info", "warning", "error")
DEMO_SOURCE = "demo:"


class ConfigError(InvalidSource):
    """A config file that cannot be used; the message names the file, the key and why."""


@dataclass(frozen=True)
class S3Settings:
    """The ``[s3]`` table: applied to the S3 store of the source (also under a zip). Also
    what the ``--endpoint``/``--s3-*`` flags and ``-o s3_*`` options say."""

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    anonymous: bool | None = None
    connect_timeout: float | None = None
    read_timeout: float | None = None
    retries: int | None = None

    def overridden_by(self, other: S3Settings) -> S3Settings:
        """These settings, with what ``other`` sets replacing them."""
        changes = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)}
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class MountConfig:
    """One config file, checked; None means "not set here" (the default or the CLI decides)."""

    path: str
    source: str | None = None
    mountpoint: str | None = None
    validate: str | None = None
    read_only: bool | None = None
    cache_size: int | None = None
    cache_ttl: float | None = None
    staging_size: int | None = None
    max_file_size: int | None = None
    allow_other: bool | None = None
    log_level: str | None = None
    #: ``as = "zarr3"``: the format the mount shows (a view: read-only)
    view: str | None = None
    #: ``consistency = "strict"``: what other mounts' commits this one sees when
    consistency: str | None = None
    options: tuple[str, ...] = ()
    s3: S3Settings | None = None

    def option_groups(self) -> list[str]:
        """The file's settings as ``-o`` groups (before the command line's: those win)."""
        groups: list[str] = []
        if self.read_only is not None:
            groups.append("ro" if self.read_only else "rw")
        if self.allow_other:
            groups.append("allow_other")
        if self.validate is not None:
            groups.append(f"validate={self.validate}")
        if self.cache_size is not None:
            groups.append(f"cache_size={self.cache_size}")
        if self.cache_ttl is not None:
            groups.append(f"cache_ttl={self.cache_ttl:g}")
        if self.staging_size is not None:
            groups.append(f"staging_size={self.staging_size}")
        if self.max_file_size is not None:
            groups.append(f"max_file_size={self.max_file_size}")
        if self.view is not None:
            groups.append(f"as={self.view}")
        if self.consistency is not None:
            groups.append(f"consistency={self.consistency}")
        return [*groups, *self.options]


# == reading the file =============================================================================


def load_config(path: str) -> MountConfig:
    """Read and check ``path``; ConfigError names the first problem."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read it: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: not valid TOML: {exc}") from exc
    return parse_config(doc, path)


def parse_config(doc: Mapping[str, Any], path: str = "<config>") -> MountConfig:
    """The checked settings of a parsed TOML document."""
    _reject_unknown(doc, _KEYS, path)
    values: dict[str, Any] = {}
    for key, check in _KEYS.items():
        if key in doc:
            values[_FIELDS.get(key, key)] = _checked(path, key, check, doc[key])
    config = MountConfig(path=path, **values)
    if config.s3 is not None and config.source is not None:
        with_s3(config.source, config.s3, path)  # a source not on S3 fails now, at the file
    return config


class _KeyProblem(ValueError):
    """A problem inside a table, naming its own dotted key (``s3.endpoint``)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


def _checked(path: str, key: str, check: Callable[[object], Any], value: object) -> Any:
    try:
        return check(value)
    except _KeyProblem as exc:
        raise ConfigError(f"config {path}: {key}.{exc.key}: {exc}") from None
    except (InvalidSource, TypeError, ValueError) as exc:
        raise ConfigError(f"config {path}: {key}: {exc}") from None


def _reject_unknown(doc: Mapping[str, Any], known: Mapping[str, Any], path: str) -> None:
    for key in doc:
        if key not in known:
            raise ConfigError(f"config {path}: {key}: unknown key{_hint(key, known)}")


def _hint(key: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    return f" ({suggestion}known keys: {', '.join(known)})"


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _string(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"expected a non-empty string, got {_type_name(value)} {value!r}")
    return value.strip()


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {_type_name(value)} {value!r}")
    return value


def _source(value: object) -> str:
    """A URL, or a TensorStore kvstore spec as a table: both must parse now."""
    from n5fs.kvstore.spec import parse_spec

    if isinstance(value, dict):
        try:
            text = json.dumps(value)
        except TypeError as exc:  # a TOML date or time inside the table
            raise TypeError(f"a JSON spec table holds plain values only: {exc}") from None
    else:
        text = _string(value)
    if text != DEMO_SOURCE:
        parse_spec(text)
    return text


def _mountpoint(value: object) -> str:
    text = _string(value)
    if not os.path.isabs(text):
        raise ValueError(f"must be an absolute path (a service starts in /), got {text!r}")
    return os.path.normpath(text)


def _validate(value: object) -> str:
    text = _string(value)
    if text not in VALIDATE_MODES:
        raise ValueError(f"must be one of {', '.join(VALIDATE_MODES)}, not {text!r}")
    return text


def _size(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        return parse_size(value)
    raise TypeError(f'expected a size like "512M" or a number of bytes, got {value!r}')


def _cache_ttl(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return parse_seconds(str(value))
    if isinstance(value, str):
        return parse_seconds(value)
    raise TypeError(f"expected a number of seconds, got {_type_name(value)} {value!r}")


def _consistency(value: object) -> str:
    text = _string(value)
    if text not in CONSISTENCY_MODES:
        raise ValueError(f"must be one of {', '.join(CONSISTENCY_MODES)}, not {text!r}")
    return text


def _view(value: object) -> str:
    from n5fs.views import parse_view

    return parse_view(_string(value))


def _log_level(value: object) -> str:
    text = _string(value).lower()
    if text not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
    return text


def _options(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise TypeError(f'expected a list of option strings like ["uid=1000"], got {value!r}')
    return tuple(v.strip() for v in value)


def s3_timeout(value: object) -> float:
    """Seconds for an S3 timeout: a number (or its text) above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"expected a number of seconds, got {_type_name(value)} {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"cannot read {value!r} as seconds; write e.g. 5 or 0.5") from None
    if not (seconds > 0 and seconds != float("inf")):
        raise ValueError(f"a timeout must be more than 0 seconds, got {value!r}")
    return seconds


def s3_retries(value: object) -> int:
    """How often an S3 request is retried after its first attempt: 0 to 20."""
    from n5fs.kvstore.spec import S3_RETRY_LIMIT

    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number of retries, got {_type_name(value)} {value!r}")
    if not 0 <= value <= S3_RETRY_LIMIT:
        raise ValueError(f"retries must be between 0 and {S3_RETRY_LIMIT}, got {value}")
    return value


_S3_KEYS: dict[str, Callable[[object], Any]] = {
    "endpoint": _string,
    "region": _string,
    "profile": _string,
    "anonymous": _boolean,
    "connect_timeout": s3_timeout,
    "read_timeout": s3_timeout,
    "retries": s3_retries,
}


def _s3(value: object) -> S3Settings:
    if not isinstance(value, dict):
        raise TypeError(f'expected a table like {{ endpoint = "..." }}, got {value!r}')
    for key in value:
        if key not in _S3_KEYS:
            raise _KeyProblem(key, f"unknown key{_hint(key, _S3_KEYS)}")
    settings = {}
    for key, check in _S3_KEYS.items():
        if key in value:
            try:
                settings[key] = check(value[key])
            except (TypeError, ValueError) as exc:
                raise _KeyProblem(key, str(exc)) from None
    return S3Settings(**settings)


_KEYS: dict[str, Callable[[object], Any]] = {
    "source": _source,
    "mountpoint": _mountpoint,
    "validate": _validate,
    "read_only": _boolean,
    "cache_size": _size,
    "cache_ttl": _cache_ttl,
    "staging_size": _size,
    "max_file_size": _size,
    "allow_other": _boolean,
    "log_level": _log_level,
    "as": _view,
    "consistency": _consistency,
    "options": _options,
    "s3": _s3,
}
#: keys whose field in :class:`MountConfig` has another name (``as`` is a Python keyword)
_FIELDS = {"as": "view"}


# == S3 settings on a source ======================================================================


def with_s3(source: str, settings: S3Settings, path: str = "<config>") -> str:
    """The source as a JSON spec whose S3 store carries ``settings``."""
    from n5fs.kvstore.spec import parse_spec

    spec = None if source == DEMO_SOURCE else parse_spec(source)
    updated = None if spec is None else _apply_s3(spec, settings)
    if updated is None:
        raise ConfigError(
            f"config {path}: s3: the settings apply to an S3 source, but {source!r} is not on S3"
        )
    return json.dumps(updated.to_json())


def _apply_s3(spec: StoreSpec, settings: S3Settings) -> StoreSpec | None:
    from n5fs.kvstore.spec import S3Spec, ZipSpec

    if isinstance(spec, ZipSpec) and spec.base is not None:
        base = _apply_s3(spec.base, settings)
        return None if base is None else dataclasses.replace(spec, base=base)
    if not isinstance(spec, S3Spec):
        return None
    changes: dict[str, Any] = {
        "endpoint": settings.endpoint,
        "aws_region": settings.region,
        "profile": settings.profile,
        "anonymous": settings.anonymous,
        "connect_timeout": settings.connect_timeout,
        "read_timeout": settings.read_timeout,
        "max_retries": settings.retries,
    }
    return dataclasses.replace(spec, **{k: v for k, v in changes.items() if v is not None})


#: ``-o`` options (mount, fstab) that are S3 settings: taken out before libfuse sees them
S3_OPTIONS = {
    "s3_connect_timeout": "connect_timeout",
    "s3_read_timeout": "read_timeout",
    "s3_retries": "retries",
}


def take_s3_options(groups: list[str] | None) -> tuple[list[str], S3Settings]:
    """Split ``-o`` groups into the others (kept in order) and the S3 settings they carry
    (``s3_connect_timeout=SECONDS``, ``s3_read_timeout=SECONDS``, ``s3_retries=N``; a later
    one wins)."""
    from n5fs.fuse_front.options import split_options

    kept: list[str] = []
    values: dict[str, Any] = {}
    for group in groups or []:
        rest = []
        for item in split_options(group):
            name, _, value = item.partition("=")
            field = S3_OPTIONS.get(name.strip())
            if field is None:
                rest.append(item)
                continue
            try:
                values[field] = _S3_KEYS[field](value.strip())
            except (TypeError, ValueError) as exc:
                raise InvalidSource(f"-o {name.strip()}: {exc}") from None
        if rest:
            kept.append(",".join(i.replace("\\", "\\\\").replace(",", "\\,") for i in rest))
    return kept, S3Settings(**values)


# == merging with the command line ================================================================


def apply_config(args: argparse.Namespace, config: MountConfig) -> None:
    """Fill what the command line left open from ``config``; the command line wins."""
    if args.source is None:
        args.source = config.source
    if args.mountpoint is None:
        args.mountpoint = config.mountpoint
    if args.log_level is None:
        args.log_level = config.log_level
    args.options = [*config.option_groups(), *(args.options or [])]
    if config.s3 is not None and args.source is not None:
        args.source = with_s3(args.source, config.s3, config.path)
