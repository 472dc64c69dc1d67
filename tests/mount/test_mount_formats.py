"""Real writers and real tools through a real mount, on every store kind: what they write
reads back equal, and the store stays valid (the promise n5fs makes to every writer)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr

from n5fs.kvstore import open_store
from n5fs.validate import validate_store
from tests.mounting import Mounter, real_mount
from tests.writers import ramp, tensorstore_n5, zarr_python_hierarchy

pytestmark = real_mount(300)

KINDS = ["memory", "file", pytest.param("s3", marks=pytest.mark.s3), "zip"]


class Mounted:
    """A mount of one store kind, plus a way to look at the backing store afterwards."""

    def __init__(self, mounter: Mounter, kind: str, tmp: Path, request: pytest.FixtureRequest):
        self.kind = kind
        if kind == "memory":
            self.source = "memory://"
        elif kind == "file":
            (tmp / "backing").mkdir()
            self.source = str(tmp / "backing")
        elif kind == "zip":
            self.source = f"file://{tmp}/backing.zip|zip:"
        else:
            server = request.getfixturevalue("s3_server")
            bucket = request.getfixturevalue("s3_bucket")
            self.source = json.dumps(
                {"driver": "s3", "bucket": bucket, "path": "data/", "endpoint": server.endpoint}
            )
        self.mounter = mounter
        self.path = mounter.foreground(self.source)

    def backing_store(self):
        """The store as it is after the mount wrote it (zip: after unmount flushed it)."""
        return None if self.kind == "memory" else open_store(self.source)

    def unmount(self) -> None:
        self.mounter.cli("unmount", str(self.path))


@pytest.fixture(params=KINDS)
def mounted(request: pytest.FixtureRequest, mounter: Mounter, tmp_path: Path) -> Mounted:
    return Mounted(mounter, request.param, tmp_path, request)


def assert_store_valid(m: Mounted) -> None:
    """After unmount, `n5fs validate` finds nothing invalid in what the mount stored."""
    m.unmount()
    store = m.backing_store()
    if store is None:
        return
    report = validate_store(store)
    assert report.invalid == [], report.invalid
    assert report.chunks > 0


# -- real writers -------------------------------------------------------------------------------


def test_tensorstore_writes_n5_zarr_and_sharded_zarr3(mounted: Mounted) -> None:
    root = mounted.path
    values = ramp((33, 20, 7), "uint16")
    tensorstore_n5(root / "n5", values, [16, 16, 4], {"type": "gzip"})
    for driver, path in (("zarr", "v2"), ("zarr3", "v3")):
        spec = {
            "driver": driver,
            "kvstore": {"driver": "file", "path": str(root / path)},
            "metadata": {
                "shape": list(values.shape),
                "data_type" if driver == "zarr3" else "dtype": "uint16"
                if driver == "zarr3"
                else "<u2",
            },
        }
        if driver == "zarr3":
            spec["metadata"]["codecs"] = [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [8, 8, 4],
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "gzip", "configuration": {"level": 4}},
                        ],
                    },
                }
            ]
            spec["metadata"]["chunk_grid"] = {
                "name": "regular",
                "configuration": {"chunk_shape": [16, 16, 4]},
            }
        else:
            spec["metadata"]["chunks"] = [16, 16, 4]
        arr = ts.open(spec, create=True).result()
        arr.write(values).result()
    for driver, path in (("n5", "n5"), ("zarr", "v2"), ("zarr3", "v3")):
        back = ts.open(
            {"driver": driver, "kvstore": {"driver": "file", "path": str(root / path)}}
        ).result()
        np.testing.assert_array_equal(back.read().result(), values)
    assert_store_valid(mounted)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_python_writes_a_hierarchy(mounted: Mounted, zarr_format: int) -> None:
    written = zarr_python_hierarchy(mounted.path / "h", zarr_format)
    group = zarr.open_group(str(mounted.path / "h"), mode="r")
    for path, values in written.items():
        np.testing.assert_array_equal(group[path][...], values)
    assert_store_valid(mounted)


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_zmetadata_stays_true_after_zarr_python_adds_an_array(mounted: Mounted) -> None:
    root = mounted.path / "c"
    zarr_python_hierarchy(root, 2)
    zarr.consolidate_metadata(str(root))
    group = zarr.open_group(str(root), mode="a", zarr_format=2)
    added = group.create_array("late", shape=(6,), chunks=(3,), dtype="int16")
    added[...] = np.arange(6, dtype="int16")
    consolidated = zarr.open_consolidated(str(root), zarr_format=2)
    np.testing.assert_array_equal(consolidated["late"][...], np.arange(6, dtype="int16"))


# -- real tools ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src")
    tensorstore_n5(root / "n5", ramp((40, 30, 9)), [16, 16, 4])
    zarr_python_hierarchy(root / "v2", 2)
    zarr_python_hierarchy(root / "v3", 3)
    (root / "README.txt").write_text("a dataset\n")
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("tool", ["cp", "rsync", "tar"])
def test_tools_copy_datasets_in(mounted: Mounted, dataset: Path, tool: str, tmp_path: Path) -> None:
    dest = mounted.path / "in"
    if tool == "cp":
        subprocess.run(["cp", "-r", str(dataset), str(dest)], check=True, timeout=120)
    elif tool == "rsync":
        subprocess.run(["rsync", "-a", f"{dataset}/", f"{dest}/"], check=True, timeout=120)
    else:
        archive = tmp_path / "d.tar"
        with tarfile.open(archive, "w") as tf:
            tf.add(dataset, arcname="in")
        subprocess.run(
            ["tar", "-xf", str(archive), "-C", str(mounted.path)], check=True, timeout=120
        )
    assert tree(dest) == tree(dataset)
    assert_store_valid(mounted)


def test_invalid_writes_fail_at_close_and_leave_the_store(mounted: Mounted, dataset: Path) -> None:
    root = mounted.path
    shutil.copytree(dataset / "n5", root / "n5")
    chunk = root / "n5" / "0" / "0" / "0"
    good = chunk.read_bytes()
    fd = os.open(chunk, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"\x00\x00\x00\x03not a block")
    with pytest.raises(OSError) as info:
        os.close(fd)
    assert info.value.errno == errno.EINVAL
    assert chunk.read_bytes() == good
    (root / "n5" / "0" / "0" / ".1.tmp").write_bytes(b"junk")
    with pytest.raises(OSError) as info:
        os.rename(root / "n5" / "0" / "0" / ".1.tmp", root / "n5" / "0" / "0" / "1")
    assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError) as info:
        os.truncate(chunk, 10)
    assert info.value.errno == errno.EINVAL
    assert chunk.read_bytes() == good
    rejections = (root / ".n5fs" / "rejections").read_text().splitlines()
    rules = [json.loads(line)["rule"] for line in rejections]
    assert len(rules) == 3
    assert all(rule for rule in rules)


def test_hdmf_links_read_as_symlinks(mounted: Mounted) -> None:
    root = mounted.path / "nwb"
    root.mkdir()
    (root / ".zgroup").write_text('{"zarr_format": 2}')
    (root / ".zattrs").write_text('{"namespace": "core", "neurodata_type": "NWBFile"}')
    (root / "acq").mkdir()
    (root / "acq" / ".zgroup").write_text('{"zarr_format": 2}')
    (root / "proc").mkdir()
    (root / "proc" / ".zgroup").write_text('{"zarr_format": 2}')
    (root / "proc" / ".zattrs").write_text(
        json.dumps({"zarr_link": [{"name": "raw", "source": ".", "path": "/nwb/acq"}]})
    )
    link = root / "proc" / "raw"
    assert link.is_symlink()
    assert os.readlink(link) == "../acq"
    assert (link / ".zgroup").read_text() == '{"zarr_format": 2}'
    os.symlink("../acq", root / "proc" / "again")
    attrs = json.loads((root / "proc" / ".zattrs").read_text())
    assert [e["name"] for e in attrs["zarr_link"]] == ["raw", "again"]
    found = subprocess.run(
        ["find", "-L", str(root), "-name", ".zgroup"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert str(link / ".zgroup") in found


def test_validate_runs_on_the_mount_itself(mounted: Mounted, dataset: Path) -> None:
    shutil.copytree(dataset / "v3", mounted.path / "v3")
    proc = subprocess.run(
        [sys.executable, "-m", "n5fs", "validate", "--json", str(mounted.path / "v3")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checked"]["chunks"] > 0
