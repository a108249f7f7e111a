"""Server settings: defaults, the TOML file < environment < flags precedence, bad values,
cross-setting checks and the advertised host.

Every bad or missing setting is a ConfigError of one line naming the setting and
where its value came from; ``waltz-server`` prints it and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from waltz_client.wire.client_messages import (
    MAX_LOCKS,
    AppendRequest,
    ClientMessageType,
    decode_client_request,
)
from waltz_client.wire.framing import FrameDecoder
from waltz_client.wire.records import ReqId
from waltz_server.config import MAX_APPEND_OVERHEAD, ConfigError, build_parser, load_config

ZK = ["--zookeeper", "zk1:2181,zk2:2181/chroot"]
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

DEFAULTS = {
    "zookeeper": "zk1:2181,zk2:2181/chroot",
    "zk_root": "/waltz",
    "zk_session_timeout": 10.0,
    "server_id": "",
    "host": "0.0.0.0",
    "port": 55180,
    "http_port": 55181,
    "advertised_host": "",
    "advertised_tls_name": "",
    "lock_table_size": 1 << 16,
    "lock_hashes": 3,
    "feed_cache_bytes": 16 * MiB,
    "data_cache_bytes": 64 * MiB,
    "max_queue": 10_000,
    "max_batch_bytes": 4 * MiB,
    "max_in_flight": 16,
    "max_member_backlog_bytes": 64 * MiB,
    "memory_budget_bytes": 2048 * MiB,
    "checkpoint_interval": 1_000_000,
    "retention_interval": 60.0,
    "storage_timeout": 5.0,
    "replace_storage_after": 0.0,
    "shared_storage_connections": True,
    "catch_up_inline_records": 5_000,
    "catch_up_rate": 128 * MiB,
    "client_write_buffer_bytes": 4 * MiB,
    "max_frame_bytes": 64 * MiB,
    "max_data_bytes": 16 * MiB,
    "max_connections": 1024,
    "max_connections_per_address": 256,
    "handshake_timeout": 10.0,
    "partial_frame_timeout": 60.0,
    "partial_frames_max_bytes": 256 * MiB,
    "max_feeds_per_connection": 1024,
    "max_feeds_per_partition": 10_000,
    "max_reads_per_connection": 32,
    "max_read_bytes_per_connection": 64 * MiB,
    "client_id_quota": 1000,
    "client_id_retention": 604800.0,
    "zk_auth_file": "",
    "zk_tls_cert": "",
    "zk_tls_key": "",
    "zk_tls_ca": "",
    "tls_cert": "",
    "tls_key": "",
    "tls_ca": "",
    "tls_verify_peer": True,
    "http_tls": False,
    "storage_tls_cert": "",
    "storage_tls_key": "",
    "storage_tls_ca": "",
    "storage_tls_verify_peer": True,
    "ready_file": "",
    "log_level": "INFO",
    "log_format": "text",
    "zk_credential": None,
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_var(name: str) -> str:
    return "WALTZ_SERVER_" + name.upper()


def toml_file(tmp_path: Path, text: str | bytes, name: str = "server.toml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def toml_string(value: str) -> str:
    """A TOML basic string holding ``value``."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def config_error(argv: list[str], environ: dict[str, str] | None = None) -> str:
    """The ConfigError's message, checked to be exactly one line."""
    with pytest.raises(ConfigError) as info:
        load_config(argv, environ or {})
    message = str(info.value)
    assert message, "empty error"
    assert "\n" not in message, f"not one line: {message!r}"
    return message


# --- defaults -----------------------------------------------------------------------------------


def test_defaults_when_only_zookeeper_is_given():
    config = load_config(ZK, {})
    assert dataclasses.asdict(config) == DEFAULTS
    assert isinstance(config.zk_session_timeout, float)
    assert isinstance(config.storage_timeout, float)


