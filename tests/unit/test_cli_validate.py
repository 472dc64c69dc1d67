"""`n5fs detect` and `n5fs validate` as a user runs them: exit codes, JSON, progress."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zarr

from n5fs.cli import commands
from n5fs.cli.commands import EXIT_INVALID, EXIT_UNREADABLE
from n5fs.cli.main import main
from n5fs.detect import OpenedSource
from n5fs.testing.doubles import FaultyStore
from tests.writers import ramp, tensorstore_n5, zarr_python_hierarchy


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("good")
    tensorstore_n5(root / "n5", ramp((20, 20, 9)), [8, 8, 4])
    zarr_python_hierarchy(root / "v2", 2)
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_detect_json_fields(good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["detect", "--json", str(good / "v2")], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["container"] is None
    assert doc["source"] == {"driver": "file", "path": str(good / "v2")}
    nodes = {n["path"]: n for n in doc["nodes"]}
    assert nodes[""]["kind"] == "group"
    raw = nodes["raw"]
    assert (raw["format"], raw["kind"], raw["dtype"]) == ("zarr2", "array", "uint16")
    assert (raw["shape"], raw["chunks"]) == ([20, 30], [8, 8])
    assert raw["spec"]["driver"] == "zarr"
    assert raw["spec"]["kvstore"]["path"] == str(good / "v2") + "/raw/"
    assert nodes["labels/seg"]["dtype"] == "int32"


def test_detect_spec_opens_the_array_in_tensorstore(good: Path, capsys) -> None:
    import tensorstore as ts

    code, out, _ = run(["detect", "--json", str(good)], capsys)
    assert code == 0
    n5 = next(n for n in json.loads(out)["nodes"] if n["path"] == "n5")
    arr = ts.open(n5["spec"]).result()
    np.testing.assert_array_equal(arr.read().result(), ramp((20, 20, 9)))


def test_detect_human_output(good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["detect", str(good / "n5")], capsys)
    assert code == 0
    assert "n5" in out
    assert "uint16" in out
    assert "20x20x9" in out


def test_detect_nothing_found_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "README").write_text("x")
    code, _, err = run(["detect", str(tmp_path)], capsys)
    assert code == 2
    assert "no N5, Zarr v2, Zarr v3 or hdmf-zarr metadata" in err


def test_validate_passes_untouched_store(good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["validate", "--json", str(good)], capsys)
    doc = json.loads(out)
    assert code == 0, doc
    assert doc["invalid"] == []
    assert doc["unreadable"] == []
    assert doc["checked"]["chunks"] > 20
    assert doc["checked"]["metadata"] >= 5
    code, out, _ = run(["validate", str(good)], capsys)
    assert code == 0
    assert out.endswith("; 0 could not be checked\n")
    assert ": valid; checked " in out
    assert "UNREADABLE" not in out


def faulty_source(
    monkeypatch: pytest.MonkeyPatch, *keys: str, ops: tuple[str, ...] = ("get_many", "get")
) -> None:
    """Every store the CLI opens fails reads (``ops``) of ``keys`` as an S3 GET that kept
    failing after its retries does."""
    real = commands.open_cli_source

    def opened(text: str, *, read_only: bool = False) -> OpenedSource:
        source = real(text, read_only=read_only)
        store = FaultyStore(source.store)  # no local files: every read meets the faults
        for op in ops:
            store.fail(op, times=None, when=lambda key: key in keys)
        return dataclasses.replace(source, store=store)

    monkeypatch.setattr(commands, "open_cli_source", opened)


def test_validate_a_chunk_the_store_cannot_read_is_unreadable_not_valid(
    good: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["validate", "--json", str(good)], capsys)
    assert code == 0
    clean = json.loads(out)["checked"]
    faulty_source(monkeypatch, "v2/raw/0.0")
    code, out, _ = run(["validate", "--json", "--jobs", "2", str(good)], capsys)
    assert code == EXIT_UNREADABLE == 3
    doc = json.loads(out)
    assert doc["invalid"] == []
    assert doc["unreadable"] == [
        {
            "key": "v2/raw/0.0",
            "rule": "StoreUnavailable",
            "message": "injected fault: get 'v2/raw/0.0'",
        }
    ]
    assert doc["checked"] == {**clean, "chunks": clean["chunks"] - 1}  # not counted checked

    code, out, _ = run(["validate", str(good)], capsys)
    assert code == 3
    assert "UNREADABLE v2/raw/0.0: injected fault: get 'v2/raw/0.0' [StoreUnavailable]\n" in out
    assert out.endswith("; 1 could not be checked\n")
    assert ": not fully checked; " in out
    assert "valid" not in out  # neither "valid" nor "invalid"


def test_validate_a_metadata_file_the_store_cannot_read_is_unreadable(
    good: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Detection read it (``get_many``); the check's own read (``get``) fails."""
    code, out, _ = run(["validate", "--json", str(good)], capsys)
    clean = json.loads(out)["checked"]
    faulty_source(monkeypatch, "v2/.zgroup", ops=("get",))
    code, out, _ = run(["validate", "--json", str(good)], capsys)
    assert code == 3
    doc = json.loads(out)
    assert [(f["key"], f["rule"]) for f in doc["unreadable"]] == [
        ("v2/.zgroup", "StoreUnavailable")
    ]
    assert doc["checked"] == {**clean, "metadata": clean["metadata"] - 1}


