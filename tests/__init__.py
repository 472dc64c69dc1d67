"""The test suite, in tiers by what a file drives: ``unit/`` (one layer, no gateway),
``gateway/`` (the gateway and views in-process), ``mount/`` (real FUSE mounts). Helpers
shared across tiers live here at the root (conftest, mounting, writers, bucket, nwb_env)."""

from pathlib import Path

# the repository's root, for files a test reads from the checkout (pyproject.toml, systemd/)
REPO_ROOT = Path(__file__).resolve().parent.parent
