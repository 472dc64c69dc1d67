"""A user's first minutes with n5fs: relative paths, sources that are not there,
mount points that are not right, what a mount says once it works, ``status`` as a table, a
closed pipe, the options other FUSE tools taught them, and what libfuse must not print.

Mounts are real and run in child processes (tests/mounting.py); the rest runs in-process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from argparse import Namespace
from pathlib import Path

import pytest

from n5fs.cli.commands import absolute_source, missing_local_path
from n5fs.cli.main import EXIT_BROKEN_PIPE, build_parser, main
from n5fs.cli.plan import make_plan
from n5fs.cli.status import counters_line, human_bytes, render_table
from n5fs.errors import InvalidSource
from n5fs.fuse_front.mounts import MountFailed, mount_entry
from n5fs.fuse_front.options import fuse_options, loop_options, parse_options
from n5fs.kvstore.spec import parse_spec
from tests.mounting import CLI, real_mount
from tests.writers import ramp, tensorstore_n5

fuse = real_mount(120)


def fuse_test(func):
    for mark in reversed(fuse):
        func = mark(func)
    return func


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def plan_args(*argv: str) -> Namespace:
    return build_parser().parse_args(["mount", *argv])


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``n5fs COMMAND --help``, with argparse's line breaks undone."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A plain folder with one file, as the source of a mount."""
    root = tmp_path / "store"
    (root / "plain").mkdir(parents=True)
    (root / "plain" / "hello.txt").write_bytes(b"hello\n")
    return root


def make_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("plain/hello.txt", b"hello from the zip\n")
    return path


# == 1. every local path is absolute before the daemon chdirs to / ================================


def test_relative_sources_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = str(tmp_path)
    assert absolute_source("volume") == f"{here}/volume"
    assert absolute_source("data/volume/") == f"{here}/data/volume/"
    assert absolute_source("./vol.zip|zip:inner/") == f"{here}/vol.zip|zip:inner/"
    assert absolute_source("file:rel/x") == f"{here}/file:rel/x"  # a bare path, as -f reads it
    home = os.path.expanduser("~")
    assert absolute_source("~/volume") == f"{home}/volume"
    for untouched in ("s3://bucket/p/", "file:///abs/x.zip|zip:", "memory://", "demo:", "/abs"):
        assert absolute_source(untouched) == untouched
    spec = json.loads(absolute_source('{"driver": "file", "path": "rel/vol"}'))
    assert spec == {"driver": "file", "path": f"{here}/rel/vol"}
    zipped = '{"driver": "zip", "base": {"driver": "file", "path": "v.zip"}, "path": "in/"}'
    assert json.loads(absolute_source(zipped)) == {
        "driver": "zip",
        "base": {"driver": "file", "path": f"{here}/v.zip"},
        "path": "in/",
    }
    s3 = '{"driver": "s3", "bucket": "b", "path": "p/", "endpoint": "http://127.0.0.1:9"}'
    assert absolute_source(s3) == s3
    for text in ("volume", "./vol.zip|zip:inner/", zipped):  # the same store as seen from here
        assert parse_spec(absolute_source(text)).location == parse_spec(text).location


