"""Sources as users paste them: URLs, pipelines, TensorStore JSON specs."""

from __future__ import annotations

import json
import os

import pytest

from n5fs.errors import InvalidSource
from n5fs.kvstore import open_store, parse_spec, parse_url
from n5fs.kvstore.registry import DRIVERS, driver_class, register_driver
from n5fs.kvstore.spec import FileSpec, MemorySpec, S3Spec, ZipSpec


@pytest.mark.parametrize(
    ("url", "spec"),
    [
        ("memory://", MemorySpec()),
        ("memory://pre/fix/", MemorySpec(path="pre/fix/")),
        ("file:///abs/path/", FileSpec(path="/abs/path/")),
        ("file:///with%20space/", FileSpec(path="/with space/")),
        ("/bare/abs", FileSpec(path="/bare/abs")),
        ("s3://bucket", S3Spec(bucket="bucket")),
        ("s3://bucket/prefix/", S3Spec(bucket="bucket", path="prefix/")),
        ("file:///data/x.zip|zip:", ZipSpec(base=FileSpec(path="/data/x.zip"))),
        ("s3://b/x.zip|zip:inner/", ZipSpec(base=S3Spec(bucket="b", path="x.zip"), path="inner/")),
        (
            "s3://b/outer.zip|zip:in.zip|zip:a/",
            ZipSpec(
                base=ZipSpec(base=S3Spec(bucket="b", path="outer.zip"), path="in.zip"), path="a/"
            ),
        ),
    ],
)
def test_url_parses_and_round_trips(url: str, spec: object) -> None:
    assert parse_url(url) == spec
    assert parse_url(parse_url(url).to_url()) == spec
    assert parse_spec(parse_url(url).to_json()) == spec


def test_relative_bare_path_becomes_absolute(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(str(tmp_path))
    spec = parse_url("rel/dir")
    assert spec == FileSpec(path=os.path.join(str(tmp_path), "rel/dir"))


@pytest.mark.parametrize(
    "obj",
    [
        {"driver": "file", "path": "/data/"},
        {"driver": "memory"},
        {
            "driver": "s3",
            "bucket": "b",
            "path": "p/",
            "endpoint": "http://127.0.0.1:9000",
            "aws_region": "eu-west-1",
        },
        {"driver": "s3", "bucket": "b", "path": "", "aws_credentials": {"type": "anonymous"}},
        {
            "driver": "s3",
            "bucket": "b",
            "path": "",
            "aws_credentials": {"type": "profile", "profile": "lab"},
        },
        {"driver": "zip", "base": {"driver": "file", "path": "/x.zip"}, "path": "in/"},
    ],
)
def test_json_spec_round_trips(obj: dict[str, object]) -> None:
    spec = parse_spec(obj)
    assert spec.to_json() == obj
    assert parse_spec(json.dumps(obj)) == spec


def test_url_drops_knobs_but_keeps_location() -> None:
    spec = parse_spec({"driver": "s3", "bucket": "b", "path": "p/", "endpoint": "http://e"})
    assert spec.to_url() == "s3://b/p/"
    assert parse_url(spec.to_url()).location == spec.location
    assert parse_url(spec.to_url()) != spec


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("", "empty source"),
        ("ftp://x/", "unknown URL scheme 'ftp'"),
        ("file:///x.zip|tar:", "unknown URL adapter 'tar'"),
        ("file:///x.zip|zip", "needs a colon"),
        ("zip://x", "unknown URL scheme 'zip'"),
        ("file://relative/path", "absolute path"),
        ("s3://", "bucket"),
        ('{"driver": "file"', "does not parse"),
        ('{"path": "/x"}', "'driver'"),
        ({"driver": "nosuch"}, "unknown kvstore driver 'nosuch'"),
        ({"driver": "file"}, "'path'"),
        ({"driver": "file", "path": "/x", "bogus": 1}, "bogus"),
        ({"driver": "zip", "base": {"driver": "file", "path": "/dir/"}}, "archive file"),
        ({"driver": "s3", "bucket": "b", "aws_credentials": {"type": "magic"}}, "magic"),
        (42, "URL or a JSON object"),
    ],
)
def test_bad_sources_say_why(source: object, words: str) -> None:
    with pytest.raises(InvalidSource) as info:
        parse_spec(source)
    assert words in str(info.value)


