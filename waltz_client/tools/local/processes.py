"""A daemon run as a child process: start it, wait until it is ready, signal it, restart it.

Used by the local cluster, the test fixtures and the fault tests. The daemon
writes a JSON ready file (pid and bound ports) once it serves; that file is
what "ready" means here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import IO


def wait_until_stopped(pid: int, timeout: float = 10.0) -> None:
    """Wait until every thread of ``pid`` is stopped (state T in /proc). SIGSTOP is
    delivered asynchronously: a thread busy on another core can still answer a request
    just after kill() returns. Without /proc, or once the process is gone, return."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            states = []
            for task in tasks:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    # The state follows the parenthesised command name.
                    states.append(stat.read().rpartition(")")[2].split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)


class ProcessFailed(RuntimeError):
    """The daemon exited or did not become ready; the message ends with its log."""


class DaemonProcess:
    def __init__(
        self,
        name: str,
        command: list[str],
        ready_file: str,
        log_path: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.ready_file = ready_file
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict = {}
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> dict:
        """Start and wait for the ready file; returns its contents."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        if os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child
        self.proc = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None:
                raise ProcessFailed(
                    f"{self.name} exited with status {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ProcessFailed(
                    f"{self.name} was not ready within {timeout:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.02)
        with open(self.ready_file) as f:
            self.ready = json.load(f)
        return self.ready

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (waking it first if paused), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            self.signal(signal.SIGCONT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def pause(self) -> None:
        """Freeze the daemon with SIGSTOP; returns once all its threads are stopped."""
        self.signal(signal.SIGSTOP)
        if self.running:
            assert self.proc is not None
            wait_until_stopped(self.proc.pid)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> dict:
        self.stop()
        return self.start(timeout)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