def test_every_setting_has_a_flag_and_a_field():
    parser = build_parser()
    help_text = parser.format_help()
    assert "--config" in help_text
    for name in DEFAULTS:
        if name == "zk_credential":
            continue  # read from zk_auth_file, not a setting of its own
        assert flag(name) in help_text, name
        assert env_var(name) in help_text, name
    assert "(required; env WALTZ_SERVER_ZOOKEEPER)" in " ".join(help_text.split())
    assert "default 55180" in help_text


def test_parser_is_the_one_load_config_uses():
    args = build_parser().parse_args(["--zookeeper", "z", "--port", "1"])
    assert (args.zookeeper, args.port, args.config, args.http_port) == ("z", "1", None, None)


def test_the_environ_argument_not_os_environ_is_read(monkeypatch):
    monkeypatch.setenv("WALTZ_SERVER_PORT", "1234")
    monkeypatch.setenv("WALTZ_SERVER_ZOOKEEPER", "from-os-environ")
    assert load_config(ZK, {}).port == 55180
    with pytest.raises(ConfigError, match="zookeeper is required"):
        load_config([], {})


def test_variables_of_other_daemons_are_ignored():
    environ = {"WALTZ_STORAGE_PORT": "1", "WALTZ_PORT": "2", "PORT": "3"}
    assert load_config(ZK, environ).port == 55180


def test_argv_none_reads_sys_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["waltz-server", "--zookeeper", "z:1", "--port", "7"])
    config = load_config(None, {})
    assert (config.zookeeper, config.port) == ("z:1", 7)


# --- the required zookeeper setting -------------------------------------------------------------


def test_missing_zookeeper_names_the_flag_and_the_variable():
    message = config_error([])
    assert message == (
        "setting zookeeper is required: set --zookeeper, $WALTZ_SERVER_ZOOKEEPER or "
        "'zookeeper' in the --config file"
    )


def test_missing_zookeeper_with_other_settings_given(tmp_path):
    path = toml_file(tmp_path, "port = 1\n")
    message = config_error(["--config", path, "--http-port", "2"], {"WALTZ_SERVER_HOST": "h"})
    assert "--zookeeper" in message and "WALTZ_SERVER_ZOOKEEPER" in message


@pytest.mark.parametrize(
    ("argv", "environ", "source"),
    [
        (["--zookeeper="], {}, "--zookeeper"),
        (["--zookeeper", "   "], {}, "--zookeeper"),
        ([], {"WALTZ_SERVER_ZOOKEEPER": ""}, "$WALTZ_SERVER_ZOOKEEPER"),
    ],
)
def test_empty_zookeeper_is_an_error(argv, environ, source):
    message = config_error(argv, environ)
    assert message.startswith(f"setting zookeeper (from {source}): expected a non-empty string")


def test_zookeeper_from_the_environment_or_the_file(tmp_path):
    assert load_config([], {"WALTZ_SERVER_ZOOKEEPER": "env:2181"}).zookeeper == "env:2181"
    path = toml_file(tmp_path, 'zookeeper = "file:2181"\n')
    assert load_config(["--config", path], {}).zookeeper == "file:2181"


# --- precedence: file < environment < flags ---------------------------------------------------


def test_file_overrides_defaults(tmp_path):
    path = toml_file(
        tmp_path,
        'zookeeper = "file:2181"\n'
        'zk_root = "/from-file"\n'
        "port = 1111\n"
        "zk_session_timeout = 30\n"
        'feed_cache_bytes = "1MiB"\n'
        "data_cache_bytes = 8192\n"
        'log_level = "debug"\n',
    )
    config = load_config(["--config", path], {})
    assert config.zookeeper == "file:2181"
    assert config.zk_root == "/from-file"
    assert config.port == 1111
    assert config.zk_session_timeout == 30.0
    assert config.feed_cache_bytes == MiB
    assert config.data_cache_bytes == 8192
    assert config.log_level == "DEBUG"
    assert config.http_port == 55181  # untouched: still the default


