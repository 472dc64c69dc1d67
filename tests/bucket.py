"""A bucket of the session's moto server as the S3 mount and network tests see it from
outside n5fs: the source a mount opens, what the bucket holds (read with boto3, behind any
mount's back), and whether ``n5fs validate`` calls it clean."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

#: the prefix the tests' mounts open
PREFIX = "data/"


def source(endpoint: str, bucket: str, path: str = PREFIX) -> str:
    return json.dumps({"driver": "s3", "bucket": bucket, "path": path, "endpoint": endpoint})


def held(client: Any, bucket: str, key: str, path: str = PREFIX) -> bytes | None:
    """The bytes at ``key`` under ``path``; None when there are none."""
    try:
        body: bytes = client.get_object(Bucket=bucket, Key=path + key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    return body


def validate_clean(endpoint: str, bucket: str, path: str = PREFIX) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "n5fs", "validate", source(endpoint, bucket, path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


class Sends:
    """The requests of one operation (``GetObject``, ``ListObjectsV2``) that botocore sent
    for a store: the ones the lean paths did not take over."""

    def __init__(self, store: Any, operation: str) -> None:
        self.requests: list[Any] = []
        store.client.meta.events.register(f"before-send.s3.{operation}", self._seen)

    def _seen(self, request: Any, **_: Any) -> None:
        self.requests.append(request)

    def __len__(self) -> int:
        return len(self.requests)
