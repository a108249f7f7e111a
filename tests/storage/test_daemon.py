"""The ``waltz-storage`` daemon: settings (file, environment, flags), HTTP health and metrics.

Every bad or missing setting exits with status 2 and exactly one stderr line
``waltz-storage: error: ...`` naming the setting. Precedence is checked by
what the running process does (which ready file it writes, which partitions
it serves), not by reading its configuration back.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import StorageFailure
from waltz_client.wire.storage_messages import StorageError

T = TypeVar("T")
SESSION = 4
KEY = "6d2f1a52-3c1e-4f7a-9b0e-7a3f5c2d9e10"


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_STORAGE_")}
    env.update(extra)
    return env


def run_daemon(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run waltz-storage expecting it to exit by itself (a bad setting); never leaves it running."""
    return subprocess.run(
        [sys.executable, "-m", "waltz_storage.main", *args],
        capture_output=True,
        text=True,
        timeout=20,
        env=child_env(**(env or {})),
        stdin=subprocess.DEVNULL,
    )


def assert_setting_error(result: subprocess.CompletedProcess, *names: str) -> str:
    """Exit status 2 and exactly one stderr line, the error, naming every one of ``names``."""
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, f"expected exactly one stderr line, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("waltz-storage: error:"), line
    for name in names:
        assert name in line, f"{name!r} not named in: {line}"
    return line


def good_args(tmp_path: Path, **overrides: str | None) -> list[str]:
    """Flags of a valid node; ``overrides`` replace (or with None, drop) single flags."""
    settings = {
        "directory": str(tmp_path / "data"),
        "cluster-key": KEY,
        "num-partitions": "4",
        "partitions": "0-3",
        "host": "127.0.0.1",
        "port": "0",
        "http-port": "0",
        "ready-file": str(tmp_path / "ready.json"),
    }
    settings.update(overrides)
    args = []
    for flag, value in settings.items():
        if value is not None:
            args += [f"--{flag}", value]
    return args


# --- bad settings --------------------------------------------------------------------------

