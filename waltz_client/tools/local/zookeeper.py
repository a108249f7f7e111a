"""A real, single-node ZooKeeper server run as a child JVM, for development and tests.

The server is Apache ZooKeeper's own ``ZooKeeperServerMain``; its jars come from
``$ZOOKEEPER_HOME`` (an Apache ZooKeeper binary release) or, failing that, from the
``jars/`` directory of an installed pyspark wheel (``pip install 'waltz[local]'``),
which ships ZooKeeper's server. Java (17 or later) must be installed.

    with EmbeddedZooKeeper("/tmp/zk") as zk:
        client = KazooClient(hosts=zk.connect_string)

Run ``python -m waltz_client.tools.local.zookeeper --data-dir DIR [--port PORT]`` to serve
one from a terminal until Ctrl-C.

This module runs the JVM; finding Java and the jars is ``zookeeper_install``, the files
the server reads ``zookeeper_files``, and talking to it from outside ``zookeeper_probes``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import IO

from waltz_client.runtime.tls import TlsFiles
from waltz_client.tools.local.processes import wait_until_stopped

from .held_signals import signals_held
from .zookeeper_files import (
    log4j2_path,
    quorum_config,
    server_config,
    tls_config,
    write_config_files,
)
from .zookeeper_install import ZooKeeperUnavailable, find_java, find_zookeeper_classpath
from .zookeeper_probes import four_letter_word, free_port, kazoo_connects, listening

__all__ = [
    "EmbeddedZooKeeper",
    "ZooKeeperUnavailable",
    "find_java",
    "find_zookeeper_classpath",
]

SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"  # a member of an ensemble
_LOG_TAIL_LINES = 30
_PORT_ATTEMPTS = 3  # fresh free ports tried when an automatically picked one is taken

_RUNNING: weakref.WeakSet[EmbeddedZooKeeper] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    # The JVM runs in its own session, so nothing else would end it with this process.
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.kill()


class EmbeddedZooKeeper:
    """One ZooKeeper server in a child JVM, keeping its data in ``data_dir``.

    ``port=0`` picks a free port on the first :meth:`start` and keeps it for later
    starts. The JVM runs in its own process group; its output goes to ``log_path``
    (default ``<data_dir>/zookeeper.log``, appended to across starts). A server still
    running when the Python process exits normally is killed.
    """

    def __init__(
        self,
        data_dir: str,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        java: str | None = None,
        classpath: str | None = None,
        log_path: str | None = None,
        heap_mb: int = 256,
        log_level: str = "INFO",
        tls: TlsFiles | None = None,
        server_id: int = 0,
        quorum: dict[int, str] | None = None,
    ) -> None:
        """``tls``: also serve a secure client port (TLS, client certificates required)
        with this certificate; the plain port stays, on ``host``, for local probes.
        ``quorum``: run as member ``server_id`` of an ensemble, every member's
        ``host:quorum_port:election_port`` by ID (``ZooKeeperEnsemble`` sets it up)."""
        self.data_dir = os.path.abspath(data_dir)
        self.host = host
        self.heap_mb = heap_mb
        self.log_level = log_level
        self.log_path = os.path.abspath(log_path or os.path.join(self.data_dir, "zookeeper.log"))
        self._java = java
        self._classpath = classpath
        self._port = port
        self._auto_port = port == 0
        self._started_once = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self.tls = tls
        self._secure_port = 0
        if quorum is not None and server_id not in quorum:
            raise ValueError(f"server_id {server_id} is not one of the quorum's {sorted(quorum)}")
        self.server_id = server_id
        self.quorum = quorum

    # -- facts ---------------------------------------------------------------

    @property
    def port(self) -> int:
        """The client port (picked now if it was 0 and no start has picked it yet)."""
        if self._port == 0:
            self._port = free_port(self.host)
        return self._port

    @property
    def connect_string(self) -> str:
        """``host:port``, for ``KazooClient(hosts=...)``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def secure_port(self) -> int:
        """The TLS client port (``tls`` given; picked now if no start has picked it yet)."""
        if self.tls is None:
            raise ZooKeeperUnavailable("this ZooKeeper serves no TLS port (no tls given)")
        if self._secure_port == 0:
            self._secure_port = free_port(self.host)
        return self._secure_port

    @property
    def secure_connect_string(self) -> str:
        """``host:port`` of the TLS client port (``tls`` given)."""
        secure_port = self.secure_port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{secure_port}"

    @property
    def pid(self) -> int | None:
        """The JVM's pid while it runs (paused counts as running), else None."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def config_path(self) -> str:
        return os.path.join(self.data_dir, "zoo.cfg")

    def ruok(self, timeout: float = 1.0) -> bool:
        """True if the server answers ``ruok`` with ``imok`` within ``timeout`` seconds."""
        return four_letter_word(self.host, self.port, "ruok", timeout) == "imok"

    def command_line(self, java: str, classpath: str) -> list[str]:
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-Djava.awt.headless=true",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dlog4j2.configurationFile={log4j2_path(self.data_dir)}",
            "-cp",
            classpath,
            SERVER_MAIN if self.quorum is None else QUORUM_MAIN,
            self.config_path,
        ]

    # -- life cycle ----------------------------------------------------------

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> None:
        """Start the server and wait until it answers ``ruok`` and accepts a kazoo session.

        Raises :class:`ZooKeeperUnavailable` (with the end of the log) if Java or the
        jars are missing, or the server exits or is not ready within ``timeout`` seconds.
        ``wait=False``: return once the JVM runs (an ensemble's member serves only once
        a majority runs; ``wait_ready`` then)."""
        if self.running:
            raise RuntimeError(f"ZooKeeper is already running on {self.connect_string}")
        self._reap()  # a server that died by itself
        java = find_java(self._java)
        classpath = self._classpath or find_zookeeper_classpath()
        os.makedirs(self.data_dir, exist_ok=True)
        deadline = time.monotonic() + timeout
        # Only a port this object picked itself, and never served on, may be swapped for
        # another one if something else turns out to hold it.
        attempts = _PORT_ATTEMPTS if self._auto_port and not self._started_once else 1
        for attempt in range(1, attempts + 1):
            if listening(self.host, self.port):
                if attempt < attempts:
                    self._port = 0
                    continue
                raise ZooKeeperUnavailable(
                    f"cannot start ZooKeeper: something is already listening on "
                    f"{self.connect_string}"
                )
            try:
                self._launch(java, classpath, deadline, timeout, wait)
            except _PortTaken:
                if attempt < attempts:
                    self._port = 0
                    continue
                raise ZooKeeperUnavailable(
                    f"ZooKeeper could not bind {self.connect_string} (address already in use)"
                    + self._log_tail_text()
                ) from None
            self._started_once = True
            return

    def _launch(
        self, java: str, classpath: str, deadline: float, timeout: float, wait: bool = True
    ) -> None:
        self._write_config()
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self._log_offset = log.tell()
        try:
            # Until the child is recorded, an interrupt would leave a JVM nothing knows of.
            with signals_held():
                try:
                    self._proc = subprocess.Popen(
                        self.command_line(java, classpath),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=self.data_dir,
                        start_new_session=True,
                    )
                except OSError as exc:
                    log.close()
                    raise ZooKeeperUnavailable(f"cannot run {java}: {exc}") from exc
                self._log = log
                _RUNNING.add(self)
            if wait:
                self._wait_ready(deadline, timeout)
        except BaseException:
            self.kill()  # the JVM's whole process group, if it was started
            raise

    def wait_ready(self, timeout: float = 30.0) -> None:
        """After ``start(wait=False)``: until it answers ``ruok`` and accepts a kazoo
        session (ZooKeeperUnavailable, with the end of the log, if not in time)."""
        try:
            self._wait_ready(time.monotonic() + timeout, timeout)
        except _PortTaken:
            raise ZooKeeperUnavailable(
                f"ZooKeeper could not bind {self.connect_string} (address already in use)"
                + self._log_tail_text()
            ) from None

    def _wait_ready(self, deadline: float, timeout: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                if "Address already in use" in self._log_tail_text():
                    raise _PortTaken
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with code {code} while starting on {self.connect_string}"
                    + self._log_tail_text()
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper did not become ready on {self.connect_string} within "
                    f"{timeout:g} s" + self._log_tail_text()
                )
            if self.ruok(timeout=min(1.0, remaining)) and kazoo_connects(
                self.connect_string, deadline - time.monotonic()
            ):
                # It might still be another server answering: make sure ours is alive.
                if self._proc.poll() is None:
                    return
                continue
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` seconds) and wait
        until it has exited. Does nothing if it is not running."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            self._signal(signal.SIGCONT)  # a paused JVM would never see the SIGTERM
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait()
        self._reap()

    def kill(self) -> None:
        """Kill the server with SIGKILL (a crash, for fault tests) and wait until it has
        exited. Does nothing if it is not running."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGKILL)
            proc.wait()
        self._reap()

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: its port stays open but nothing answers."""
        self._require_running()
        self._signal(signal.SIGSTOP)
        assert self._proc is not None
        wait_until_stopped(self._proc.pid)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT)."""
        self._require_running()
        self._signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop the server, then start it again on the same data directory and port."""
        self.stop()
        self.start(timeout=timeout)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the server to exit by itself; its exit code, or None on timeout."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> EmbeddedZooKeeper:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"EmbeddedZooKeeper({self.data_dir!r}, {self.host}:{self._port}, {state})"

    # -- helpers -------------------------------------------------------------

    def _write_config(self) -> None:
        config = server_config(self.data_dir, self.host, self.port)
        if self.tls is not None:
            config.update(tls_config(self.data_dir, self.host, self.secure_port, self.tls))
        if self.quorum is not None:
            config.update(quorum_config(self.data_dir, self.server_id, self.quorum))
        write_config_files(self.data_dir, self.config_path, config, self.log_level)

    def _signal(self, signum: int) -> None:
        assert self._proc is not None
        # The JVM leads its own process group (start_new_session=True).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signum)

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError("ZooKeeper is not running")

    def _reap(self) -> None:
        self._proc = None
        _RUNNING.discard(self)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_tail_text(self) -> str:
        lines = self.log_tail()
        if not lines:
            return f" (log {self.log_path} is empty)"
        return f"; last lines of {self.log_path}:\n" + "\n".join(lines)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> list[str]:
        """The last ``lines`` lines the server wrote since its latest start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()[-lines:]