def test_the_plan_holds_absolute_source_and_log_file(tmp_path, store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnt").mkdir()
    plan = make_plan(plan_args("store", "mnt", "--log-file", "logs/mount.log"))
    assert plan.source == str(store)
    assert plan.fsname == str(store)
    assert plan.mountpoint == str(tmp_path / "mnt")
    assert plan.log_file == str(tmp_path / "logs" / "mount.log")


def test_a_source_inside_its_mountpoint_is_refused(tmp_path, store):
    with pytest.raises(InvalidSource, match="inside the mountpoint"):
        make_plan(plan_args(str(store / "plain"), str(store), "-o", "nonempty"))


# == 2. validate and detect: a missing source, an empty one ======================================


@pytest.mark.parametrize("command", ["validate", "detect"])
def test_a_missing_source_exits_2_saying_so(tmp_path, capsys, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run([command, "/no/such/path"], capsys)
    assert (code, out) == (2, "")
    assert err == f"n5fs {command}: /no/such/path: no such file or directory\n"
    for source in ("missing.zip|zip:", "missing.zip", f"file://{tmp_path}/missing.zip|zip:"):
        code, out, err = run([command, source], capsys)
        assert (code, out) == (2, "")
        assert err == f"n5fs {command}: {tmp_path}/missing.zip: no such file or directory\n"


def test_missing_local_path_is_none_for_remote_and_present_sources(tmp_path):
    assert missing_local_path("s3://bucket/nothing/") is None
    assert missing_local_path("memory://") is None
    assert missing_local_path("demo:") is None
    assert missing_local_path(str(tmp_path)) is None
    assert missing_local_path(f"{tmp_path}/x/") == f"{tmp_path}/x"


def test_validate_says_when_it_found_nothing(tmp_path, capsys):
    (tmp_path / "README").write_text("no array here")
    code, out, err = run(["validate", str(tmp_path)], capsys)
    assert (code, out) == (1, "")
    assert f"n5fs validate: no array found in file://{tmp_path}: nothing to validate" in err
    code, out, err = run(["validate", "--json", str(tmp_path)], capsys)
    assert code == 1
    assert json.loads(out)["checked"] == {"metadata": 0, "chunks": 0, "other": 1}
    assert "no array found" in err
    code, out, err = run(["validate", "--allow-empty", str(tmp_path)], capsys)
    assert (code, err) == (0, "")
    assert out == (
        f"file://{tmp_path}: no array found; checked 0 metadata files, 0 chunks; "
        "1 other keys not judged; 0 could not be checked\n"
    )


def test_validate_of_a_real_array_is_not_empty(tmp_path, capsys):
    tensorstore_n5(tmp_path / "n5", ramp((8, 8)), [4, 4])
    code, out, err = run(["validate", str(tmp_path / "n5")], capsys)
    assert code == 0, err
    assert ": valid; checked " in out
    assert "no array found" not in err


def test_validate_help_teaches_allow_empty(capsys):
    assert "n5fs validate --allow-empty /data/incoming" in help_of("validate", capsys)


# == 3. mount points, options, flags ==============================================================


def test_mountpoint_messages(tmp_path):
    absent = tmp_path / "absent"
    with pytest.raises(MountFailed) as info:
        make_plan(plan_args("memory://", str(absent)))
    assert (
        str(info.value) == f"mountpoint {absent} does not exist (create it with mkdir -p {absent})"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(MountFailed, match=r"mountpoint .*/file is not a directory$"):
        make_plan(plan_args("memory://", str(tmp_path / "file")))
    full = tmp_path / "full"
    full.mkdir()
    for name in ("a", "b", "c", "d"):
        (full / name).write_text(name)
    with pytest.raises(MountFailed) as info:
        make_plan(plan_args("memory://", str(full)))
    assert f"mountpoint {full} is not empty (4 entries: a, b, c, ...)" in str(info.value)
    assert "-o nonempty" in str(info.value)
    plan = make_plan(plan_args("memory://", str(full), "-o", "nonempty,uid=5"))
    assert plan.options.nonempty
    assert plan.options.fuse == {"uid": "5"}  # libfuse 3 would refuse nonempty


def test_read_only_and_allow_other_flags(tmp_path, capsys):
    (tmp_path / "mnt").mkdir()
    plan = make_plan(plan_args("memory://", str(tmp_path / "mnt"), "--read-only", "--allow-other"))
    assert plan.read_only
    assert plan.options.fuse == {"allow_other": True}
    plan = make_plan(plan_args("memory://", str(tmp_path / "mnt"), "-o", "ro", "--allow-other"))
    assert plan.read_only
    help_text = help_of("mount", capsys)
    for expected in (
        "--read-only same as -o ro",
        "n5fs mount --read-only s3://bucket/vol/ /mnt/v",
        "--allow-other same as -o allow_other",
        "n5fs mount --allow-other /data/v /mnt/v",
        "-q, --quiet",
        "nonempty",
    ):
        assert expected in help_text


def _libfuse_options(*groups: str) -> dict[str, object]:
    opts = parse_options(list(groups))
    got: dict[str, object] = fuse_options(
        opts, read_only=False, ttl=5.0, fsname="x", libfuse_major=3
    )
    got.update(loop_options(opts, libfuse_major=3))
    return got


def test_allow_other_brings_default_permissions():
    assert _libfuse_options("allow_other")["default_permissions"] is True
    assert "default_permissions" not in _libfuse_options("uid=5")
    kept_out = _libfuse_options("allow_other,no_default_permissions")
    assert kept_out["allow_other"] is True
    assert "default_permissions" not in kept_out
    assert "no_default_permissions" not in kept_out  # n5fs's own: libfuse would refuse it
    again = _libfuse_options("allow_other,no_default_permissions", "default_permissions")
    assert again["default_permissions"] is True  # a later option wins


def test_libfuse_gets_a_valid_idle_thread_cap():
    assert _libfuse_options()["max_idle_threads"] == "10"
    assert _libfuse_options("max_threads=40")["max_idle_threads"] == "40"
    assert _libfuse_options("max_idle_threads=3")["max_idle_threads"] == "3"
    assert loop_options(parse_options([]), libfuse_major=2) == {}  # libfuse 2 knows neither


def test_mount_helper_is_quiet_unless_verbose():
    from n5fs.cli.fstab import mount_argv, translate_options

    call = translate_options(["ro"])
    assert "--quiet" in mount_argv("/d", "/m", call, verbose=False)
    assert "--quiet" not in mount_argv("/d", "/m", call, verbose=True)


# == status =======================================================================================

ROW = {
    "mountpoint": "/mnt/volumes",
    "source": "s3://lab/volumes/",
    "mode": "rw",
    "validate": "strict",
    "pid": 4242,
    "state": "mounted",
    "counters": {
        "commits": 12,
        "rejections": 1,
        "bytes_in": 12_900_000,
        "bytes_out": 3 << 30,
        "store_reads": 7,
        "cache_hits": 5,
        "cache_misses": 2,
        "cache_bytes": 2048,
        "open_handles": 1,
        "staging_bytes": 0,
    },
}


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 12_900_000, 3 << 30, 5 << 50)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "12.3 MiB",
        "3.0 GiB",
        "5.0 PiB",
    ]


def test_status_is_a_table_with_human_counters():
    orphan = {
        "mountpoint": "/mnt/gone",
        "source": "/data/x",
        "state": "not mounted",
        "counters": {},
    }
    lines = render_table([ROW, orphan])
    assert re.split(r"\s{2,}", lines[0]) == ["MOUNTPOINT", "SOURCE", "MODE", "PID", "STATE"]
    assert re.split(r"\s{2,}", lines[1]) == [
        "/mnt/volumes",
        "s3://lab/volumes/",
        "rw,strict",
        "4242",
        "mounted",
    ]
    assert lines[0].index("SOURCE") == lines[1].index("s3://") == lines[3].index("/data/x")
    assert lines[2].startswith("    12 commits, 1 rejected, 12.3 MiB in, 3.0 GiB out")
    assert "cache 5 hits/2 misses" in lines[2]
    assert re.split(r"\s{2,}", lines[3]) == ["/mnt/gone", "/data/x", "?,?", "-", "not mounted"]
    assert len(lines) == 4  # no counters line for a mount without counters
    assert counters_line({}).startswith("0 commits, 0 rejected, 0 B in")


def test_status_without_mounts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("N5FS_STATE_DIR", str(tmp_path / "state"))
    code, out, _ = run(["status", "--json"], capsys)
    assert code == 0
    assert not [row for row in json.loads(out) if str(tmp_path) in row.get("mountpoint", "")]


# == a closed pipe ================================================================================


# (not `status`: it asks every FUSE mount of the machine, and another test's may be hung)
@pytest.mark.parametrize("argv", [["validate", "--json", "demo:"], ["detect", "--json", "demo:"]])
def test_a_closed_pipe_ends_quietly(tmp_path, argv):
    proc = subprocess.Popen(
        [*CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "N5FS_STATE_DIR": str(tmp_path / "state")},
    )
    assert proc.stdout is not None
    proc.stdout.close()  # as `| head -0` does, before anything was written
    _, err = proc.communicate(timeout=60)
    assert err.decode() == ""
    assert proc.returncode == EXIT_BROKEN_PIPE


# == real mounts ==================================================================================


def _cli(mounter, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv],
        cwd=cwd,
        env=mounter.env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@fuse_test
def test_daemon_serves_a_relative_source_from_the_callers_directory(mounter, store, tmp_path):
    mp = mounter.mountpoint()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "vol.toml").write_text(f'mountpoint = "{mp}"\nvalidate = "warn"\n')
    result = _cli(
        mounter, tmp_path, "mount", "store", "--config", "etc/vol.toml", "--log-file", "m.log"
    )
    assert result.returncode == 0, result.stderr
    pid = mounter.pid(mp)
    assert result.stdout == f"mounted {store} at {mp} (pid {pid}, log {tmp_path}/m.log)\n"
    assert (tmp_path / "m.log").exists()
    assert "plain" in os.listdir(mp)
    assert (mp / "plain" / "hello.txt").read_bytes() == b"hello\n"
    os.mkdir(mp / "made-through-the-mount")
    assert (store / "made-through-the-mount").is_dir()
    assert not Path("/made-through-the-mount").exists()

    status = _cli(mounter, tmp_path, "status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["MOUNTPOINT", "SOURCE", "MODE", "PID", "STATE"]
    [row] = [i for i, line in enumerate(lines) if line.startswith(f"{mp} ")]
    assert re.split(r"\s{2,}", lines[row]) == [str(mp), str(store), "rw,warn", str(pid), "mounted"]
    assert re.match(
        r"^    \d+ commits, 0 rejected, \d+ B in, \d+(\.\d)? \w?i?B out", lines[row + 1]
    )


@fuse_test
def test_relative_zip_read_only_and_quiet(mounter, tmp_path):
    make_zip(tmp_path / "vol.zip")
    mp = mounter.mountpoint()
    result = _cli(mounter, tmp_path, "mount", "vol.zip|zip:", "mnt", "--read-only", "-q")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "ro" in mount_entry(str(mp)).options.split(",")
    assert (mp / "plain" / "hello.txt").read_bytes() == b"hello from the zip\n"
    state = json.loads(_cli(mounter, tmp_path, "status", "--json").stdout)
    [row] = [r for r in state if r["mountpoint"] == str(mp)]
    assert row["source"] == f"{tmp_path}/vol.zip|zip:"
    assert isinstance(row["counters"]["bytes_out"], int)  # raw numbers stay raw


@fuse_test
def test_a_nonempty_mountpoint_needs_o_nonempty(mounter, store):
    mp = mounter.mountpoint()
    (mp / "underneath.txt").write_text("hidden while mounted")
    refused = mounter.cli("mount", str(store), str(mp))
    assert refused.returncode == 2
    assert f"mountpoint {mp} is not empty (1 entry: underneath.txt)" in refused.stderr
    assert mount_entry(str(mp)) is None
    mounter.daemon(str(store), "-o", "nonempty")  # libfuse 3 never sees the option
    assert "plain" in os.listdir(mp)
    assert "underneath.txt" not in os.listdir(mp)


@fuse_test
def test_foreground_mount_prints_no_libfuse_noise(mounter, store):
    mp = mounter.foreground(str(store))
    assert "plain" in os.listdir(mp)
    proc = mounter.procs[-1]
    proc.terminate()
    assert proc.wait(timeout=60) == 0
    said = (mounter.tmp / f"{mp.name}.stderr").read_text()
    assert "max threads" not in said
    assert said == ""
