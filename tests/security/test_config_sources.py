"""A bad value is refused wherever it comes from, even when a later source overrides it:
a --config file with an invalid port is refused although --port is given (the file is
wrong, and would take effect as soon as the flag goes). And ``waltz local up`` with a
data directory it cannot use says so in one line. Real console scripts, real files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
KEY = "c0ffee00-1111-4222-8333-444455556666"


def refused(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # one line, no traceback
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def run(*argv: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, **kw)


@pytest.mark.parametrize(
    ("daemon", "args"),
    [
        ("waltz-server", ["--zookeeper", "127.0.0.1:1"]),
        (
            "waltz-storage",
            ["--directory", "{tmp}/data", "--cluster-key", KEY, "--num-partitions", "1"],
        ),
    ],
)
@pytest.mark.parametrize("override", ["flag", "environment"])
def test_a_bad_port_in_the_config_file_is_refused_although_overridden(
    tmp_path, daemon, args, override
):
    config = tmp_path / "daemon.toml"
    config.write_text('port = "not-a-port"\n')
    argv = [str(BIN / daemon), *(a.format(tmp=tmp_path) for a in args), "--config", str(config)]
    argv += ["--http-port", "0", "--ready-file", str(tmp_path / "ready.json")]
    env = dict(os.environ)
    if override == "flag":
        argv += ["--port", "0"]
    else:
        prefix = "WALTZ_SERVER_" if daemon == "waltz-server" else "WALTZ_STORAGE_"
        env[prefix + "PORT"] = "0"
    result = run(*argv, env=env)
    refused(
        result,
        f"{daemon}: error: setting port (from {config}):",
        "expected an integer in 0..65535, got 'not-a-port'",
    )
    assert not (tmp_path / "ready.json").exists()
    assert not (tmp_path / "data").exists()


def test_a_bad_environment_value_is_refused_although_a_flag_overrides_it(tmp_path):
    env = dict(os.environ, WALTZ_SERVER_HTTP_PORT="99999")
    result = run(
        str(BIN / "waltz-server"), "--zookeeper", "127.0.0.1:1", "--http-port", "0", env=env
    )
    refused(result, "setting http_port (from $WALTZ_SERVER_HTTP_PORT)", "got '99999'")


def local_up(data_dir: str, **kw) -> subprocess.CompletedProcess:
    return run(str(BIN / "waltz"), "local", "up", "--data-dir", data_dir, **kw)


@pytest.mark.parametrize(
    ("data_dir", "fragments"),
    [
        ("/proc/waltz-x", ["data directory /proc/waltz-x: cannot create it: "]),
        ("{file}", ["data directory {file}: not a directory"]),
        ("{file}/sub", ["data directory {file}/sub: cannot create it: Not a directory"]),
    ],
)
def test_local_up_refuses_a_data_directory_it_cannot_use(tmp_path, data_dir, fragments):
    file = tmp_path / "a-file"
    file.write_text("x")
    data_dir = data_dir.format(file=file)
    line = refused(
        local_up(data_dir), "waltz local: error: ", *(f.format(file=file) for f in fragments)
    )
    assert "Traceback" not in line
    assert file.read_text() == "x"


def test_local_up_refuses_a_directory_it_may_not_write(tmp_path):
    """A directory without write permission (as root, who ignores permissions, the
    command runs as the unprivileged user ``nobody``)."""
    # Outside pytest's private temporary directory, so that ``nobody`` can reach it.
    parent = tempfile.mkdtemp(prefix="waltz-unwritable-")
    try:
        os.chmod(parent, 0o555)
        prefix: list[str] = []
        if os.geteuid() == 0:
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            reach = subprocess.run([*prefix, "test", "-r", str(BIN / "waltz")], check=False)
            if reach.returncode != 0:
                pytest.skip(f"{BIN} is not readable by nobody (a private checkout directory)")
        existing = run(*prefix, str(BIN / "waltz"), "local", "up", "--data-dir", parent)
        refused(existing, f"waltz local: error: data directory {parent}: cannot write in it: ")
        assert "Permission denied" in existing.stderr
        inside = os.path.join(parent, "cluster")
        result = run(*prefix, str(BIN / "waltz"), "local", "up", "--data-dir", inside)
        refused(result, f"data directory {inside}: cannot create it: Permission denied")
        assert os.listdir(parent) == []
    finally:
        os.chmod(parent, stat.S_IRWXU)
        os.rmdir(parent)