def test_open_store_read_only_wraps() -> None:
    store = open_store("memory://", read_only=True)
    assert store.traits.writable is False


def test_registry_refuses_silent_clobbering() -> None:
    assert "s3" in DRIVERS
    with pytest.raises(ValueError, match="already registered"):
        register_driver("file", "elsewhere:Store")
    register_driver("file", DRIVERS["file"][0])  # same target: fine
    with pytest.raises(TypeError):
        DRIVERS["x"] = ("a:b", "")  # type: ignore[index]


def test_unloadable_driver_names_the_hint() -> None:
    register_driver("broken-test-driver", "n5fs.no_such_module:Store")
    with pytest.raises(InvalidSource, match="cannot load"):
        driver_class("broken-test-driver")


# -- URLs that are typos, and what the messages offer instead ---------------------------------


@pytest.mark.parametrize(
    ("source", "meant"),
    [
        ("s3:/bucket/x", "s3://bucket/x"),
        ("s3:bucket/x/", "s3://bucket/x/"),
        ("s3:/bucket/x.zip|zip:", "s3://bucket/x.zip"),
        ("file:/data/vol", "file:///data/vol"),
        ("memory:/pre", "memory://pre"),
    ],
)
def test_a_url_with_slashes_missing_is_refused_not_taken_for_a_path(
    source: str, meant: str
) -> None:
    with pytest.raises(InvalidSource) as info:
        parse_url(source)
    assert f"did you mean {meant}?" in str(info.value)


def test_names_with_a_colon_stay_local_paths(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(str(tmp_path))
    assert parse_url("run:3/x") == FileSpec(path=os.path.join(str(tmp_path), "run:3/x"))
    assert parse_url("./s3:/b") == FileSpec(path=os.path.join(str(tmp_path), "s3:/b"))


@pytest.mark.parametrize("source", ["ftp://x/", "gs:/bucket/x", "https://host/x.zip|zip:"])
def test_unknown_scheme_lists_every_accepted_form(source: str) -> None:
    with pytest.raises(InvalidSource) as info:
        parse_spec(source)
    message = str(info.value)
    assert "unknown URL scheme" in message
    for form in ("local path", "file:///", "s3://", "memory://", "demo:", "|zip:", "JSON"):
        assert form in message, form


def test_demo_and_zip_alone_are_explained() -> None:
    with pytest.raises(InvalidSource, match="built-in demo store"):
        parse_url("demo:")
    with pytest.raises(InvalidSource, match="'zip:' is an adapter"):
        parse_url("zip:inner/")


# -- n5fs's own S3 knobs ------------------------------------------------------------------------


def test_s3_timeouts_round_trip_and_stay_out_of_default_specs() -> None:
    obj = {
        "driver": "s3",
        "bucket": "b",
        "path": "p/",
        "connect_timeout": 1.5,
        "read_timeout": 30.0,
        "max_retries": 0,
    }
    spec = parse_spec(obj)
    assert isinstance(spec, S3Spec)
    assert (spec.connect_timeout, spec.read_timeout, spec.max_attempts) == (1.5, 30.0, 1)
    assert spec.to_json() == obj
    assert parse_url(spec.to_url()).location == spec.location
    plain = S3Spec(bucket="b")
    assert set(plain.to_json()) == {"driver", "bucket", "path"}  # what TensorStore accepts
    assert (plain.connect_timeout, plain.read_timeout, plain.max_retries) == (2.0, 4.0, 1)
    assert parse_spec({"driver": "s3", "bucket": "b", "read_timeout": 5}) == S3Spec(
        bucket="b", read_timeout=5.0
    )


@pytest.mark.parametrize(
    ("member", "value", "words"),
    [
        ("connect_timeout", 0, "more than 0 seconds"),
        ("read_timeout", -1.0, "more than 0 seconds"),
        ("read_timeout", "5", "number of seconds"),
        ("read_timeout", True, "number of seconds"),
        ("max_retries", -1, "between 0 and 20"),
        ("max_retries", 1.5, "whole number"),
    ],
)
def test_bad_s3_timeouts_say_why(member: str, value: object, words: str) -> None:
    with pytest.raises(InvalidSource) as info:
        parse_spec({"driver": "s3", "bucket": "b", member: value})
    assert words in str(info.value)
    assert repr(member) in str(info.value)