@pytest.mark.parametrize(
    ("in_file", "in_env", "in_flags", "expected"),
    [
        (False, False, False, 55180),
        (True, False, False, 1111),
        (False, True, False, 2222),
        (False, False, True, 3333),
        (True, True, False, 2222),
        (True, False, True, 3333),
        (False, True, True, 3333),
        (True, True, True, 3333),
    ],
)
def test_precedence_file_then_environment_then_flags(tmp_path, in_file, in_env, in_flags, expected):
    argv = list(ZK)
    environ = {}
    if in_file:
        argv += ["--config", toml_file(tmp_path, "port = 1111\n")]
    if in_env:
        environ["WALTZ_SERVER_PORT"] = "2222"
    if in_flags:
        argv += ["--port", "3333"]
    assert load_config(argv, environ).port == expected


def test_each_setting_takes_its_own_latest_source(tmp_path):
    path = toml_file(
        tmp_path,
        'zookeeper = "file:1"\nzk_root = "/file"\nlock_hashes = 4\nport = 1111\n',
    )
    environ = {
        "WALTZ_SERVER_ZK_ROOT": "/env",
        "WALTZ_SERVER_PORT": "2222",
        "WALTZ_SERVER_HTTP_PORT": "2223",
    }
    config = load_config(["--config", path, "--port", "3333"], environ)
    assert config.zookeeper == "file:1"  # file only
    assert config.lock_hashes == 4  # file only
    assert config.zk_root == "/env"  # env beats file
    assert config.http_port == 2223  # env only
    assert config.port == 3333  # flag beats env and file


def test_flag_order_does_not_matter_but_the_last_repeat_wins(tmp_path):
    path = toml_file(tmp_path, "port = 1111\n")
    assert load_config(["--port", "3333", "--config", path, *ZK], {}).port == 3333
    assert load_config([*ZK, "--port", "1", "--port", "2"], {}).port == 2


def test_a_bad_value_overridden_by_a_later_source_is_still_refused(tmp_path):
    """The overridden source is wrong, and would take effect once the override goes."""
    path = toml_file(tmp_path, 'port = "not a port"\n')
    with pytest.raises(ConfigError, match=r"setting port \(from .*server\.toml\): expected an"):
        load_config([*ZK, "--config", path], {"WALTZ_SERVER_PORT": "4444"})
    with pytest.raises(ConfigError, match=r"setting port \(from \$WALTZ_SERVER_PORT\)"):
        load_config([*ZK, "--port", "5555"], {"WALTZ_SERVER_PORT": "nope"})
    good = toml_file(tmp_path, "port = 1234\n", "good.toml")
    assert load_config([*ZK, "--config", good, "--port", "5555"], {}).port == 5555


def test_empty_file_changes_nothing(tmp_path):
    path = toml_file(tmp_path, "# nothing here\n")
    assert dataclasses.asdict(load_config([*ZK, "--config", path], {})) == DEFAULTS


# --- the TOML file ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("bogus = 1\n", "bogus"),
        ("max-frame-bytes = 65536\n", "max-frame-bytes"),  # file keys use underscores
        ("PORT = 1\n", "PORT"),
        ("config = 'other.toml'\n", "config"),
        ("[server]\nport = 1\n", "server"),
    ],
)
def test_unknown_key_in_the_file(tmp_path, text, key):
    path = toml_file(tmp_path, text)
    message = config_error([*ZK, "--config", path])
    assert message.startswith(f"{path}: unknown setting {key!r} (known: zookeeper, zk_root, ")
    assert message.endswith("storage_tls_verify_peer, ready_file, log_level, log_format)")


def test_missing_file(tmp_path):
    path = str(tmp_path / "missing.toml")
    message = config_error([*ZK, "--config", path])
    assert message == f"--config {path}: cannot read: No such file or directory"