BAD_FLAGS = {
    # case: (flag overrides, words the error line must name)
    "missing_directory": ({"directory": None}, ["directory"]),
    "missing_cluster_key": ({"cluster-key": None}, ["cluster_key"]),
    "missing_num_partitions": ({"num-partitions": None}, ["num_partitions"]),
    "port_out_of_range": ({"port": "70000"}, ["port", "70000"]),
    "port_negative": ({"port": "-1"}, ["port"]),
    "port_not_a_number": ({"port": "http"}, ["port", "http"]),
    "http_port_out_of_range": ({"http-port": "65536"}, ["http_port"]),
    "bad_uuid": ({"cluster-key": "not-a-uuid"}, ["cluster_key", "not-a-uuid"]),
    "short_uuid": ({"cluster-key": KEY[:-1]}, ["cluster_key"]),
    "partitions_reversed_range": ({"partitions": "5-2"}, ["partitions", "5-2"]),
    "partitions_past_count": ({"partitions": "0-99"}, ["partitions", "99"]),
    "partitions_not_numbers": ({"partitions": "a-b"}, ["partitions"]),
    "num_partitions_zero": ({"num-partitions": "0"}, ["num_partitions"]),
    "segment_bytes_not_a_size": ({"segment-bytes": "12XB"}, ["segment_bytes"]),
    "segment_bytes_too_small": ({"segment-bytes": "100"}, ["segment_bytes"]),
    "queue_max_requests_zero": ({"queue-max-requests": "0"}, ["queue_max_requests"]),
    "log_level": ({"log-level": "LOUD"}, ["log_level"]),
    "log_format": ({"log-format": "yaml"}, ["log_format", "yaml", "text or json"]),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_or_missing_flag_exits_2_with_one_line(tmp_path, case):
    overrides, names = BAD_FLAGS[case]
    result = run_daemon(good_args(tmp_path, **overrides))
    assert_setting_error(result, *names)
    assert not (tmp_path / "ready.json").exists()


def test_unknown_flag_exits_2_with_one_line(tmp_path):
    result = run_daemon([*good_args(tmp_path), "--no-such-setting", "1"])
    assert_setting_error(result, "--no-such-setting")


@pytest.mark.parametrize(
    ("variable", "value", "names"),
    [
        ("WALTZ_STORAGE_PORT", "abc", ["port", "WALTZ_STORAGE_PORT", "abc"]),
        (
            "WALTZ_STORAGE_NUM_PARTITIONS",
            "four",
            ["num_partitions", "WALTZ_STORAGE_NUM_PARTITIONS"],
        ),
        ("WALTZ_STORAGE_CLUSTER_KEY", "xyz", ["cluster_key", "WALTZ_STORAGE_CLUSTER_KEY"]),
    ],
)
def test_bad_environment_variable_exits_2_naming_it(tmp_path, variable, value, names):
    flag = variable.removeprefix("WALTZ_STORAGE_").lower().replace("_", "-")
    result = run_daemon(good_args(tmp_path, **{flag: None}), env={variable: value})
    assert_setting_error(result, *names)


def test_unknown_key_in_config_file(tmp_path):
    config = tmp_path / "storage.toml"
    config.write_text('directory = "x"\nprot = 5\n')
    result = run_daemon(["--config", str(config), *good_args(tmp_path)])
    assert_setting_error(result, "prot", str(config))


def test_bad_value_in_config_file_names_setting_and_file(tmp_path):
    config = tmp_path / "storage.toml"
    config.write_text('http_port = "web"\n')
    result = run_daemon(["--config", str(config), *good_args(tmp_path, **{"http-port": None})])
    assert_setting_error(result, "http_port", str(config))


def test_invalid_toml_config_file(tmp_path):
    config = tmp_path / "storage.toml"
    config.write_text("port = = 5\n")
    result = run_daemon(["--config", str(config), *good_args(tmp_path)])
    assert_setting_error(result, "--config", str(config))


@pytest.mark.parametrize("kind", ["missing", "directory", "no_permission"])
def test_unreadable_config_file(tmp_path, kind):
    config = tmp_path / "storage.toml"
    if kind == "directory":
        config.mkdir()
    elif kind == "no_permission":
        if os.geteuid() == 0:
            pytest.skip("root reads files whatever their mode")
        config.write_text("port = 0\n")
        config.chmod(0)
    result = run_daemon(["--config", str(config), *good_args(tmp_path)])
    assert_setting_error(result, "--config", str(config))


def test_cluster_key_mismatch_with_existing_directory_exits_2(storage_factory, tmp_path):
    node = storage_factory()
    assert node.stop() == 0
    other = uuid.UUID("0badc0de-0000-4000-8000-000000000000")
    result = run_daemon(
        good_args(tmp_path, directory=str(node.directory), **{"cluster-key": str(other)})
    )
    assert_setting_error(result, key_fingerprint(node.key), key_fingerprint(other))
    assert str(node.key)[:8] not in result.stderr
    # The directory still belongs to the original key: the original node starts again.
    node.start()
    assert node.get("/readyz")[0] == 200


def test_fewer_partitions_than_the_existing_directory_exits_2(storage_factory, tmp_path):
    """Partitions never shrink; more than the directory has grows it
    (test_storage_partition_growth)."""
    node = storage_factory()
    assert node.stop() == 0
    args = good_args(
        tmp_path,
        directory=str(node.directory),
        **{"cluster-key": str(node.key), "num-partitions": "2", "partitions": "0-1"},
    )
    line = assert_setting_error(run_daemon(args), "2")
    assert "4" in line


def test_directory_that_is_a_file_names_the_setting(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    result = run_daemon(good_args(tmp_path, directory=str(path)))
    line = assert_setting_error(result, str(path))
    # The path alone does not say which setting is wrong (a path can be any setting's).
    assert "directory" in line.replace(str(path), "<path>"), line


@pytest.mark.parametrize("which", ["port", "http-port"])
def test_port_in_use_exits_2_naming_the_port(tmp_path, which):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        number = busy.getsockname()[1]
        result = run_daemon(good_args(tmp_path, **{which: str(number), "log-level": "WARNING"}))
    line = assert_setting_error(result)
    assert str(number) in line, f"the busy port {number} is not named in: {line}"


# --- precedence: file < environment < flags ---------------------------------------------


def test_flags_override_environment_override_file(storage_factory, tmp_path):
    file_ready = tmp_path / "from-file.json"
    env_ready = tmp_path / "from-env.json"
    config = tmp_path / "storage.toml"
    config.write_text(
        f'directory = "{tmp_path / "data"}"\n'
        f'cluster_key = "{KEY}"\n'
        "num_partitions = 4\n"
        'partitions = "0"\n'
        'host = "127.0.0.1"\n'
        "port = 0\n"
        "http_port = 0\n"
        f'ready_file = "{file_ready}"\n'
        'log_level = "WARNING"\n'
    )
    env = {"WALTZ_STORAGE_PARTITIONS": "0-1", "WALTZ_STORAGE_READY_FILE": str(env_ready)}

    def served(node) -> list[int]:
        status, body = node.get("/readyz")
        assert status == 200, body
        return json.loads(body)["partitions"]

    # All three: the flag's partitions, the environment's ready file.
    node = storage_factory(
        key=uuid.UUID(KEY),
        raw_args=["--config", str(config), "--partitions", "2-3"],
        env=env,
        ready_file=env_ready,
    )
    assert served(node) == [2, 3]
    assert not file_ready.exists()

    async def holds(partition: int) -> bool:
        async with await node.client() as c:
            try:
                await c.max_transaction_id(SESSION, partition)
            except StorageFailure as e:
                assert e.error == StorageError.PARTITION_NOT_FOUND
                return False
            return True

    assert [run(holds(p)) for p in range(4)] == [False, False, True, True]
    assert node.stop() == 0

    # File and environment: the environment wins.
    node = storage_factory(raw_args=["--config", str(config)], env=env, ready_file=env_ready)
    assert served(node) == [0, 1]
    assert node.stop() == 0

    # The file alone.
    node = storage_factory(raw_args=["--config", str(config)], ready_file=file_ready)
    assert served(node) == [0]
    assert node.stop() == 0
    # log_level WARNING from the file: no INFO lines were logged.
    assert " INFO " not in node.log()

    # A bad value in the file is refused even when a flag overrides it: the file is
    # wrong, and would take effect as soon as the flag goes.
    config.write_text(config.read_text() + 'segment_bytes = "huge"\n')
    refused = subprocess.run(
        [
            str(Path(sys.executable).parent / "waltz-storage"),
            *("--config", str(config), "--segment-bytes", "1MiB"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert "segment_bytes" in refused.stderr and str(config) in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


# --- HTTP: health, readiness, metrics ---------------------------------------------------


def scrape(node) -> dict[tuple[str, frozenset], float]:
    status, text = node.get("/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def sample(samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k[0] for k in samples)[:50]}"
    return samples[key]


def test_healthz_and_readyz(storage_node):
    status, body = storage_node.get("/healthz")
    assert status == 200
    assert json.loads(body)["status"] == "ok"
    status, body = storage_node.get("/readyz")
    assert status == 200
    ready = json.loads(body)
    assert ready["ready"] is True
    assert ready["partitions"] == [0, 1, 2, 3]
    assert ready["unavailable_partitions"] == {}
    assert storage_node.get("/no-such-page")[0] == 404


def test_metrics_follow_appends(storage_node):
    rng = random.Random(6)
    data = [rng.randbytes(rng.randrange(100, 2000)) for _ in range(13)]
    before = scrape(storage_node)
    assert sample(before, "waltz_storage_partition_max_transaction_id", partition="0") == -1

    async def go():
        async with await storage_node.client() as c:
            recs = [Record(i, ReqId(1, 1, 0, i), 0, data[i]) for i in range(10)]
            await c.append(SESSION, 0, recs[:5])
            await c.append(SESSION, 0, recs[5:])
            await c.append(
                SESSION, 2, [Record(i, ReqId(1, 1, 2, i), 0, data[10 + i]) for i in range(3)]
            )
            await c.set_low_water_mark(SESSION, 0, 6)
            with pytest.raises(StorageFailure):
                await c.max_transaction_id(SESSION - 1, 0)

    run(go())
    m = scrape(storage_node)
    assert sample(m, "waltz_storage_partition_max_transaction_id", partition="0") == 9
    assert sample(m, "waltz_storage_partition_max_transaction_id", partition="2") == 2
    assert sample(m, "waltz_storage_partition_max_transaction_id", partition="1") == -1
    assert sample(m, "waltz_storage_appended_records_total", partition="0") == 10
    assert sample(m, "waltz_storage_appended_records_total", partition="2") == 3
    assert sample(m, "waltz_storage_appended_bytes_total", partition="0") == sum(
        map(len, data[:10])
    )
    fsyncs = sample(m, "waltz_storage_fsyncs_total", partition="0")
    assert 1 <= fsyncs <= 2
    assert sample(m, "waltz_storage_fsync_seconds_count", partition="0") == fsyncs
    assert sample(m, "waltz_storage_fsync_seconds_bucket", partition="0", le="+Inf") == fsyncs
    assert sample(m, "waltz_storage_requests_total", type="AppendRequest") == 3
    assert sample(m, "waltz_storage_requests_total", type="OpenRequest") >= 1
    assert sample(m, "waltz_storage_requests_total", type="SetLowWaterMarkRequest") == 1
    assert sample(m, "waltz_storage_errors_total", error="SESSION_FENCED") == 1
    assert sample(m, "waltz_storage_partition_session_id", partition="0") == SESSION
    assert sample(m, "waltz_storage_partition_low_water_mark", partition="0") == 6
    assert sample(m, "waltz_storage_partition_available", partition="3") == 1
    assert sample(m, "waltz_storage_partition_size_bytes", partition="0") > sum(map(len, data[:10]))
    free, size = (
        sample(m, "waltz_storage_disk_free_bytes"),
        sample(m, "waltz_storage_disk_size_bytes"),
    )
    assert 0 < free <= size
    # The exposition text itself, as a scraper sees it.
    text = storage_node.get("/metrics")[1]
    assert 'waltz_storage_partition_max_transaction_id{partition="0"} 9.0' in text


def _corrupt_both_slots(control_file: Path, partition: int) -> None:
    """Garbage over both 48-byte partition-info structs of ``partition`` (docs/on-disk.md)."""
    header, entry, info = 128, 100, 48
    rng = random.Random(partition)
    with open(control_file, "r+b") as f:
        for slot in (0, 1):
            f.seek(header + entry * partition + 4 + info * slot)
            f.write(rng.randbytes(info))


def test_partition_with_both_control_structs_corrupt_is_unavailable(storage_node, waltz):
    rng = random.Random(10)
    recs = {
        p: [Record(i, ReqId(1, 1, p, i), 0, rng.randbytes(64)) for i in range(5)] for p in (0, 1)
    }

    async def write():
        async with await storage_node.client() as c:
            for p, batch in recs.items():
                await c.append(SESSION, p, batch)

    run(write())
    assert storage_node.stop() == 0
    _corrupt_both_slots(storage_node.directory / "waltz-storage.ctl", 1)
    storage_node.start()

    status, body = storage_node.get("/readyz")
    assert status == 503, body
    ready = json.loads(body)
    assert ready["ready"] is False
    assert list(ready["unavailable_partitions"]) == ["1"]
    assert "partition 1" in ready["unavailable_partitions"]["1"]
    assert storage_node.get("/healthz")[0] == 200  # restarting would not help: stay live

    async def check():
        async with await storage_node.client() as c:
            # Partition 0 serves reads and appends.
            assert await c.records(SESSION, 0, 0, 10) == RecordBatch.from_records(recs[0])
            await c.append(SESSION, 0, [Record(5, ReqId(1, 1, 0, 5), 0, b"more")])
            assert await c.max_transaction_id(SESSION, 0) == 5
            # Partition 1 refuses everything, saying why.
            for call in (
                c.max_transaction_id(SESSION, 1),
                c.append(SESSION, 1, [Record(5, ReqId(1, 1, 1, 5), 0, b"x")]),
                c.record(SESSION, 1, 0),
                c.last_session_info(SESSION, 1),
            ):
                with pytest.raises(StorageFailure) as info:
                    await call
                assert info.value.error == StorageError.PARTITION_UNAVAILABLE
                assert "partition 1" in info.value.message

    run(check())
    m = scrape(storage_node)
    assert sample(m, "waltz_storage_partition_available", partition="1") == 0
    assert sample(m, "waltz_storage_partition_available", partition="0") == 1
    assert "partition 1" in storage_node.log()
    # The offline tool agrees: partition 1's structs fail their checksums.
    assert storage_node.stop() == 0
    result = waltz("storage", "control", str(storage_node.directory))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "partition 1 slot 0: CHECKSUM MISMATCH" in result.stdout
    assert "partition 1 slot 1: CHECKSUM MISMATCH" in result.stdout


# --- reading the cluster from ZooKeeper --------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zookeeper_mode_rejects_explicit_partitions_and_bad_addresses(tmp_path: Path) -> None:
    base = ["--directory", str(tmp_path / "d"), "--zookeeper", "127.0.0.1:1"]
    assert_setting_error(run_daemon([*base, "--partitions", "0-1"]), "partitions", "zookeeper")
    assert_setting_error(
        run_daemon([*base, "--advertised-address", "nohost"]), "advertised_address"
    )
    # Without ZooKeeper the key and the partition count are required, and say so.
    line = assert_setting_error(run_daemon(["--directory", str(tmp_path / "d")]), "cluster_key")
    assert "zookeeper" in line


def test_zookeeper_mode_waits_for_the_cluster_then_serves_its_partitions(
    tmp_path: Path, zookeeper, zk_root: str
) -> None:
    from waltz_client.cluster.admin import create_cluster
    from waltz_client.cluster.zk import close, connect
    from waltz_client.wire.storage_client import StorageClient

    port = free_port()
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "waltz_storage.main",
            "--directory",
            str(tmp_path / "d"),
            "--zookeeper",
            zookeeper.connect_string,
            "--zk-root",
            zk_root,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--http-port",
            "0",
            "--ready-file",
            str(ready),
        ],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        assert proc.poll() is None and not ready.exists()  # waiting for CreateCluster
        zk = connect(zookeeper.connect_string)
        try:
            created = create_cluster(zk, zk_root, "t", 3, 1, [f"127.0.0.1:{port}"])
        finally:
            close(zk)
        end = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < end, "never became ready"
            time.sleep(0.05)

        async def check() -> list[int]:
            async with await StorageClient.connect("127.0.0.1", port) as client:
                await client.open(created.params.key, 3)
                # No session yet: a newer one needs the metadata's record (test_fencing).
                return [await client.max_transaction_id(-1, p) for p in range(3)]

        assert run(check()) == [-1, -1, -1]
        assert json.loads(ready.read_text())["advertised_address"] == f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_zookeeper_mode_refuses_a_different_configured_key(
    tmp_path: Path, zookeeper, zk_root: str
) -> None:
    from waltz_client.cluster.admin import create_cluster
    from waltz_client.cluster.zk import close, connect

    zk = connect(zookeeper.connect_string)
    try:
        create_cluster(zk, zk_root, "t", 2, 1, ["127.0.0.1:9"])
    finally:
        close(zk)
    result = run_daemon(
        [
            "--directory",
            str(tmp_path / "d"),
            "--zookeeper",
            zookeeper.connect_string,
            "--zk-root",
            zk_root,
            "--cluster-key",
            KEY,
            "--log-level",
            "ERROR",
        ]
    )
    assert_setting_error(result, "cluster_key", key_fingerprint(uuid.UUID(KEY)))
