"""An etcd cluster on this host: N ``etcd`` members (default 3) forming one raft group.

``waltz bench --compare`` measures etcd beside ZooKeeper, replicated like a waltz
partition: a put commits once a majority of the members has appended it to its
write-ahead log and fsync'd it (etcd's default; ``--unsafe-no-fsync`` is never passed).
The ``etcd`` binary comes from ``PATH`` (Debian's ``etcd-server`` package, etcd 3.4:
``make etcd-deps`` installs it); nothing is downloaded.

Each member listens on 127.0.0.1 with two free ports (clients, peers), keeps its data in
``<data_dir>/member-N/data`` and writes its log to ``<data_dir>/member-N/etcd.log``. The
flags, beyond the addresses and the initial cluster (state ``new``, a fresh token):

- ``--snapshot-count 1000000`` (default 100,000): a member snapshots its state, and
  compacts its raft log, every this many applied entries. A short cell writes fewer
  (100,000 writes would be 10 s at 10,000 writes/s), so no snapshot lands inside one;
  the price is that the raft log stays in memory meanwhile (about a write's size per
  entry: 1 GiB a member for a million 1 KiB writes, e.g. a 100 s cell at 10,000
  writes/s).
- ``--quota-backend-bytes``: etcd's default (2 GiB), far above a cell's writes.
- ``--heartbeat-interval`` and ``--election-timeout``: etcd's defaults (100 ms, 1 s).
- ``--logger zap --log-level warn``: the structured logger (3.4's default, capnslog, is
  deprecated) and only warnings and errors, so that logging costs a loaded member
  little; a member that fails says why at ``warn`` or above.
- no auto-compaction, no v2 API, no metrics beyond the default ``/metrics``.

``ETCD_*`` variables of the environment are not passed on: etcd reads every flag from
one (``ETCD_UNSAFE_NO_FSYNC`` would turn fsync off unseen).

A member is ready when its ``/health`` endpoint answers ``{"health":"true"}``: it
knows a leader and a linearizable read went through raft. :meth:`EtcdEnsemble.stop`
stops the members one at a time (SIGTERM, then SIGKILL after a timeout): stopped
together, a leader spends seconds trying to hand its leadership to a follower that is
itself going away.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
import weakref
from typing import IO

from .cluster import _free_port
from .held_signals import signals_held

DEFAULT_MEMBERS = 3
SNAPSHOT_COUNT = 1_000_000
_LOG_TAIL_LINES = 20
_PORT_ATTEMPTS = 3  # fresh ports tried when a picked one turns out to be taken

_RUNNING: weakref.WeakSet[EtcdEnsemble] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    # Each member runs in its own session, so nothing else would end it with this process.
    for ensemble in list(_RUNNING):
        with contextlib.suppress(Exception):
            ensemble.kill()


class EtcdUnavailable(RuntimeError):
    """etcd is not installed, or a member exited or did not become ready; the message
    ends with the end of that member's log."""


def find_etcd() -> str:
    """The ``etcd`` binary on PATH (EtcdUnavailable, saying how to install it, if none)."""
    path = shutil.which("etcd")
    if path is None:
        raise EtcdUnavailable(
            "`etcd` is not on PATH: `make etcd-deps` installs it (Debian's etcd-server)"
        )
    return path