def test_file_that_is_a_directory(tmp_path):
    message = config_error([*ZK, "--config", str(tmp_path)])
    assert message == f"--config {tmp_path}: cannot read: Is a directory"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_file_without_read_permission(tmp_path):
    path = toml_file(tmp_path, "port = 1\n")
    os.chmod(path, 0)
    try:
        message = config_error([*ZK, "--config", path])
    finally:
        os.chmod(path, 0o600)
    assert message == f"--config {path}: cannot read: Permission denied"


@pytest.mark.parametrize(
    "text",
    [
        "port = \n",
        "port 1\n",
        "port = 1\nport = 2\n",  # a key defined twice
        'zookeeper = "unterminated\n',
        "[server\n",
        "= 1\n",
    ],
)
def test_invalid_toml(tmp_path, text):
    path = toml_file(tmp_path, text)
    message = config_error([*ZK, "--config", path])
    assert message.startswith(f"--config {path}: not valid TOML: ")
    assert "line" in message  # tomllib says where


def test_file_that_is_not_utf8(tmp_path):
    path = toml_file(tmp_path, b'zookeeper = "caf\xe9"\n')
    message = config_error(["--config", path])
    assert message.startswith(f"--config {path}: not valid TOML")


def test_toml_types_are_parsed_like_strings(tmp_path):
    path = toml_file(
        tmp_path,
        'port = "1234"\n'
        "zk_session_timeout = 2\n"
        "storage_timeout = 0.5\n"
        'max_queue = "77"\n'
        "server_id = 42\n",
    )
    config = load_config([*ZK, "--config", path], {})
    assert config.port == 1234
    assert config.zk_session_timeout == 2.0
    assert config.storage_timeout == 0.5
    assert config.max_queue == 77
    assert config.server_id == "42"


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("port = true", "port"),
        ("lock_hashes = false", "lock_hashes"),
        ("zk_session_timeout = true", "zk_session_timeout"),
        ("feed_cache_bytes = true", "feed_cache_bytes"),
        ("feed_cache_bytes = 1.5", "feed_cache_bytes"),
        ('feed_cache_bytes = "1.5MiB"', "feed_cache_bytes"),
        ("zookeeper = 5", "zookeeper"),
        ("zk_root = []", "zk_root"),
        ("port = [1]", "port"),
        ("port = {a = 1}", "port"),
    ],
)
def test_wrong_toml_types(tmp_path, line, name):
    path = toml_file(tmp_path, line + "\n")
    message = config_error([*(ZK if name != "zookeeper" else []), "--config", path])
    assert message.startswith(f"setting {name} (from {path}): ")


@pytest.mark.parametrize("line", ["port = 8080.9", "lock_hashes = 2.5"])
def test_fractional_integer_settings_are_refused(tmp_path, line):
    path = toml_file(tmp_path, line + "\n")
    config_error([*ZK, "--config", path])


# --- bad values: one line naming the setting and the source ----------------------------------

