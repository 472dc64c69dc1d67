"""``n5fs validate`` and the mount's commit path give one verdict per key: a
store validate passes copies through a mount, and what a mount refuses, validate reports.

Each fixture is written by a real writer (TensorStore, zarr-python), then spoiled with keys
the formats forbid. The same keys are then (a) validated in place and (b) committed one by one
into a fresh gateway, metadata first (top-down), then everything else, as ``cp -r`` with
metadata-first ordering would. A key is "refused" by the mount when its commit raises
Rejected, and "invalid" to validate when the report names it. The two sets must be equal.

Keys below a folder whose own metadata is broken are left out of the comparison: validate
reports that folder once (its metadata key), while the mount, which refused the broken
metadata, has no array there to judge them by.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from n5fs.errors import Rejected
from n5fs.formats.registry import METADATA_NAMES
from n5fs.gateway import Gateway
from n5fs.kvstore.memory import MemoryStore
from n5fs.validate import validate_store
from tests.writers import ramp, tensorstore_n5, tensorstore_zarr3, zarr_python_hierarchy


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _n5_block(dims: list[int]) -> bytes:
    n = int(np.prod(dims))
    header = (
        b"\x00\x00" + len(dims).to_bytes(2, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    )
    return header + gzip.compress(np.arange(n, dtype=">u2").tobytes(), mtime=0)


def n5_fixture(tmp: Path) -> tuple[dict[str, bytes], set[str]]:
    tensorstore_n5(tmp / "vol", ramp((10, 7)), [4, 4])
    files = _files(tmp)
    files["attributes.json"] = json.dumps({"n5": "4.0.0"}).encode()
    spoiled = {
        "vol/01/0": _n5_block([4, 4]),  # a leading zero: N5 Java never reads it
        "vol/-1/0": _n5_block([4, 4]),  # a sign
        "vol/5/5/5": _n5_block([4, 4]),  # three indices for two dimensions
        "vol/3/0": _n5_block([4, 4]),  # outside the 3x2 grid
        "vol/0/1": b"\x00\x00\x00\x02garbage",  # a broken block
        "vol/0/attributes.json": b"{}",  # metadata inside a chunk folder
        # blosc without the members n5-blosc readers (TensorStore, z5) need
        "bad/attributes.json": json.dumps(
            {
                "dimensions": [4],
                "blockSize": [2],
                "dataType": "uint8",
                "compression": {"type": "blosc"},
            }
        ).encode(),
    }
    harmless = {"vol/README.md": b"notes", "vol/0/0.partial": b"x", "vol/.0.XyZ123": b"x"}
    return {**files, **spoiled, **harmless}, set(spoiled)


def zarr2_fixture(tmp: Path) -> tuple[dict[str, bytes], set[str]]:
    zarr_python_hierarchy(tmp / "h", 2)
    zarr.consolidate_metadata(str(tmp / "h"))
    files = {f"h/{k}": v for k, v in _files(tmp / "h").items()}
    chunk = files["h/raw/0.0"]
    spoiled = {
        "h/raw/0.0.0": chunk,  # three indices for a 2-D array
        "h/raw/0/0": chunk,  # the other separator
        "h/raw/01.0": chunk,  # a leading zero
        "h/raw/9.9": chunk,  # outside the grid
        "h/raw/1.1": b"not a chunk",  # does not decode
        "h/broken/.zarray": b"{not json",  # an array whose metadata does not parse
        "h/v3/.zarray": json.dumps({"zarr_format": 3}).encode(),  # not a v2 document
        "h/g/.zgroup": b"[]",  # not an object
    }
    harmless = {
        "h/raw/attributes.json": b'{"any": "thing"}',  # not N5 metadata outside an N5 tree
        "h/raw/0.0.6f1b.partial": chunk,  # zarr-python's temp name
        "h/broken/README": b"x",
    }
    return {**files, **spoiled, **harmless}, set(spoiled)


def zarr3_fixture(tmp: Path) -> tuple[dict[str, bytes], set[str]]:
    zarr_python_hierarchy(tmp / "h", 3)
    zarr.consolidate_metadata(str(tmp / "h"))
    tensorstore_zarr3(tmp / "h" / "sharded", ramp((12, 10)), [2, 5], shard=[4, 10])
    files = {f"h/{k}": v for k, v in _files(tmp / "h").items()}
    chunk = files["h/raw/c/0/0"]
    spoiled = {
        "h/raw/c/5/5/5": chunk,  # three indices
        "h/raw/c.0.0": chunk,  # the other separator
        "h/raw/0/0": chunk,  # no "c" prefix
        "h/raw/c/9/9": chunk,  # outside the grid
        "h/raw/c/1/1": b"\x00" * 3,  # does not decode
        "h/sharded/c/0/0": b"\x01" * 40,  # a shard whose index is garbage
        "h/raw/zarr.json.bak/zarr.json": b"{}",  # metadata inside an array folder
        "h/__meta/zarr.json": json.dumps(  # a node name the v3 spec reserves
            {"zarr_format": 3, "node_type": "group", "attributes": {}}
        ).encode(),
    }
    harmless = {"h/raw/c/0/0.__lock": b"", "h/README.md": b"notes"}
    return {**files, **spoiled, **harmless}, set(spoiled)


pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")

FIXTURES = {"n5": n5_fixture, "zarr2": zarr2_fixture, "zarr3": zarr3_fixture}


def _metadata_first(keys: list[str]) -> list[str]:
    def order(key: str) -> tuple[int, int, str]:
        is_meta = key.rpartition("/")[2] in METADATA_NAMES
        return (0 if is_meta else 1, key.count("/"), key)

    return sorted(keys, key=order)


def _broken_folders(invalid: dict[str, str]) -> list[str]:
    """Folders whose own metadata validate found broken (their keys are judged as a whole)."""
    return [
        key.rpartition("/")[0] + "/"
        for key, rule in invalid.items()
        if key.rpartition("/")[2] in METADATA_NAMES and rule != "metadata-in-chunks"
    ]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_validate_and_mount_agree_on_every_key(name: str, tmp_path: Path) -> None:
    files, spoiled = FIXTURES[name](tmp_path)
    seeded = MemoryStore()
    for key, data in files.items():
        seeded.set(key, data)
    report = validate_store(seeded)
    invalid = {f.key: f.rule for f in report.invalid if f.rule != "stale-consolidated"}

    refused: dict[str, str] = {}
    gw = Gateway(MemoryStore())
    for key in _metadata_first(list(files)):
        try:
            gw.write_file("/" + key, files[key])
        except Rejected as exc:
            refused[key] = exc.rule

    broken = _broken_folders(invalid)
    judged = [
        k
        for k in files
        if not any(k.startswith(b) and k[len(b) :] not in METADATA_NAMES for b in broken)
    ]
    disagree = {
        key: (invalid.get(key), refused.get(key))
        for key in judged
        if (key in invalid) != (key in refused)
    }
    assert disagree == {}, "validate vs mount (rule or None) per key"
    # Both caught every planted key, and for the same reason.
    assert spoiled <= invalid.keys()
    for key in spoiled & refused.keys():
        assert invalid[key] == refused[key], key


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_consolidated_hierarchy_copies_byte_for_byte(zarr_format: int, tmp_path: Path) -> None:
    """After ``cp -r`` of a consolidated zarr-python hierarchy (any order), every file,
    the consolidated document included, holds the bytes it was copied with."""
    zarr_python_hierarchy(tmp_path / "h", zarr_format)
    zarr.consolidate_metadata(str(tmp_path / "h"))
    files = _files(tmp_path / "h")
    gw = Gateway(MemoryStore())
    for key in sorted(files, key=lambda k: (k.count("/"), k)):  # the root document first
        gw.write_file("/" + key, files[key])
    assert {k: gw.read_file("/" + k) for k in files} == files
    assert validate_store(gw.store).ok


def test_validate_reports_stale_consolidated_metadata(tmp_path: Path) -> None:
    zarr_python_hierarchy(tmp_path / "h", 2)
    zarr.consolidate_metadata(str(tmp_path / "h"))
    late = zarr.open_group(str(tmp_path / "h"), mode="a", zarr_format=2, use_consolidated=False)
    late.create_array("late", shape=(4,), chunks=(2,), dtype="u1")
    seeded = MemoryStore()
    for key, data in _files(tmp_path / "h").items():
        seeded.set(key, data)
    report = validate_store(seeded)
    stale = [f for f in report.invalid if f.rule == "stale-consolidated"]
    assert [f.key for f in stale] == [".zmetadata"]
    assert "'late/.zarray' is missing" in stale[0].message
    # The mount keeps it true: committing the late array through a gateway updates it.
    gw = Gateway(seeded)
    for name in (".zarray", ".zattrs"):
        gw.write_file(f"/late/{name}", seeded.get(f"late/{name}") or b"")
    assert validate_store(seeded).ok
