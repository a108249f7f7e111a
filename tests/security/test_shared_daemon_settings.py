"""The settings both daemons have, declared once in ``waltz_client.runtime`` (the listening
address, the frame limit, the listener's TLS, the ready file and the log level): the same
names, defaults, help and checks in each daemon, but for the words that name what the
daemon serves, and the same refusals across settings.
"""

from __future__ import annotations

import pytest

from waltz_client.runtime.settings import ConfigError, Setting
from waltz_server import config as server_config
from waltz_storage import config as storage_config

CLUSTER_KEY = "00000000-0000-4000-8000-000000000001"

# (name, default, help) of each shared setting, in the order each daemon lists them.
SERVER = [
    ("host", "0.0.0.0", "address to listen on"),
    ("port", 55180, "client port (0: any free port)"),
    ("http_port", 55181, "health and metrics port (0: any free port)"),
    ("max_frame_bytes", "64MiB", "largest frame accepted"),
    ("tls_cert", "", "PEM certificate: serve clients over TLS"),
    ("tls_key", "", "PEM private key of tls_cert"),
    (
        "http_tls",
        False,
        "serve the HTTP port (metrics, probes) over HTTPS with tls_cert (no client cert asked)",
    ),
    ("tls_ca", "", "PEM CA bundle that clients' certificates must chain to"),
    ("tls_verify_peer", True, "require and verify a certificate from each client (mutual TLS)"),
    ("ready_file", "", "write the bound ports here (JSON) once serving"),
    ("log_level", "INFO", "DEBUG, INFO, WARNING or ERROR"),
]
STORAGE = [
    ("host", "0.0.0.0", "address to listen on"),
    ("port", 55280, "protocol port (0: any free port)"),
    ("http_port", 55281, "health and metrics port (0: any free port)"),
    ("max_frame_bytes", "64MiB", "largest frame accepted"),
    ("tls_cert", "", "PEM certificate: serve the protocol port over TLS"),
    ("tls_key", "", "PEM private key of tls_cert"),
    (
        "http_tls",
        False,
        "serve the HTTP port (metrics, probes) over HTTPS with tls_cert (no client cert asked)",
    ),
    ("tls_ca", "", "PEM CA bundle that servers' certificates must chain to"),
    ("tls_verify_peer", True, "require and verify a certificate from each peer (mutual TLS)"),
    ("ready_file", "", "write the bound ports here (JSON) once serving"),
    ("log_level", "INFO", "DEBUG, INFO, WARNING or ERROR"),
]
SHARED = [name for name, _, _ in SERVER]


def shared(settings: tuple[Setting, ...]) -> list[Setting]:
    return [s for s in settings if s.name in SHARED]


def test_each_daemon_declares_the_shared_settings_with_its_own_words() -> None:
    for schema, expected in ((server_config.SCHEMA, SERVER), (storage_config.SCHEMA, STORAGE)):
        found = [(s.name, s.default, s.help) for s in shared(schema.settings)]
        assert found == expected, schema.prog
        assert len({s.name for s in schema.settings}) == len(schema.settings), schema.prog


@pytest.mark.parametrize(
    "value", ["0", "65535", "65536", "-1", "x", "true", "", "64KiB", "4GiB", "1e3", "::1", "DEBUG"]
)
def test_the_shared_settings_check_values_alike_in_both_daemons(value: str) -> None:
    def outcome(setting: Setting) -> object:
        try:
            return setting.parse(value)
        except ValueError as e:
            return f"refused: {e}"

    pairs = zip(
        shared(server_config.SCHEMA.settings), shared(storage_config.SCHEMA.settings), strict=True
    )
    for ours, theirs in pairs:
        assert outcome(ours) == outcome(theirs), ours.name


def load_server(*argv: str) -> object:
    return server_config.load_config(["--zookeeper", "zk:2181", *argv], {})


def load_storage(*argv: str, directory: str) -> object:
    base = ["--directory", directory, "--cluster-key", CLUSTER_KEY, "--num-partitions", "1"]
    return storage_config.load_config([*base, *argv], {})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--http-tls", "true"], "setting http_tls: needs tls_cert and tls_key"),
        (
            ["--max-frame-bytes", "4GiB"],
            "setting max_frame_bytes: must fit the 32-bit frame length",
        ),
        (["--tls-cert", "/nonexistent/cert.pem"], "setting tls_key: needed with tls_cert"),
        (["--tls-ca", "/ca.pem"], "setting tls_cert: a TLS listener needs a certificate and key"),
    ],
)
def test_both_daemons_refuse_the_same_way(tmp_path, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as server:
        load_server(*argv)
    with pytest.raises(ConfigError) as storage:
        load_storage(*argv, directory=str(tmp_path))
    assert str(server.value) == str(storage.value) == message