BAD_VALUES = [
    # (setting, value, fragment of the complaint)
    ("port", "70000", "expected an integer in 0..65535, got '70000'"),
    ("port", "-1", "expected an integer in 0..65535, got '-1'"),
    ("port", "65536", "expected an integer in 0..65535"),
    ("port", "notaport", "expected an integer in 0..65535, got 'notaport'"),
    ("port", "", "expected an integer in 0..65535, got ''"),
    ("http_port", "65536", "expected an integer in 0..65535"),
    ("http_port", "0x10", "expected an integer in 0..65535, got '0x10'"),
    ("feed_cache_bytes", "-1", "expected a size such as 1048576, 64MiB or 1GiB, got '-1'"),
    ("feed_cache_bytes", "-64MiB", "expected a size such as"),
    ("feed_cache_bytes", "12XB", "expected a size such as 1048576, 64MiB or 1GiB, got '12XB'"),
    ("feed_cache_bytes", "64 MiB B", "expected a size such as"),
    ("feed_cache_bytes", "4095", "must be at least 4096 bytes, got 4095"),
    ("data_cache_bytes", "1KiB", "must be at least 4096 bytes, got 1024"),
    ("data_cache_bytes", "0", "must be at least 4096 bytes, got 0"),
    ("max_batch_bytes", "3kb", "must be at least 4096 bytes, got 3000"),
    ("client_write_buffer_bytes", "1k", "must be at least 4096 bytes, got 1024"),
    ("max_frame_bytes", "63KiB", "must be at least 65536 bytes, got 64512"),
    ("max_data_bytes", "0", "must be at least 1 bytes, got 0"),
    ("max_data_bytes", "-5", "expected a size such as"),
    ("server_id", "bad id", "expected letters, digits, '.', '_', ':' or '-' (at most 128)"),
    ("server_id", "-leading-dash", "got '-leading-dash'"),
    ("server_id", "a/b", "got 'a/b'"),
    ("server_id", "é", "got 'é'"),
    ("server_id", "a" * 129, "(at most 128)"),
    ("lock_hashes", "0", "expected an integer in 1..16, got '0'"),
    ("lock_hashes", "17", "expected an integer in 1..16, got '17'"),
    ("lock_table_size", "0", "expected an integer in 1..67108864"),
    ("lock_table_size", str((1 << 26) + 1), "expected an integer in 1..67108864"),
    ("zk_session_timeout", "1.99", "expected a number in 2..300, got '1.99'"),
    ("zk_session_timeout", "0", "expected a number in 2..300, got '0'"),
    ("zk_session_timeout", "300.5", "expected a number in 2..300"),
    ("zk_session_timeout", "nan", "expected a number in 2..300, got 'nan'"),
    ("zk_session_timeout", "soon", "expected a number in 2..300, got 'soon'"),
    ("storage_timeout", "0.05", "expected a number in 0.1..600"),
    ("replace_storage_after", "0.5", "expected 0 (off) or 1..2592000 seconds, got '0.5'"),
    ("replace_storage_after", "-1", "expected a number in 0..2.592e+06"),
    ("max_queue", "0", "expected an integer in 1..10000000"),
    ("max_in_flight", "1025", "expected an integer in 1..1024"),
    ("checkpoint_interval", "0", "expected an integer in 1..4611686018427387904"),
    ("log_level", "LOUD", "expected DEBUG, INFO, WARNING or ERROR, got 'LOUD'"),
    ("log_format", "yaml", "expected text or json, got 'yaml'"),
    ("zk_root", "", "expected a non-empty string, got ''"),
    ("host", " ", "expected a non-empty string, got ' '"),
]
SOURCES = ["flag", "env", "file"]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    BAD_VALUES,
    ids=[f"{n}={v[:20]!r}" for n, v, _ in BAD_VALUES],
)
def test_bad_value_names_the_setting_and_the_source(tmp_path, source, name, value, complaint):
    argv = list(ZK)
    environ = {}
    if source == "flag":
        argv.append(f"{flag(name)}={value}")
        where = flag(name)
    elif source == "env":
        environ[env_var(name)] = value
        where = f"${env_var(name)}"
    else:
        where = toml_file(tmp_path, f"{name} = {toml_string(value)}\n")
        argv += ["--config", where]
    message = config_error(argv, environ)
    assert message.startswith(f"setting {name} (from {where}): "), message
    assert complaint in message


@pytest.mark.parametrize(
    ("line", "name", "complaint"),
    [
        ("feed_cache_bytes = -4096", "feed_cache_bytes", "must be at least 4096 bytes, got -4096"),
        ("max_data_bytes = -1", "max_data_bytes", "must be at least 1 bytes, got -1"),
        ("port = -1", "port", "expected an integer in 0..65535, got -1"),
        ("lock_hashes = 0", "lock_hashes", "expected an integer in 1..16, got 0"),
        ("zk_session_timeout = 1.5", "zk_session_timeout", "expected a number in 2..300"),
    ],
)
def test_bad_toml_numbers(tmp_path, line, name, complaint):
    path = toml_file(tmp_path, line + "\n")
    message = config_error([*ZK, "--config", path])
    assert message.startswith(f"setting {name} (from {path}): ")
    assert complaint in message


