"""``--log-format json`` on real daemons: every line a storage node and a server write is
one JSON object with the time, level, logger and message, and the server's lines about a
partition carry its ID and store session, and those about a client connection the
client's address, with no change to the log calls."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest

from waltz_client import (
    BlockingWaltzClient,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
    WaltzClientConfig,
)

pytestmark = pytest.mark.timeout(180)

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
KEYS = {"time", "level", "logger", "message"}
OPTIONAL = {"exception", "stack", "partition", "session", "peer"}
JSON = ["--log-format", "json"]


class Put(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(1)
        builder.set_data(b"logged")
        return True


class Keep(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction) -> None:
        self.seen.append(transaction.header)


def json_lines(path: str) -> list[dict]:
    text = Path(path).read_text()
    assert text.strip(), f"{path} is empty"
    lines = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            parsed = json.loads(line)
        except ValueError:
            pytest.fail(f"{path}:{n} is not JSON: {line!r}")
        assert isinstance(parsed, dict), f"{path}:{n}: {line!r}"
        assert KEYS <= set(parsed) <= KEYS | OPTIONAL, f"{path}:{n}: {line!r}"
        assert RFC3339_MS.match(parsed["time"]), f"{path}:{n}: {line!r}"
        assert parsed["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        lines.append(parsed)
    return lines


def wait_for_line(path: str, found, what: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        for line in json_lines(path):
            if found(line):
                return line
        if time.monotonic() > deadline:
            pytest.fail(f"no line in {path} {what}:\n{Path(path).read_text()[-4000:]}")
        time.sleep(0.1)


def test_every_line_of_both_daemons_is_json_with_the_partition_session_and_peer(
    make_cluster,
) -> None:
    cluster = make_cluster(storages=3, storage_args=JSON, server_args=JSON)
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root)
    with BlockingWaltzClient(config, Keep()) as client:
        assert client.submit(Put()).committed
        client.flush()
    server = cluster.servers[0]

    # The partition's recovery, logged from its session loop's task: the partition and
    # the store session it opened, though the call names neither as a field.
    recovered = wait_for_line(
        server.log_path,
        lambda line: "recovered to high-water mark" in line["message"],
        "about the partition's recovery",
    )
    assert recovered["partition"] == 0
    assert isinstance(recovered["session"], int) and recovered["session"] >= 0
    assert f"session {recovered['session']} " in recovered["message"]

    # A client that says nonsense: the line about it carries its address as ``peer``.
    with socket.create_connection(("127.0.0.1", server.ready["port"]), timeout=10) as sock:
        sock.sendall(b"not a hello!")  # HANDSHAKE_BYTES of garbage
        host, port = sock.getsockname()[:2]
        local = f"{host}:{port}"
        sock.settimeout(10)
        assert sock.recv(1024) is not None  # the server answers or closes
    refused = wait_for_line(
        server.log_path,
        lambda line: line.get("peer") == local,
        f"with peer {local}",
    )
    assert refused["level"] == "WARNING"
    assert local in refused["message"]

    # The storage nodes: JSON as well, their partition's lines with its ID.
    for storage in cluster.storages:
        lines = json_lines(storage.log_path)
        assert any(line.get("partition") == 0 for line in lines), storage.log_path
    # And every line the server wrote, start-up to now.
    lines = json_lines(server.log_path)
    assert any(line["logger"].startswith("waltz_server") for line in lines)