class _Member:
    def __init__(self, name: str, data_dir: str, host: str) -> None:
        self.name = name
        self.dir = data_dir
        self.host = host
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(data_dir, "etcd.log")
        self._log: IO[bytes] | None = None
        self._log_offset = 0

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def command_line(self, etcd: str, initial_cluster: str, token: str) -> list[str]:
        return [
            etcd,
            f"--name={self.name}",
            f"--data-dir={os.path.join(self.dir, 'data')}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={token}",
            f"--snapshot-count={SNAPSHOT_COUNT}",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=warn",
        ]

    def launch(self, command: list[str], env: dict[str, str]) -> None:
        os.makedirs(self.dir, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self._log_offset = log.tell()
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=env,
                start_new_session=True,
            )
        except OSError:
            log.close()
            raise
        self._log = log

    def healthy(self, timeout: float) -> bool:
        conn = http.client.HTTPConnection(self.host, self.client_port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            body = response.read()
            return response.status == 200 and json.loads(body).get("health") == "true"
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def stop(self, timeout: float) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return f" (no log at {self.log_path})"
        text = data.decode("utf-8", "replace")
        text = text.partition("\nUsage:")[0]  # after a bad flag, its usage: not the news
        tail = text.splitlines()[-lines:]
        if not tail:
            return f" (log {self.log_path} is empty)"
        return f"; last lines of {self.log_path}:\n" + "\n".join(tail)


class EtcdEnsemble:
    """``members`` etcd processes on ``host`` forming one cluster, their data under
    ``data_dir`` (which should start empty: a member's data directory from an earlier
    cluster would make it rejoin that one)."""

    def __init__(
        self, data_dir: str, members: int = DEFAULT_MEMBERS, host: str = "127.0.0.1"
    ) -> None:
        if members < 1:
            raise ValueError(f"an etcd cluster has at least 1 member, not {members}")
        self.data_dir = os.path.abspath(data_dir)
        self.host = host
        self.members = [
            _Member(f"member-{i + 1}", os.path.join(self.data_dir, f"member-{i + 1}"), host)
            for i in range(members)
        ]

    @property
    def client_urls(self) -> list[str]:
        """Every member's client URL (``http://host:port``): a client may use any."""
        return [m.client_url for m in self.members]

    @property
    def pids(self) -> list[int]:
        return [m.proc.pid for m in self.members if m.proc is not None and m.proc.poll() is None]

    def start(self, timeout: float = 60.0) -> None:
        """Start every member, then wait until each is healthy (a leader elected). On
        failure, stop them all and raise EtcdUnavailable (with the failing member's log
        tail). A member that could not bind its ports is retried on fresh ones."""
        etcd = find_etcd()
        if any(m.proc is not None and m.proc.poll() is None for m in self.members):
            raise RuntimeError(f"etcd is already running in {self.data_dir}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        deadline = time.monotonic() + timeout
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._pick_ports()
            try:
                self._launch_all(etcd, env)
                self._wait_healthy(deadline, timeout)
                return
            except _PortTaken:
                self.kill()
                if attempt == _PORT_ATTEMPTS:
                    raise EtcdUnavailable(
                        f"etcd could not bind its ports {_PORT_ATTEMPTS} times"
                        + self._failed_member_tail()
                    ) from None
            except BaseException:
                self.kill()
                raise

    def _pick_ports(self) -> None:
        taken: set[int] = set()
        for m in self.members:
            m.client_port, m.peer_port = _free_port(taken), _free_port(taken)

    def _launch_all(self, etcd: str, env: dict[str, str]) -> None:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = f"waltz-bench-{uuid.uuid4().hex[:12]}"
        for m in self.members:
            shutil.rmtree(os.path.join(m.dir, "data"), ignore_errors=True)
            # Until the child is recorded, an interrupt would leave a process nothing knows of.
            with signals_held():
                try:
                    m.launch(m.command_line(etcd, initial, token), env)
                except OSError as exc:
                    raise EtcdUnavailable(f"cannot run {etcd}: {exc}") from exc
                _RUNNING.add(self)

    def _wait_healthy(self, deadline: float, timeout: float) -> None:
        waiting = list(self.members)
        while waiting:
            exited = self._exited()
            if exited is not None and "address already in use" in exited.log_tail():
                raise _PortTaken
            self.check_running()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                m = waiting[0]
                raise EtcdUnavailable(
                    f"etcd {m.name} on {m.client_url} was not healthy within {timeout:g} s"
                    + m.log_tail()
                )
            waiting = [m for m in waiting if not m.healthy(min(1.0, remaining))]
            if waiting:
                time.sleep(0.05)

    def _exited(self) -> _Member | None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is not None:
                return m
        return None

    def check_running(self) -> None:
        """EtcdUnavailable, with its log tail, if a member has exited."""
        m = self._exited()
        if m is not None:
            assert m.proc is not None
            raise EtcdUnavailable(
                f"etcd {m.name} ({m.client_url}) exited with code {m.proc.returncode}"
                + m.log_tail()
            )

    def _failed_member_tail(self) -> str:
        m = self._exited()
        return "" if m is None else m.log_tail()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the members one after the other: SIGTERM, then SIGKILL after ``timeout``
        seconds each. Does nothing for members not running."""
        try:
            for m in self.members:
                m.stop(timeout)
        finally:
            self.kill()  # whatever an interrupt left running
            _RUNNING.discard(self)

    def kill(self) -> None:
        for m in self.members:
            m.kill()
        _RUNNING.discard(self)

    def __enter__(self) -> EtcdEnsemble:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _PortTaken(Exception):
    """A member exited because one of its ports was taken meanwhile."""
