"""Session fixtures shared by every tier: the moto S3 server (a real HTTP server on
127.0.0.1 in its own process, port 0 read back) and a fresh bucket per test; the lock-order
checks of tests marked ``debug_locks``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest

from n5fs import locking
from n5fs.testing.moto_server import moto_server

# the `mounter` fixture (real FUSE mounts in child processes) for every mount test
pytest_plugins = ("tests.mounting",)

_S3_ENDPOINTS: list[str] = []

# the tiers that never mount: a `fuse` test in one of them is filed in the wrong folder
_NO_MOUNT_TIERS = ("unit", "gateway")
_TESTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    region: str = "us-east-1"

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server for the session. Never skipped: moto is in the test extra."""
    with moto_server() as endpoint:
        _S3_ENDPOINTS.append(endpoint)
        yield S3Server(endpoint=endpoint)


@pytest.fixture(autouse=True, scope="session")
def _aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fake credentials for boto3's chain, never a real account; n5fs's state (the S3 upload
    journal) in a temp directory, never the machine's /var/lib/n5fs."""
    saved = {
        k: os.environ.get(k)
        for k in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "AWS_EC2_METADATA_DISABLED",
            "N5FS_STATE_DIR",
        )
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        N5FS_STATE_DIR=str(tmp_path_factory.mktemp("n5fs-state")),
    )
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True, scope="session")
def _one_botocore_loader() -> Iterator[None]:
    """Every botocore session of this process reads the service models through one loader.

    An S3 store makes a botocore session of its own, and each new session parses the S3
    model and the endpoint rules from their JSON files again (some 0.3 s of CPU): the tests
    open hundreds of stores in this process. botocore's loader caches what it parsed and
    hands the same read-only documents to every client of a session; here, to every session.
    Nothing else of a session is shared (credentials, events, parsers, config stay its own),
    and a mount's daemon is another process, untouched."""
    created = botocore.session.create_loader
    shared = created()

    def one_loader(search_path_string: str | None = None) -> Any:
        return shared if search_path_string is None else created(search_path_string)

    botocore.session.create_loader = one_loader
    yield
    botocore.session.create_loader = created


@pytest.fixture(autouse=True)
def _debug_locks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test marked ``debug_locks`` makes its locks checked (``N5FS_DEBUG_LOCKS=1``, for the
    mounts it starts too: tests/mounting.py) and fails on any lock-order violation, also one
    raised on a thread whose errors nobody sees (:func:`n5fs.locking.take_violations`)."""
    if request.node.get_closest_marker("debug_locks") is None:
        yield
        return
    monkeypatch.setenv(locking.ENV, "1")
    locking.take_violations()  # what an earlier test left behind is not this one's
    yield
    found = locking.take_violations()
    assert not found, "lock-order violations:\n" + "\n".join(found)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh bucket per test on the session's moto server."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a `fuse` test under tests/unit/ or tests/gateway/: those tiers run without
    /dev/fuse, and a mounting test belongs in tests/mount/."""
    misfiled = [
        item.nodeid
        for item in items
        if item.get_closest_marker("fuse") is not None
        and item.path.resolve().is_relative_to(_TESTS)
        and item.path.resolve().relative_to(_TESTS).parts[0] in _NO_MOUNT_TIERS
    ]
    if misfiled:
        raise pytest.UsageError(
            "fuse tests outside tests/mount/ (move the file there): " + ", ".join(misfiled)
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say plainly that the S3 tier ran, and against what (it must never be skipped silently)."""
    reports = [r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])]
    s3 = [r for r in reports if r.when == "call" and "s3" in r.keywords]
    if _S3_ENDPOINTS:
        terminalreporter.write_line(
            f"S3 tier: {len(s3)} tests ran against the moto server at {_S3_ENDPOINTS[0]} "
            "(a separate process, over HTTP)"
        )
    elif s3:
        terminalreporter.write_line("S3 tier: tests ran but no moto server was started")