def test_the_first_bad_setting_in_schema_order_is_reported():
    message = config_error([*ZK, "--port", "x", "--lock-hashes", "0", "--zk-root="])
    assert message.startswith("setting zk_root (from --zk-root): ")


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--port"], "argument --port: expected one argument"),
        (["stray"], "unrecognized arguments: stray"),
        (["--config"], "argument --config: expected one argument"),
    ],
)
def test_bad_command_lines_are_config_errors(argv, complaint):
    assert complaint in config_error([*ZK, *argv])


# --- good values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4096", 4096),
        ("4KiB", 4 * KiB),
        ("4k", 4 * KiB),
        ("8kb", 8000),
        ("64MiB", 64 * MiB),
        ("64mib", 64 * MiB),
        ("64M", 64 * MiB),
        ("64MB", 64_000_000),
        (" 2 MiB ", 2 * MiB),
        ("1GiB", GiB),
        ("1g", GiB),
        ("1GB", 10**9),
        ("4096b", 4096),
    ],
)
def test_sizes_with_units(value, expected):
    assert load_config([*ZK, f"--feed-cache-bytes={value}"], {}).feed_cache_bytes == expected
    assert load_config(ZK, {"WALTZ_SERVER_DATA_CACHE_BYTES": value}).data_cache_bytes == expected


@pytest.mark.parametrize(
    "server_id",
    ["a", "server-1", "node_7.example.com:55180", "A" * 128, "0", "x-" * 60],
)
def test_good_server_ids(server_id):
    assert load_config([*ZK, f"--server-id={server_id}"], {}).server_id == server_id


@pytest.mark.parametrize("source", ["env", "file"])
def test_server_id_with_a_trailing_newline_is_refused(tmp_path, source):
    argv = list(ZK)
    environ = {}
    if source == "env":
        environ["WALTZ_SERVER_SERVER_ID"] = "node-1\n"
    else:
        argv += ["--config", toml_file(tmp_path, 'server_id = "node-1\\n"\n')]
    message = config_error(argv, environ)
    assert message.startswith("setting server_id ")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("port", "0", 0),
        ("port", "65535", 65535),
        ("http_port", "0", 0),
        ("lock_hashes", "1", 1),
        ("lock_hashes", "16", 16),
        ("lock_table_size", str(1 << 26), 1 << 26),
        ("zk_session_timeout", "2", 2.0),
        ("zk_session_timeout", "300", 300.0),
        ("storage_timeout", "0.1", 0.1),
        ("replace_storage_after", "0", 0.0),
        ("replace_storage_after", "600", 600.0),
        ("max_in_flight", "1024", 1024),
        ("log_level", "warning", "WARNING"),
        ("log_level", "Error", "ERROR"),
        ("log_format", "json", "json"),
        ("log_format", "JSON", "json"),
        ("log_format", "text", "text"),
        ("advertised_host", "waltz-0.waltz.svc", "waltz-0.waltz.svc"),
        ("ready_file", "/tmp/ready.json", "/tmp/ready.json"),
        ("host", "127.0.0.1", "127.0.0.1"),
        ("zk_root", "/a/b", "/a/b"),
    ],
)
def test_bounds_and_good_values(name, value, expected):
    assert getattr(load_config([*ZK, f"{flag(name)}={value}"], {}), name) == expected
    assert getattr(load_config(ZK, {env_var(name): value}), name) == expected


# --- checks across settings ---------------------------------------------------------------------

SMALL = ["--max-frame-bytes", "64KiB", "--max-batch-bytes", "32KiB"]


