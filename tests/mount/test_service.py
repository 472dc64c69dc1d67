"""n5fs as a service: the systemd unit, the TOML config, sd_notify, the mount(8) helper,
journald logging, signals and stale-mount recovery, as docs/service.md promises them.

Mounts are real and run in child processes (tests/mounting.py); the test plays systemd's part
by owning the NOTIFY_SOCKET datagram socket and the JOURNAL_STREAM file.
"""

from __future__ import annotations

import configparser
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import uuid
from argparse import Namespace
from pathlib import Path

import pytest

from n5fs.cli.config import ConfigError, MountConfig, S3Settings, apply_config, load_config
from n5fs.cli.fstab import mount_argv, translate_options
from n5fs.cli.main import build_parser
from n5fs.cli.mount import make_plan
from n5fs.cli.sdnotify import Notifier, socket_address, status_interval, status_line
from n5fs.errors import InvalidSource
from n5fs.fuse_front.mounts import is_stale, mount_entry
from n5fs.kvstore.spec import S3Spec, ZipSpec, parse_spec
from tests import REPO_ROOT
from tests.mounting import CLI, real_mount, wait_until

UNIT = REPO_ROOT / "systemd" / "n5fs@.service"
HELPER = [sys.executable, "-m", "n5fs.cli.fstab"]

needs_fuse = real_mount(120)


def fuse_test(func):
    for mark in reversed(needs_fuse):
        func = mark(func)
    return func


