"""Soak a read-write S3 mount under the faults of a real network, then compare the bucket with
what the mount acknowledged (:mod:`n5fs.testing.soak`): writers (files, zarr-python arrays,
``cp -r``) and readers through a real mount of a moto server on 127.0.0.1, behind the fault
proxy of :mod:`n5fs.testing.s3_proxy`, for ``--minutes``.

It prints one table: acknowledged writes, acknowledged lost, corrupt and invalid stored, wrong
reads, calls and their errnos (a fault may cost a call an errno, never a lie), calls over
30 s, the daemon's state and peak RSS, requests by kind and faults injected. Exit 0 if the
promise held (nothing lost, invalid or corrupt, no call over 30 s, the daemon alive), else 1.

    python scripts/soak.py                     # 10 minutes, the mixed faults
    python scripts/soak.py --minutes 1 --scale 2 --latency 0.025
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

import boto3

from n5fs.testing.moto_server import moto_server
from n5fs.testing.soak import SoakConfig, mixed_faults, run_soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=1.0, help="fault shares x SCALE (1: ~13%%)")
    parser.add_argument("--latency", type=float, default=0.0, help="one-way delay, seconds")
    parser.add_argument("--file-writers", type=int, default=3)
    parser.add_argument("--zarr-writers", type=int, default=2)
    parser.add_argument("--cp-writers", type=int, default=1)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = SoakConfig(
        seconds=args.minutes * 60,
        file_writers=args.file_writers,
        zarr_writers=args.zarr_writers,
        cp_writers=args.cp_writers,
        readers=args.readers,
        faults=lambda: mixed_faults(args.scale),
        latency=args.latency,
        seed=args.seed,
    )
    # the daemons and the checks reach the moto server with the environment's credentials:
    # any will do for moto, but boto3 wants some
    for name, value in (("AWS_ACCESS_KEY_ID", "soak"), ("AWS_SECRET_ACCESS_KEY", "soak")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="n5fs-soak-") as tmp:
        bucket = f"soak-{uuid.uuid4().hex[:12]}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="soak",
            aws_secret_access_key="soak",
        ).create_bucket(Bucket=bucket)
        report = run_soak(endpoint, bucket, Path(tmp), config)
    print(report.table())
    failures = report.failures()
    for failure in failures:
        print(f"FAILED: {failure}")
    print("the promise held" if not failures else "the promise broke")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