def test_max_data_bytes_may_use_all_but_the_append_overhead_of_a_frame():
    largest = 64 * KiB - MAX_APPEND_OVERHEAD
    config = load_config([*ZK, *SMALL, "--max-data-bytes", str(largest)], {})
    assert (config.max_frame_bytes, config.max_data_bytes) == (64 * KiB, largest)


def test_max_data_bytes_must_leave_room_in_a_frame():
    too_big = 64 * KiB - MAX_APPEND_OVERHEAD + 1
    message = config_error([*ZK, *SMALL, "--max-data-bytes", str(too_big)])
    assert message == (
        f"setting max_data_bytes ({too_big}) must leave room for the rest of an append "
        f"({MAX_APPEND_OVERHEAD} bytes at most) within max_frame_bytes (65536)"
    )


def test_lowering_only_max_frame_bytes_trips_the_data_check():
    message = config_error([*ZK, "--max-frame-bytes", "1MiB"])
    assert message.startswith("setting max_data_bytes (16777216) must leave room")
    assert "max_frame_bytes (1048576)" in message


def test_max_data_bytes_equal_to_max_frame_bytes_is_refused():
    message = config_error([*ZK, "--max-frame-bytes", "16MiB"])
    assert "max_data_bytes (16777216)" in message and "max_frame_bytes (16777216)" in message


def test_max_batch_bytes_may_be_half_of_max_frame_bytes():
    config = load_config([*ZK, *SMALL, "--max-data-bytes", "1000"], {})
    assert config.max_batch_bytes == 32 * KiB


def test_max_batch_bytes_over_half_of_max_frame_bytes():
    argv = [*ZK, "--max-frame-bytes", "64KiB", "--max-data-bytes", "1000"]
    message = config_error([*argv, "--max-batch-bytes", "32769"])
    assert message == "setting max_batch_bytes must be at most half of max_frame_bytes"


def test_max_frame_bytes_must_fit_32_bits():
    assert load_config([*ZK, "--max-frame-bytes", str(2**32 - 1)], {}).max_frame_bytes == (
        2**32 - 1
    )
    message = config_error([*ZK, "--max-frame-bytes", "4GiB"])
    assert message == "setting max_frame_bytes: must fit the 32-bit frame length"


def test_cross_checks_apply_whatever_the_source(tmp_path):
    path = toml_file(tmp_path, 'max_frame_bytes = "64KiB"\nmax_batch_bytes = 32768\n')
    message = config_error(["--config", path], {"WALTZ_SERVER_ZOOKEEPER": "z"})
    assert message.startswith("setting max_data_bytes (16777216) must leave room")


def test_an_append_the_config_allows_fits_in_a_frame():
    largest = 64 * KiB - MAX_APPEND_OVERHEAD
    config = load_config([*ZK, *SMALL, "--max-data-bytes", str(largest)], {})
    locks = tuple(range(MAX_LOCKS))
    message = AppendRequest(ReqId(1, 2, 3, 4), 0, locks, locks, locks, 0, b"x" * largest)
    encoded = message.encode()
    # The message decoder, under this config's data limit, accepts the body...
    assert (
        decode_client_request(ClientMessageType.APPEND_REQUEST, encoded[5:], config.max_data_bytes)
        == message
    )
    # ...so the frame decoder, under this config's frame limit, should accept the frame.
    assert len(FrameDecoder(config.max_frame_bytes).feed(encoded)) == 1


# --- advertised() -------------------------------------------------------------------------------


@pytest.fixture
def host_name(monkeypatch) -> str:
    monkeypatch.setattr("waltz_server.config.socket.gethostname", lambda: "node-7.example")
    return "node-7.example"


def test_advertised_host_wins(host_name):
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        config = load_config([*ZK, "--host", host, "--advertised-host", "waltz-0.svc"], {})
        assert config.advertised() == "waltz-0.svc"