# == systemd's side of sd_notify ===================================================================

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class NotifySocket:
    """The datagram socket systemd would own; reports each message with its sender's pid."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(socket_address(address))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.seen: list[dict[str, str]] = []

    def receive(self, timeout: float) -> tuple[dict[str, str], int]:
        self.sock.settimeout(timeout)
        data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(_CREDS.size))
        pid = next(
            (
                _CREDS.unpack(body[: _CREDS.size])[0]
                for level, kind, body in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
            ),
            -1,
        )
        fields = dict(line.split("=", 1) for line in data.decode().splitlines())
        self.seen.append(fields)
        return fields, pid

    def wait_for(self, predicate, what: str, timeout: float = 60) -> tuple[dict[str, str], int]:
        while True:
            try:
                fields, pid = self.receive(timeout)
            except TimeoutError:
                pytest.fail(f"no {what} from the service within {timeout} s; got {self.seen}")
            if predicate(fields):
                return fields, pid

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify"
    if len(str(path)) > 100:  # sun_path holds 108 bytes
        path = Path("/tmp") / f"n5fs-notify-{uuid.uuid4().hex[:12]}"
    sock = NotifySocket(str(path))
    yield sock
    sock.close()
    path.unlink(missing_ok=True)


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def backing(tmp_path) -> Path:
    store = tmp_path / "store"
    (store / "plain").mkdir(parents=True)
    (store / "plain" / "hello.txt").write_bytes(b"hello\n")
    return store


def errno_of_call(call) -> int:
    with pytest.raises(OSError) as info:
        call()
    return info.value.errno


# == the notify protocol, without a mount ==========================================================


def test_notifier_reaches_an_abstract_socket_and_leaves_the_environment():
    listener = NotifySocket(f"@n5fs-test-{uuid.uuid4().hex}")
    try:
        env = {"NOTIFY_SOCKET": listener.address, "PATH": "/bin"}
        notifier = Notifier.from_environment(env)
        assert notifier is not None
        assert "NOTIFY_SOCKET" not in env  # children (fusermount3) must not speak for us
        assert notifier.ready("two\nlines")
        fields, pid = listener.receive(5)
        assert fields == {"READY": "1", "STATUS": "two lines"}
        assert pid == os.getpid()
        assert notifier.stopping("bye")
        assert not notifier.stopping("again")  # said once, whoever asks first
        assert listener.receive(5)[0] == {"STOPPING": "1", "STATUS": "bye"}
        notifier.close()
    finally:
        listener.close()


def test_no_socket_no_notifier_and_odd_values_are_refused():
    assert Notifier.from_environment({}) is None
    assert Notifier.from_environment({"NOTIFY_SOCKET": "vsock:2:1234"}) is None
    assert status_interval({"N5FS_STATUS_INTERVAL": "0.5"}) == 0.5
    assert status_interval({"N5FS_STATUS_INTERVAL": "-1"}) == status_interval({})


def test_status_line_names_source_mountpoint_and_counters():
    line = status_line("s3://b/p/", "/mnt/v", {"commits": 3, "rejections": 1, "bytes_out": 2048})
    assert line.startswith("s3://b/p/ at /mnt/v: 3 commits, 1 rejected")
    assert "2.0 KiB out" in line


# == the config file ===============================================================================


def test_consistency_in_a_config_becomes_the_option(tmp_path):
    path = write_config(tmp_path / "node.toml", 'consistency = "strict"\n')
    assert "consistency=strict" in load_config(str(path)).option_groups()


@pytest.mark.parametrize(
    ("text", "named", "reason"),
    [
        ('source = "memory://"\ncache_sise = "1G"\n', "cache_sise", "did you mean 'cache_size'"),
        ("read_only = 'yes'\n", "read_only", "expected true or false, got a string 'yes'"),
        ('validate = "strictest"\n', "validate", "must be one of strict, warn, off"),
        ('cache_size = "lots"\n', "cache_size", "cannot read 'lots' as a size"),
        ("cache_ttl = -1\n", "cache_ttl", "cannot be negative"),
        ('staging_size = "lots"\n', "staging_size", "cannot read 'lots' as a size"),
        ("max_file_size = -1\n", "max_file_size", 'expected a size like "512M"'),
        ('mountpoint = "mnt"\n', "mountpoint", "must be an absolute path"),
        ('options = "allow_other"\n', "options", "expected a list of option strings"),
        ('source = "bogus://x"\n', "source", "unknown URL scheme 'bogus'"),
        ("[source]\nbucket = 'b'\n", "source", "needs a 'driver' string"),
        ('[s3]\nendpont = "http://h"\n', "s3.endpont", "did you mean 'endpoint'"),
        ("[s3]\nanonymous = 1\n", "s3.anonymous", "expected true or false"),
        ('source = "/data"\n[s3]\nregion = "x"\n', "s3", "'/data' is not on S3"),
        ('source = "s3://b/p/\n', "not valid TOML", "line 1"),
        ('consistency = "eventual"\n', "consistency", "must be one of ttl, strict"),
    ],
)
def test_a_bad_config_names_the_key_and_the_reason(tmp_path, text, named, reason):
    path = write_config(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    message = str(info.value)
    assert message.startswith(f"config {path}: {named}")
    assert reason in message


def test_mount_with_a_bad_config_exits_2_naming_the_key(tmp_path):
    path = write_config(tmp_path / "bad.toml", 'source = "memory://"\nallow_others = true\n')
    result = subprocess.run(
        [*CLI, "mount", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"config {path}: allow_others: unknown key (did you mean 'allow_other'?" in result.stderr


def test_mount_without_source_says_where_to_give_it(tmp_path):
    path = write_config(tmp_path / "partial.toml", f'mountpoint = "{tmp_path}"\n')
    result = subprocess.run(
        [*CLI, "mount", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "needs a SOURCE" in result.stderr


def test_command_line_overrides_the_file(tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    path = write_config(
        tmp_path / "vol.toml",
        f"""
