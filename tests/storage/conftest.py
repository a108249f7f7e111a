"""Fixtures that start real ``waltz-storage`` processes (real sockets, real files).

``storage_node`` starts one node holding partitions 0-3 of a 4-partition
cluster in ``tmp_path``; ``storage_factory`` starts more (other settings, the
same directory again). Every process started here is killed at teardown, and
teardown fails the test if one is still running afterwards. ``waltz`` runs
the admin command in a child process. (Test modules do not import this file:
helpers reach them as fixtures or as methods of ``StorageProcess``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from waltz_client.wire.storage_client import StorageClient

HOST = "127.0.0.1"
READY_TIMEOUT = 20.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via $http_proxy


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child process, without any WALTZ_STORAGE_* of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_STORAGE_")}
    env.update(extra)
    return env


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET on the node's HTTP port; error statuses are returned, not raised."""
    try:
        with _NO_PROXY.open(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def waltz_cli(
    *args: str,
    cwd: str | Path | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``waltz ...`` (the admin command) in a child process; ``env``: variables set
    on top of the clean environment."""
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**clean_env(), **(env or {})},
    )


class StorageProcess:
    """One real storage process; ``restart`` runs a new one on the same directory and ports 0."""

    def __init__(
        self,
        base: Path,
        directory: Path,
        key: uuid.UUID,
        num_partitions: int,
        partitions: str,
        extra: list[str],
        env: dict[str, str],
        raw_args: list[str] | None = None,
        ready_file: Path | None = None,
    ) -> None:
        self.base = base
        self.directory = directory
        self.key = key
        self.num_partitions = num_partitions
        self.partitions = partitions
        self.extra = extra
        self.env = env
        self.host = HOST
        self.port = 0
        self.http_port = 0
        self.proc: subprocess.Popen | None = None
        self.raw_args = raw_args
        self.ready_file = ready_file or base / "ready.json"
        self.log_path = base / "storage.log"
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        if self.raw_args is not None:  # the caller's settings only (config tests)
            return [sys.executable, "-m", "waltz_storage.main", *self.raw_args]
        return [
            sys.executable,
            "-m",
            "waltz_storage.main",
            "--directory",
            str(self.directory),
            "--cluster-key",
            str(self.key),
            "--num-partitions",
            str(self.num_partitions),
            "--partitions",
            self.partitions,
            "--host",
            HOST,
            "--port",
            "0",
            "--http-port",
            "0",
            "--ready-file",
            str(self.ready_file),
            *self.extra,
        ]

    def start(self) -> StorageProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.ready_file.unlink(missing_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"storage process exited with status {self.proc.returncode} before it "
                    f"was ready; log:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"storage process not ready in {READY_TIMEOUT} s:\n{self.log()}")
            time.sleep(0.01)
        info = json.loads(self.ready_file.read_text())
        assert info["pid"] == self.proc.pid
        self.port = info["port"]
        self.http_port = info["http_port"]
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 20.0) -> int | None:
        """Send ``sig`` and wait for the exit; returns the exit status (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode

    def stop(self) -> int | None:
        """A clean stop (SIGTERM); the node should exit 0."""
        return self.kill(signal.SIGTERM)

    def restart(self, sig: int = signal.SIGTERM) -> StorageProcess:
        self.kill(sig)
        return self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.http_port, path)

    async def client(self, *, open_: bool = True) -> StorageClient:
        """A connected StorageClient, opened with this node's key unless ``open_`` is False."""
        client = await StorageClient.connect(self.host, self.port)
        if open_:
            await client.open(self.key, self.num_partitions)
        return client


StorageFactory = Callable[..., StorageProcess]


@pytest.fixture
def storage_factory(tmp_path: Path) -> Iterator[StorageFactory]:
    started: list[StorageProcess] = []
    counter = iter(range(1_000_000))

    def factory(
        *,
        directory: Path | None = None,
        key: uuid.UUID | None = None,
        num_partitions: int = 4,
        partitions: str = "0-3",
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        raw_args: list[str] | None = None,
        ready_file: Path | None = None,
        start: bool = True,
    ) -> StorageProcess:
        """A storage process (started unless ``start`` is False).

        With ``raw_args`` the process gets exactly those arguments and
        ``ready_file`` must name the ready file they (or the file/env) set.
        """
        base = tmp_path / f"node{next(counter)}"
        base.mkdir()
        node = StorageProcess(
            base,
            directory if directory is not None else base / "data",
            key or uuid.uuid4(),
            num_partitions,
            partitions,
            extra or [],
            clean_env(**(env or {})),
            raw_args,
            ready_file,
        )
        started.append(node)
        return node.start() if start else node

    yield factory

    for node in started:
        node.kill(signal.SIGKILL)
    for node in started:
        assert node.proc is None or node.proc.poll() is not None, "storage process still running"


@pytest.fixture
def storage_node(storage_factory: StorageFactory) -> StorageProcess:
    """A running storage node: partitions 0-3 of 4, fresh directory, random cluster key."""
    return storage_factory()


@pytest.fixture
def waltz() -> Callable[..., subprocess.CompletedProcess]:
    """``waltz(*args)`` runs the admin command in a child process (see ``waltz_cli``)."""
    return waltz_cli
