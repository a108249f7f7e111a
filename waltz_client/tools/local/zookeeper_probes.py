"""Talking to a ZooKeeper server from outside: free ports to give it, whether something
listens on one, four-letter-word commands (``ruok``), and whether a kazoo session opens."""

from __future__ import annotations

import contextlib
import logging
import socket
import time

# kazoo logs a harmless "Connection dropped" warning when the readiness probe hangs up.
_PROBE_LOG = logging.getLogger("waltz_client.tools.local.zookeeper.probe")
if _PROBE_LOG.level == logging.NOTSET:
    _PROBE_LOG.setLevel(logging.ERROR)


def free_port(host: str) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listening(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def four_letter_word(host: str, port: int, command: str, timeout: float = 1.0) -> str | None:
    """Send a ZooKeeper four-letter-word command (``ruok``, ``srvr``, ...); the reply, or
    None if the server did not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(command.encode("ascii"))
            chunks: list[bytes] = []
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode("utf-8", "replace")


def kazoo_connects(connect_string: str, timeout: float) -> bool:
    """True if a kazoo session to ``connect_string`` opens and reads ``/`` within
    ``timeout`` seconds."""
    if timeout <= 0:
        return False
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=connect_string, timeout=10.0, logger=_PROBE_LOG)
    try:
        client.start(timeout=timeout)
        client.get("/")
        return True
    except (KazooTimeoutError, KazooException):
        return False
    finally:
        with contextlib.suppress(Exception):
            client.stop()
        with contextlib.suppress(Exception):
            client.close()