source = "memory://"
mountpoint = "{mp}"
validate = "warn"
read_only = true
cache_size = "1M"
cache_ttl = 7
staging_size = "8M"
max_file_size = "1G"
allow_other = true
log_level = "debug"
options = ["default_permissions"]
""",
    )
    argv = ["mount", "--config", str(path), "--cache-ttl", "9", "-o", "rw,validate=off"]
    args = build_parser().parse_args([*argv, "--max-file-size", "2G"])
    apply_config(args, load_config(str(path)))
    assert args.log_level == "debug"
    plan = make_plan(args)
    assert (plan.source, plan.mountpoint) == ("memory://", str(mp))
    assert plan.validate == "off"  # -o on the command line comes after the file's settings
    assert not plan.read_only
    assert (plan.cache_bytes, plan.ttl) == (1 << 20, 9.0)
    assert (plan.staging_bytes, plan.max_file_size) == (8 << 20, 2 << 30)
    assert plan.options.fuse == {"allow_other": True, "default_permissions": True}
    argv = ["mount", "memory://", str(mp), "--config", str(path), "--validate", "strict"]
    args = build_parser().parse_args(argv)
    apply_config(args, load_config(str(path)))
    assert make_plan(args).validate == "strict"


def test_staging_and_max_file_size_from_o_options_flags_and_defaults(tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    plan = make_plan(build_parser().parse_args(["mount", "memory://", str(mp)]))
    assert (plan.staging_bytes, plan.max_file_size) == (256 << 20, 1 << 40)
    argv = ["mount", "memory://", str(mp), "-o", "staging_size=64M,max_file_size=10G,uid=5"]
    plan = make_plan(build_parser().parse_args(argv))
    assert (plan.staging_bytes, plan.max_file_size) == (64 << 20, 10 << 30)
    assert plan.options.fuse == {"uid": "5"}  # libfuse never sees n5fs's own sizes
    plan = make_plan(build_parser().parse_args([*argv, "--staging-size", "1G"]))
    assert plan.staging_bytes == 1 << 30  # the flag beats -o
    for bad, reason in (("staging_size=lots", "cannot read 'lots'"), ("max_file_size", "needs")):
        args = build_parser().parse_args(["mount", "memory://", str(mp), "-o", bad])
        with pytest.raises(InvalidSource, match=reason):
            make_plan(args)


def test_s3_settings_reach_the_s3_store_of_the_source():
    settings = S3Settings(endpoint="http://127.0.0.1:9", region="eu-west-1", anonymous=True)
    args = Namespace(source="s3://bucket/vol/", mountpoint="/m", log_level=None, options=None)
    apply_config(args, MountConfig(path="x.toml", s3=settings))
    spec = parse_spec(args.source)
    assert isinstance(spec, S3Spec)
    assert (spec.bucket, spec.path, spec.endpoint, spec.aws_region, spec.anonymous) == (
        "bucket",
        "vol/",
        "http://127.0.0.1:9",
        "eu-west-1",
        True,
    )
    args = Namespace(
        source="s3://bucket/a.zip|zip:inner/", mountpoint="/m", log_level=None, options=None
    )
    apply_config(args, MountConfig(path="x.toml", s3=S3Settings(profile="lab")))
    zipped = parse_spec(args.source)
    assert isinstance(zipped, ZipSpec)
    assert isinstance(zipped.base, S3Spec)
    assert (zipped.base.profile, zipped.path) == ("lab", "inner/")


def test_the_example_config_is_valid_and_documents_every_key():
    example = REPO_ROOT / "systemd" / "n5fs.toml.example"
    config = load_config(str(example))
    assert config.source is not None
    assert config.mountpoint is not None
    text = example.read_text()
    for key in ("source", "mountpoint", "validate", "read_only", "cache_size", "cache_ttl"):
        assert re.search(rf"^{key} = ", text, re.MULTILINE), key
    for key in ("staging_size", "max_file_size"):
        assert re.search(rf"^{key} = ", text, re.MULTILINE), key
    for key in ("allow_other", "log_level", "options", "endpoint", "region", "anonymous"):
        assert re.search(rf"^{key} = ", text, re.MULTILINE), key
    assert re.search(r"^# profile = ", text, re.MULTILINE)


# == the systemd unit ==============================================================================

#: any of these gives the service its own mount namespace: the mount would be invisible outside
_PRIVATE_MOUNTS = (
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectHostname",
    "ProtectProc",
    "ProcSubset",
)


def _verify(tool: str, unit_text: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of an instance of the template, with ExecStart pointing at
    a stub that exists (verify checks that the command is executable)."""
    stub = directory / "bin" / "n5fs"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    (directory / "n5fs@.service").write_text(unit_text.replace("/usr/local/bin/n5fs", str(stub)))
    return subprocess.run(
        [tool, "verify", "--man=no", str(directory / "n5fs@volumes.service")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=directory,
    )


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is missing (Debian: apt-get install systemd)")
    text = UNIT.read_text()
    result = _verify(tool, text, tmp_path / "good")
    complaints = [line for line in result.stderr.splitlines() if "n5fs@" in line]
    assert result.returncode == 0, result.stderr
    assert complaints == []
    broken = _verify(tool, text.replace("NotifyAccess=", "NotifyAcess="), tmp_path / "bad")
    assert any("NotifyAcess" in line for line in broken.stderr.splitlines())


def test_the_unit_is_a_notify_service_that_keeps_its_mount_visible():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(UNIT)
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["ExecStart"] == (
        "/usr/local/bin/n5fs mount --foreground --config /etc/n5fs/%i.toml"
    )
    assert service["Restart"] == "on-failure"
    assert "/dev/fuse rw" in service["DeviceAllow"]
    assert "CAP_SYS_ADMIN" in service["CapabilityBoundingSet"].split()
    assert [key for key in _PRIVATE_MOUNTS if key in service] == []
    assert "network-online.target" in unit["Unit"]["After"]
    assert "network-online.target" in unit["Unit"]["Wants"]


# == the mount(8) helper, without a mount ==========================================================


def test_fstab_options_are_sorted_for_n5fs_and_libfuse():
    call = translate_options(
        [
            "_netdev,ro,validate=strict,nofail,x-systemd.automount,x-systemd.idle-timeout=60",
            "defaults,noauto,users,allow_other,log_level=info,uid=1000,cache_size=1G",
        ]
    )
    assert call.options == ["ro", "validate=strict", "allow_other", "uid=1000", "cache_size=1G"]
    assert call.flags == ["--log-level", "info"]
    assert "x-systemd.idle-timeout=60" in call.dropped
    assert mount_argv("s3://b/p/", "/mnt/vol", call, verbose=False) == [
        "mount",
        "s3://b/p/",
        "/mnt/vol",
        "--log-level",
        "info",
        "--quiet",  # mount(8) helpers say nothing on success
        "-o",
        "ro,validate=strict,allow_other,uid=1000,cache_size=1G",
    ]


def test_helper_fake_mount_checks_options_and_prints_the_command(tmp_path):
    argv = [*HELPER, "s3://bucket/prefix/", "/mnt/vol", "-f", "-v", "-n"]
    ok = subprocess.run(
        [*argv, "-o", "_netdev,ro,validate=strict"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "n5fs -v mount s3://bucket/prefix/ /mnt/vol -o ro,validate=strict" in ok.stderr
    bad = subprocess.run(
        [*argv, "-o", "validate=maybe"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 32
    assert "validate must be one of strict, warn, off, not 'maybe'" in bad.stderr
    usage = subprocess.run(
        [*argv, "-N", "1234"], capture_output=True, text=True, timeout=60, check=False
    )
    assert usage.returncode == 1
    assert "-N" in usage.stderr


# == real mounts ===================================================================================


@fuse_test
def test_systemd_notify_life_cycle(mounter, backing, notify_socket, tmp_path):
    """READY=1 once the mount answers, live STATUS=, journald lines, STOPPING=1 on SIGTERM,
    and what was staged is committed before the process exits 0 with the mount gone."""
    mp = mounter.mountpoint()
    config = write_config(
        tmp_path / "vol.toml",
        f'source = "{backing}"\nmountpoint = "{mp}"\nlog_level = "info"\n',
    )
    journal = tmp_path / "journal"
    journal.touch()
    st = os.stat(journal)
    env = {
        "NOTIFY_SOCKET": notify_socket.address,
        "N5FS_STATUS_INTERVAL": "0.1",
        "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}",
    }
    argv = [*CLI, "mount", "--foreground", "--config", str(config)]
    proc = mounter.spawn(argv, mp, env=env, stderr=journal)

    ready, sender = notify_socket.wait_for(lambda f: "READY" in f, "READY=1")
    entry = mount_entry(str(mp))  # at the moment READY arrives, the mount answers
    assert entry is not None
    assert entry.is_n5fs
    assert os.listdir(mp / "plain") == ["hello.txt"]
    assert sender == proc.pid  # the main process: NotifyAccess=main accepts it
    assert ready["READY"] == "1"
    assert ready["STATUS"].startswith(f"{backing} at {mp}: 0 commits, 0 rejected")

    (mp / "plain" / "new.txt").write_bytes(b"new\n")
    notify_socket.wait_for(lambda f: " 1 commits" in f.get("STATUS", ""), "STATUS with 1 commit")
    os.mkdir(mp / "arr")
    with pytest.raises(OSError) as refused, open(mp / "arr" / ".zarray", "wb") as f:
        f.write(b'{"zarr_format": 2}')
    assert refused.value.errno == errno.EINVAL
    notify_socket.wait_for(lambda f: "1 rejected" in f.get("STATUS", ""), "STATUS with 1 rejection")

    pending = open(mp / "plain" / "pending.txt", "wb")  # noqa: SIM115 (open across the stop)
    pending.write(b"x" * 100)
    pending.flush()  # staged in the daemon, not yet committed
    proc.send_signal(signal.SIGTERM)
    stopping, sender = notify_socket.wait_for(lambda f: "STOPPING" in f, "STOPPING=1")
    assert sender == proc.pid
    assert stopping["STOPPING"] == "1"
    assert proc.wait(timeout=60) == 0
    with contextlib.suppress(OSError):  # ENOTCONN: the mount is gone
        pending.close()
    assert mount_entry(str(mp)) is None
    assert (backing / "plain" / "pending.txt").read_bytes() == b"x" * 100
    assert (backing / "plain" / "new.txt").read_bytes() == b"new\n"

    lines = journal.read_text().splitlines()
    refusal = [line for line in lines if "/arr/.zarray" in line]
    assert refusal
    assert refusal[0].startswith("<4>refused /arr/.zarray: ")  # WARNING, with its reason
    assert any(line.startswith("<6>mounted at ") for line in lines)
    assert not [line for line in lines if re.search(r"\d\d:\d\d:\d\d", line)]  # journald's job


@fuse_test
def test_mount_helper_with_the_argv_of_mount8(mounter, backing):
    ro = mounter.mountpoint("ro")
    result = subprocess.run(
        [*HELPER, str(backing), str(ro), "-n", "-o", "_netdev,ro,nofail,x-systemd.automount"],
        env=mounter.env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "ro" in mount_entry(str(ro)).options.split(",")
    assert (ro / "plain" / "hello.txt").read_bytes() == b"hello\n"
    assert errno_of_call(lambda: (ro / "plain" / "new.txt").write_bytes(b"x")) == errno.EROFS

    rw = mounter.mountpoint("rw")
    result = subprocess.run(
        [*HELPER, str(backing), str(rw), "-o", "rw,defaults,_netdev,validate=off"],
        env=mounter.env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    os.mkdir(rw / "arr")
    (rw / "arr" / ".zarray").write_bytes(b'{"zarr_format": 2}')  # invalid: no shape, dtype...
    assert (backing / "arr" / ".zarray").read_bytes() == b'{"zarr_format": 2}'
    state = json.loads(mounter.cli("status", "--json").stdout)
    ours = [row for row in state if row["mountpoint"] in (str(ro), str(rw))]
    assert {row["mountpoint"]: row["validate"] for row in ours} == {
        str(ro): "strict",
        str(rw): "off",
    }

    bad = mounter.mountpoint("bad")
    result = subprocess.run(
        [*HELPER, "demo:", str(bad), "-o", "_netdev,no_such_option"],
        env=mounter.env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 32
    assert "unknown option" in result.stderr
    assert "no_such_option" in result.stderr
    assert mount_entry(str(bad)) is None


@fuse_test
@pytest.mark.s3
def test_sighup_and_restart_after_a_crash_under_config(
    mounter, s3_server, s3_bucket, notify_socket, tmp_path
):
    """An S3 mount from a config file: SIGHUP makes a changed object visible long before the
    TTL, and after a crash a restart detaches the stale mount and mounts again."""
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="vol/plain/a.txt", Body=b"first\n")
    mp = mounter.mountpoint()
    config = write_config(
        tmp_path / "vol.toml",
        f"""
source = "s3://{s3_bucket}/vol/"
mountpoint = "{mp}"
cache_ttl = 3600

[s3]
endpoint = "{s3_server.endpoint}"
region = "{s3_server.region}"
""",
    )
    argv = [*CLI, "mount", "--foreground", "--config", str(config)]
    env = {"NOTIFY_SOCKET": notify_socket.address}
    proc = mounter.spawn(argv, mp, env=env)
    notify_socket.wait_for(lambda f: "READY" in f, "READY=1")
    target = mp / "plain" / "a.txt"
    assert target.read_bytes() == b"first\n"
    client.put_object(Bucket=s3_bucket, Key="vol/plain/a.txt", Body=b"FIRST\n")
    assert target.read_bytes() == b"first\n"  # cached for an hour
    proc.send_signal(signal.SIGHUP)
    wait_until(lambda: target.read_bytes() == b"FIRST\n", "the changed object after SIGHUP")

    proc.kill()  # a crash: the kernel keeps a mount nobody serves
    proc.wait()
    wait_until(lambda: is_stale(str(mp)), "the mount goes stale")
    again = mounter.spawn(argv, mp, env=env, stderr=tmp_path / "again.stderr")
    notify_socket.wait_for(lambda f: "READY" in f, "READY=1 after the restart")
    assert not is_stale(str(mp))
    assert target.read_bytes() == b"FIRST\n"
    assert "stale mount" in (tmp_path / "again.stderr").read_text()
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=60) == 0
    assert mount_entry(str(mp)) is None
