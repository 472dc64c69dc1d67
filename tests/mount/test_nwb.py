"""A real NWB file, written by pynwb and hdmf-zarr 0.13 (its last Zarr v2 release), is valid
and copies file by file into a gateway; the pickled references it holds are accepted inside
its hdmf-zarr hierarchy only, and a pickle naming any other global is still refused there.

The writer runs in a venv of its own (tests/nwb_env.py): hdmf-zarr 0.13 needs zarr<3.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

from n5fs.codecs.limits import CodecError
from n5fs.codecs.pickle_check import SAFE_PICKLE_GLOBALS, check_pickle
from n5fs.errors import Rejected
from n5fs.formats.zarr2 import REFERENCE_PICKLE_GLOBALS
from n5fs.gateway import Gateway
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.validate import validate_store
from tests.mounting import NEEDS_FUSE, Mounter
from tests.nwb_env import NwbEnvError, run_in_nwb_env

pytestmark = pytest.mark.slow

STORE = "session.nwb.zarr"
#: the electrodes table's ``group`` column: one pickled ZarrReference per electrode
REFS = "general/extracellular_ephys/electrodes/group"
#: the electrode group's ``device`` link (a ``zarr_link`` entry)
LINKED = "general/extracellular_ephys/shank0"

WRITER = r"""
import datetime
import pickle
import sys
from pathlib import Path

import numpy as np
from hdmf_zarr.nwb import NWBZarrIO
from hdmf_zarr.utils import ZarrReference
from pynwb import NWBFile
from pynwb.ecephys import ElectricalSeries

out = Path(sys.argv[1])
start = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
nwb = NWBFile(session_description="n5fs test", identifier="n5fs-nwb", session_start_time=start)
device = nwb.create_device(name="probe")
group = nwb.create_electrode_group(
    name="shank0", description="four sites", location="CA1", device=device
)
for i in range(4):
    nwb.add_electrode(group=group, location="CA1", x=float(i), y=0.0, z=0.0, imp=1.0,
                      filtering="none")
region = nwb.create_electrode_table_region(region=[0, 2], description="two sites")
data = np.arange(40, dtype="int16").reshape(20, 2)
nwb.add_acquisition(ElectricalSeries(name="es", data=data, electrodes=region, rate=1000.0))
with NWBZarrIO(str(out / "session.nwb.zarr"), mode="w") as io:
    io.write(nwb)

# the reference class as every pickle protocol writes it (numcodecs Pickle(protocol=p))
ref = ZarrReference(source=".", path="/general/devices/probe", object_id="a", source_object_id="b")
values = np.empty(2, dtype=object)
values[0], values[1] = ref, ref
for protocol in range(6):
    (out / f"refs-{protocol}.pickle").write_bytes(pickle.dumps(values, protocol=protocol))
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nwb")
    try:
        run_in_nwb_env(WRITER, str(out), workdir=out)
    except NwbEnvError as exc:  # fail, with pip's or the writer's output: never skip
        pytest.fail(str(exc), pytrace=False)
    return out


@pytest.fixture(scope="module")
def store(written: Path) -> Path:
    return written / STORE


def _files(root: Path) -> list[str]:
    """Every file, top-down, each folder's files before its subfolders (metadata, whose names
    start with ``.``, before chunks), as ``cp -r`` meets them in a sorted listing."""
    out: list[str] = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        out += [(Path(folder) / n).relative_to(root).as_posix() for n in sorted(names)]
    return out


def _decompressed(folder: Path, name: str) -> bytes:
    zarray = json.loads((folder / ".zarray").read_text())
    data = (folder / name).read_bytes()
    return bytes(numcodecs.get_codec(zarray["compressor"]).decode(data))