@pytest.mark.parametrize("host", ["127.0.0.1", "10.1.2.3", "waltz.local", "::1"])
def test_advertised_is_a_specific_listen_host(host_name, host):
    assert load_config([*ZK, "--host", host], {}).advertised() == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_advertised_is_the_host_name_for_a_wildcard_listen_host(host_name, host):
    assert load_config([*ZK, "--host", host], {}).advertised() == "node-7.example"


def test_advertised_by_default_is_the_host_name(host_name):
    assert load_config(ZK, {}).advertised() == "node-7.example"


def test_advertised_with_the_real_host_name():
    assert load_config(ZK, {}).advertised() == socket.gethostname()


def test_advertised_host_from_the_environment(host_name):
    config = load_config(ZK, {"WALTZ_SERVER_ADVERTISED_HOST": "from-env"})
    assert config.advertised() == "from-env"


def test_the_registration_names_the_tls_name_clients_check(host_name, tmp_path):
    """Without advertised_tls_name clients check the advertised host; with it (TLS only)
    the registration carries it beside the address."""
    from waltz_client.tools.local.certs import local_pki

    plain = load_config([*ZK, "--advertised-host", "10.1.2.3"], {}).registration("s", 1, 2)
    assert (plain.endpoint, plain.tls_name, plain.verified_name) == ("10.1.2.3:1", "", "10.1.2.3")
    files = local_pki(str(tmp_path), {"waltz-server": ["waltz.prod.svc"]})["waltz-server"]
    tls = [f"--tls-cert={files.cert}", f"--tls-key={files.key}", f"--tls-ca={files.ca}"]
    env = {"WALTZ_SERVER_ADVERTISED_HOST": "10.1.2.3"}
    env["WALTZ_SERVER_ADVERTISED_TLS_NAME"] = "waltz.prod.svc"
    named = load_config([*ZK, *tls], env).registration("s", 1, 2)
    assert (named.endpoint, named.verified_name) == ("10.1.2.3:1", "waltz.prod.svc")
    with pytest.raises(ConfigError, match="setting advertised_tls_name: needs tls_cert"):
        load_config([*ZK, "--advertised-tls-name", "waltz.prod.svc"], {})
    with pytest.raises(ConfigError, match="setting advertised_tls_name"):
        load_config([*ZK, *tls, "--advertised-tls-name", "a b"], {})


# --- the waltz-server command -------------------------------------------------------------------


def run_server(args: list[str]) -> subprocess.CompletedProcess:
    """Run waltz-server expecting it to exit by itself on a bad setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_SERVER_")}
    return subprocess.run(
        [sys.executable, "-m", "waltz_server.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_bad_port_exits_2_with_one_error_line():
    result = run_server(["--port", "notaport", "--zookeeper", "x"])
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got:\n{result.stderr}"
    assert lines[0] == (
        "waltz-server: error: setting port (from --port): "
        "expected an integer in 0..65535, got 'notaport'"
    )
    assert result.stdout == ""


def test_connection_limits_are_settings():
    from waltz_server.server import WaltzServer

    config = load_config(
        [
            *ZK,
            "--max-connections",
            "7",
            "--max-feeds-per-connection",
            "3",
            "--handshake-timeout",
            "2.5",
            "--max-read-bytes-per-connection",
            "2MiB",
            "--max-feeds-per-partition",
            "9",
        ],
        {},
    )
    server = WaltzServer(config, coordinator=None)  # type: ignore[arg-type]
    limits = server.connection_limits
    assert (limits.max_feeds, limits.max_read_bytes) == (3, 2 * MiB)
    assert (limits.peer.max_connections, limits.peer.handshake_timeout) == (7, 2.5)
    assert server.partition_settings.max_feeds == 9
    with pytest.raises(ConfigError, match="handshake_timeout"):
        load_config([*ZK, "--handshake-timeout", "0"], {})