def test_validate_invalid_and_unreadable_exits_with_the_invalid_code(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    (bad / "v2" / "raw" / "0.1").write_bytes(b"not zstd or blosc")
    faulty_source(monkeypatch, "v2/raw/0.0")
    code, out, _ = run(["validate", "--json", str(bad)], capsys)
    assert code == EXIT_INVALID == 1
    doc = json.loads(out)
    assert [f["key"] for f in doc["invalid"]] == ["v2/raw/0.1"]
    assert [f["key"] for f in doc["unreadable"]] == ["v2/raw/0.0"]
    code, out, _ = run(["validate", str(bad)], capsys)
    assert code == 1
    assert "INVALID v2/raw/0.1: " in out
    assert "UNREADABLE v2/raw/0.0: " in out
    assert ": 1 invalid; " in out
    assert out.endswith("; 1 could not be checked\n")


def deflated_zip_of(folder: Path, archive: Path) -> None:
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out.write(path, path.relative_to(folder).as_posix())


def declare_smaller(archive: Path, name: str) -> None:
    """Make the central directory declare ``name`` one byte shorter than it inflates to."""
    data = bytearray(archive.read_bytes())
    entry = struct.Struct("<4s6H3L5H2L")  # a central directory entry (APPNOTE 4.3.12)
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        fields = entry.unpack_from(data, at)
        if data[at + entry.size : at + entry.size + fields[10]] == name.encode():
            struct.pack_into("<L", data, at + 24, fields[9] - 1)  # uncompressed size
            archive.write_bytes(data)
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{name} not in {archive}")


def test_validate_a_zip_member_inflating_past_its_declared_size_is_unreadable(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "v2.zip"
    deflated_zip_of(good / "v2", archive)
    source = f"file://{archive}|zip:"
    code, out, _ = run(["validate", "--json", source], capsys)
    assert (code, json.loads(out)["unreadable"]) == (0, [])
    declare_smaller(archive, "raw/0.0")
    code, out, _ = run(["validate", "--json", source], capsys)
    assert code == 3
    doc = json.loads(out)
    assert doc["invalid"] == []
    [found] = doc["unreadable"]
    assert (found["key"], found["rule"]) == ("raw/0.0", "StoreCorrupt")
    assert "member 'raw/0.0' inflates past its declared size" in found["message"]
    code, out, _ = run(["validate", source], capsys)
    assert code == 3
    assert "UNREADABLE raw/0.0: " in out
    assert "1 could not be checked" in out


def test_validate_help_states_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["validate", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 when every metadata file and chunk was read and is valid" in text
    assert "3 when nothing read is invalid but some files could not be read" in text
    assert "When some files are invalid and others unreadable, the status is 1." in text


def _plant(root: Path) -> dict[str, str]:
    """Plant one defect of each kind; return key -> expected rule fragment."""
    (root / "n5" / "0" / "0" / "0").write_bytes(b"\x00\x00\x00\x03garbage")  # bad header
    (root / "n5" / "9" / "0" / "0").parent.mkdir(parents=True, exist_ok=True)
    (root / "n5" / "9" / "0" / "0").write_bytes(b"\x00")  # out of grid
    (root / "v2" / "raw" / "0.0").write_bytes(b"not zstd or blosc")  # undecodable
    (root / "v2" / "labels" / ".zgroup").write_text('{"zarr_format": 2, "extra": 1}')
    (root / "v2" / "README.md").write_text("not judged")
    return {"n5/0/0/0": "", "n5/9/0/0": "out-of-grid", "v2/raw/0.0": "", "v2/labels/.zgroup": ""}


def test_validate_finds_each_planted_defect(good: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    expected = _plant(bad)
    code, out, _ = run(["validate", "--json", "--jobs", "2", str(bad)], capsys)
    assert code == 1
    doc = json.loads(out)
    invalid = {f["key"]: f["rule"] for f in doc["invalid"]}
    assert set(expected) <= set(invalid), invalid
    for key, rule in expected.items():
        assert rule in invalid[key]
    assert doc["checked"]["other"] >= 1


def test_validate_reports_an_unknown_hdmf_zarr_dtype(tmp_path: Path, capsys) -> None:
    """An hdmf-zarr dataset whose ``zarr_dtype`` is outside hdmf-zarr's types is invalid, and
    the finding names the value; the same store with a real type name is valid."""
    root = tmp_path / "file.nwb.zarr"
    top = zarr.open_group(str(root), mode="w", zarr_format=2)
    top.attrs.update({"namespace": "core", "neurodata_type": "NWBFile"})
    data = top.create_array("acquisition/data", shape=(6,), chunks=(4,), dtype="<f4")
    data[:] = np.arange(6, dtype="<f4")
    data.attrs["zarr_dtype"] = "float32"
    code, out, _ = run(["validate", "--json", str(root)], capsys)
    assert code == 0, out
    data.attrs["zarr_dtype"] = "bogus"
    code, out, _ = run(["validate", "--json", str(root)], capsys)
    assert code == 1
    invalid = {f["key"]: f for f in json.loads(out)["invalid"]}
    assert set(invalid) == {"acquisition/data/.zattrs"}, invalid
    finding = invalid["acquisition/data/.zattrs"]
    assert "zarr-dtype" in finding["rule"]
    assert "'bogus'" in finding["message"]
    assert "'float32'" in finding["message"]


def test_validate_stdout_is_only_json_through_a_pipe(good: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "n5fs", "validate", "--json", str(good)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "\r" not in proc.stderr  # no progress bar on a pipe


def test_validate_shows_progress_on_a_terminal(good: Path) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # child: stderr and stdout are the pty
        os.execv(sys.executable, [sys.executable, "-m", "n5fs", "validate", str(good)])
    chunks = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks += data
    _, status = os.waitpid(pid, 0)
    text = chunks.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "chunks" in text
    assert "/" in text.split("\n")[0] or "[" in text
    assert "valid" in text


def test_demo_store_is_detected_and_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["detect", "--json", "demo:"], capsys)
    assert code == 0
    arrays = {n["path"]: n for n in json.loads(out)["nodes"] if n["kind"] == "array"}
    assert {p: a["format"] for p, a in arrays.items()} == {
        "n5/raw": "n5",
        "zarr2/raw": "zarr2",
        "zarr3/raw": "zarr3",
    }
    code, out, _ = run(["validate", "--json", "demo:"], capsys)
    doc = json.loads(out)
    assert code == 0, doc
    assert doc["checked"]["chunks"] == 16


def test_demo_arrays_decode_to_their_ramp() -> None:
    from n5fs.cli.demo import demo_store
    from n5fs.detect import Detector

    store = demo_store()
    array = Detector(store).folder("zarr2/raw/").array
    assert array is not None
    values = array.decode_chunk((1, 2), store.get("zarr2/raw/1.2") or b"")
    expected = (np.arange(30 * 40) % 199).astype("uint16").reshape(30, 40)[16:30, 32:40]
    np.testing.assert_array_equal(values[:14, :8], expected)


@pytest.mark.s3
def test_s3_flags_reach_the_store(good: Path, s3_server, s3_bucket: str, capsys) -> None:
    client = s3_server.client()
    for path in sorted((good / "v2").rglob("*")):
        if path.is_file():
            client.upload_file(
                str(path), s3_bucket, "v2/" + path.relative_to(good / "v2").as_posix()
            )
    code, out, err = run(
        ["detect", "--json", "--endpoint", s3_server.endpoint, f"s3://{s3_bucket}/v2/"], capsys
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["endpoint"] == s3_server.endpoint
    assert {n["path"] for n in doc["nodes"]} >= {"", "raw", "labels/seg"}
    code, _, err = run(
        ["validate", "--endpoint", s3_server.endpoint, f"s3://{s3_bucket}/v2/"], capsys
    )
    assert code == 0, err


def test_s3_flags_on_a_local_source_say_why(good: Path, capsys) -> None:
    code, _, err = run(["detect", "--anon", str(good / "v2")], capsys)
    assert code == 2
    assert "not on S3" in err