def _globals(data: bytes) -> set[str]:
    """The globals a pickle names, for protocols 0-5 (STACK_GLOBAL from its two strings)."""
    found: set[str] = set()
    strings: list[str] = []
    memo: dict[int, str] = {}
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            found.add(str(arg).replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            found.add(".".join(strings[-2:]))
        elif op.name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif op.name in ("BINGET", "LONG_BINGET", "GET") and int(arg) in memo:
            strings.append(memo[int(arg)])
        elif isinstance(arg, str):
            strings.append(arg)
    return found


@pytest.fixture(scope="module")
def gateway(store: Path) -> Iterator[Gateway]:
    """The NWB file copied file by file into a gateway over a memory store."""
    with Gateway(MemoryStore()) as gw:
        for rel in _files(store):
            gw.write_file(f"/{rel}", (store / rel).read_bytes())
        yield gw


# -- the real writer's store -------------------------------------------------------------------


def test_the_writer_stores_pickled_references_and_links(store: Path) -> None:
    zarray = json.loads((store / REFS / ".zarray").read_text())
    assert (zarray["dtype"], zarray["filters"][0]["id"]) == ("|O", "pickle")
    assert b"hdmf_zarr.utils" in _decompressed(store / REFS, "0")
    assert b"ZarrReference" in _decompressed(store / REFS, "0")
    links = json.loads((store / LINKED / ".zattrs").read_text())["zarr_link"]
    assert links == [{"name": "device", "path": "/general/devices/probe", "source": "."}]


@pytest.mark.parametrize("protocol", range(6))
def test_real_reference_pickles_name_only_allowed_globals(written: Path, protocol: int) -> None:
    """The allow-list hdmf-zarr arrays get, derived from the real class at every protocol."""
    data = (written / f"refs-{protocol}.pickle").read_bytes()
    assert "hdmf_zarr.utils.ZarrReference" in _globals(data)
    assert _globals(data) <= SAFE_PICKLE_GLOBALS | REFERENCE_PICKLE_GLOBALS
    check_pickle(data, protocol=protocol, allowed=SAFE_PICKLE_GLOBALS | REFERENCE_PICKLE_GLOBALS)
    with pytest.raises(CodecError, match=re.escape("hdmf_zarr.utils.ZarrReference")) as info:
        check_pickle(data, protocol=protocol)
    assert info.value.rule == "pickle-global"


def test_validate_accepts_the_nwb_file(store: Path) -> None:
    report = validate_store(FileStore(store))
    assert report.invalid == []
    assert report.ok
    chunks = [rel for rel in _files(store) if not Path(rel).name.startswith(".")]
    assert report.chunks == len(chunks)
    assert f"{REFS}/0" in chunks


# -- copied into a gateway ---------------------------------------------------------------------


def test_every_file_copies_into_a_gateway(store: Path, gateway: Gateway) -> None:
    files = _files(store)
    assert set(gateway.walk_keys()) == set(files)
    for rel in files:
        if not rel.endswith(".zmetadata"):  # the gateway keeps consolidated metadata current
            assert gateway.read_file(f"/{rel}") == (store / rel).read_bytes(), rel
    assert gateway.read_file(f"/{REFS}/0") == (store / REFS / "0").read_bytes()
    assert gateway.readlink(f"/{LINKED}/device") == "../../devices/probe"


class _Command:
    """Unpickling this would run a command: pickle.dumps only records its name."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def test_a_foreign_global_is_refused_in_the_same_store(store: Path, gateway: Gateway) -> None:
    zarray = json.loads((store / REFS / ".zarray").read_text())
    values = np.array([_Command(), None, None, None], dtype=object)
    pickled = pickle.dumps(values, protocol=zarray["filters"][0]["protocol"])
    chunk = bytes(numcodecs.get_codec(zarray["compressor"]).encode(pickled))
    with pytest.raises(Rejected) as info:
        gateway.write_file(f"/{REFS}/0", chunk)
    assert (info.value.rule, info.value.fmt) == ("pickle-global", "hdmf-zarr")
    assert "system" in str(info.value)
    assert gateway.read_file(f"/{REFS}/0") == (store / REFS / "0").read_bytes()


def test_the_reference_pickle_is_accepted_in_any_v2_object_array(store: Path) -> None:
    """``cp -r`` may copy a reference chunk before any hdmf-zarr mark of its hierarchy, so the
    reference class is allowed in every Zarr v2 object array; any other global still is not."""
    with Gateway(MemoryStore()) as gw:
        gw.write_file("/plain/.zgroup", b'{"zarr_format": 2}')
        gw.write_file("/plain/group/.zarray", (store / REFS / ".zarray").read_bytes())
        gw.write_file("/plain/group/0", (store / REFS / "0").read_bytes())
        assert gw.read_file("/plain/group/0") == (store / REFS / "0").read_bytes()


@pytest.mark.fuse
@pytest.mark.timeout(300)
@NEEDS_FUSE
def test_cp_r_into_a_real_mount(store: Path, mounter: Mounter, tmp_path: Path) -> None:
    """``cp -r`` of the NWB file into a mounted directory store: every file lands (the
    pickled references included), reads back equal, and the backing store validates clean."""
    backing = tmp_path / "backing"
    backing.mkdir()
    mp = mounter.foreground(str(backing))
    done = subprocess.run(["cp", "-r", str(store), str(mp / STORE)], check=False, timeout=120)
    rejections = (mp / ".n5fs" / "rejections").read_text()
    assert (done.returncode, rejections) == (0, "")
    copied = mp / STORE
    assert {f: (copied / f).read_bytes() for f in _files(store)} == {
        f: (store / f).read_bytes() for f in _files(store)
    }
    mounter.cli("unmount", str(mp))
    report = validate_store(FileStore(backing))
    assert report.ok, report.invalid
    assert report.chunks > 0
