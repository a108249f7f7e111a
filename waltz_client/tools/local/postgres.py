"""A throw-away PostgreSQL server on loopback, from the machine's own PostgreSQL binaries
(Debian's ``postgresql`` package: ``/usr/lib/postgresql/<version>/bin``), for the tests
and the demo of the DB-API callbacks against a real database.

PostgreSQL refuses to run as root; as root, the server runs as ``nobody`` in a directory
of its own under the system's temporary directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries here, or the server did not start: the reason, one line."""


def postgres_bindir() -> str:
    """The directory holding ``initdb`` and ``postgres`` (the newest version installed)."""
    explicit = os.environ.get("WALTZ_PG_BINDIR")
    candidates = [explicit] if explicit else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]), reverse=True
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(os.path.dirname(os.path.realpath(on_path)))
    for d in candidates:
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(
            os.path.join(d, "postgres"), os.X_OK
        ):
            return d
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, postgres) found; install Debian's "
        "postgresql package, or set WALTZ_PG_BINDIR"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """``start()`` runs initdb and the server (trust auth, loopback only, superuser
    ``postgres``); ``stop()`` stops it and removes its files."""

    def __init__(self, port: int | None = None, durable: bool = False) -> None:
        self.bindir = postgres_bindir()
        self.port = port or _free_port()
        self.durable = durable  # fsync on; off by default (a throw-away server)
        self.dir = Path(tempfile.mkdtemp(prefix="waltz-pg-"))
        self.data = self.dir / "data"
        self._run_as: dict[str, str] = {}
        if os.geteuid() == 0:
            self._run_as = {"user": "nobody", "group": "nogroup"}
            shutil.chown(self.dir, "nobody", "nogroup")
        self._server: subprocess.Popen | None = None

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        init = subprocess.run(
            [
                f"{self.bindir}/initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            **self._run_as,
        )
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {init.stderr.strip().splitlines()[-1:]}")
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "max_connections": "200",
            "shared_buffers": "64MB",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "deadlock_timeout": "200ms",
        }
        command = [f"{self.bindir}/postgres", "-D", str(self.data)]
        for key, value in settings.items():
            command += ["-c", f"{key}={value}"]
        log = open(self.dir / "postgres.log", "wb")  # noqa: SIM115 (the server's lifetime)
        self._server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self._run_as
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                tail = (self.dir / "postgres.log").read_text(errors="replace").strip()
                raise PostgresUnavailable(f"postgres exited: {tail.splitlines()[-1:]}")
            ready = subprocess.run(
                [f"{self.bindir}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return self
            time.sleep(0.1)
        self.stop()
        raise PostgresUnavailable(f"postgres did not accept connections in {timeout:.0f} s")

    def stop(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.send_signal(signal.SIGINT)  # fast shutdown (SIGTERM waits for clients)
            try:
                self._server.wait(30)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