class _PortTaken(Exception):
    """The server could not bind its port."""


# -- command line --------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m waltz_client.tools.local.zookeeper",
        description="Serve a local ZooKeeper until Ctrl-C (data survives in --data-dir).",
    )
    parser.add_argument("--data-dir", required=True, help="where ZooKeeper keeps its data")
    parser.add_argument("--port", type=int, default=2181, help="client port; 0 picks a free one")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--heap-mb", type=int, default=256, help="JVM heap limit in MiB")
    parser.add_argument("--java", help="java executable (default: $JAVA_HOME/bin/java or PATH)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for start")
    args = parser.parse_args(argv)

    server = EmbeddedZooKeeper(
        args.data_dir, args.port, args.host, java=args.java, heap_mb=args.heap_mb
    )

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # Installed explicitly, and before anything slow: a process started in the background
    # by a shell without job control (`cmd &` in a script, CI, test runners started so)
    # inherits SIGINT *ignored*, and Python then leaves it ignored instead of raising
    # KeyboardInterrupt, so Ctrl-C or `kill -INT` would never stop the server.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        try:
            server.start(timeout=args.timeout)
        except ZooKeeperUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(server.connect_string, flush=True)
        print(
            f"ZooKeeper serving on {server.connect_string} (pid {server.pid}, data in "
            f"{server.data_dir}, log {server.log_path}); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        code = server.wait()
        print(f"error: ZooKeeper exited by itself with code {code}", file=sys.stderr)
        for line in server.log_tail(10):
            print(f"  {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Stopping is bounded (SIGKILL after 10 s); a second Ctrl-C must not cut it short
        # and leave the JVM running on its own.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.stop()
        print("ZooKeeper stopped", file=sys.stderr)
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
