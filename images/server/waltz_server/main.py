"""``waltz-server``: run a server until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from waltz_client.runtime.daemon import run_daemon, settle_heap, start_http, write_ready_file
from waltz_client.runtime.tls import warn_plaintext
from waltz_client.wire.native import describe as describe_loops

from .config import ConfigError, ServerConfig, load_config
from .coordinator import ServerCoordinator
from .http import build_app
from .server import WaltzServer

log = logging.getLogger("waltz_server")


async def serve(config: ServerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    # Bind first: the registration must name the ports clients will reach.
    unregistered = config.registration("pending", 0, 0)
    coordinator = ServerCoordinator(
        config.zookeeper,
        config.zk_root,
        unregistered,
        session_timeout=config.zk_session_timeout,
        credential=config.zk_credential,
        tls=config.zk_tls,
    )
    server = WaltzServer(config, coordinator)
    try:
        port = await server.listen(config.host, config.port)
        runner, http_port = await start_http(
            build_app(server),
            config.host,
            config.http_port,
            config.tls if config.http_tls else None,
        )
    except OSError as e:
        await server.close()
        print(f"waltz-server: error: cannot listen on {config.host}: {e.strerror}", file=sys.stderr)
        return 2
    server_id = config.server_id or f"{config.advertised()}-{port}"
    coordinator.registration = config.registration(server_id, port, http_port)
    if not config.tls.enabled:
        warn_plaintext("server", config.host, port, log)
    if config.tls.enabled:
        log.info(
            "server %s: clients dial %s and check its certificate for %s",
            server_id,
            coordinator.registration.endpoint,
            coordinator.registration.verified_name,
        )
    coordinator.set_handlers(
        server.ownership_changed, server.assignment_changed, server.session_lost
    )
    log.info(
        "server %s: connecting to ZooKeeper %s, cluster %s (per-record loops %s)",
        server_id,
        config.zookeeper,
        config.zk_root,
        describe_loops(),
    )
    started = loop.create_task(_ready(coordinator, server))
    stopping = loop.create_task(stop.wait())
    done, _ = await asyncio.wait({started, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if started in done:
        started.result()
        log.info(
            "server %s serving clients on %s:%d (http %d)", server_id, config.host, port, http_port
        )
        settle_heap()
        if config.ready_file:
            write_ready_file(
                config.ready_file,
                {"pid": os.getpid(), "port": port, "http_port": http_port, "server_id": server_id},
            )
        await stop.wait()
    else:
        started.cancel()
    log.info("stopping")
    if started in done:
        await _hand_over(coordinator, server)
    await server.close()
    await coordinator.stop()
    await runner.cleanup()
    return 0


# How long a stopping server waits for its partitions to stop after handing them over.
HAND_OVER_WAIT = 10.0


async def _hand_over(coordinator: ServerCoordinator, server: WaltzServer) -> None:
    """A planned stop: the partitions go to the other servers first (``hand_over``),
    and stop here as the ownership change reaches this server, as they would on any
    move; the connections close only then. Their clients mount at the new owners from the
    same change: a partition goes without commits only while its new owner recovers."""
    if not await coordinator.hand_over():
        return
    deadline = asyncio.get_running_loop().time() + HAND_OVER_WAIT
    while server.holds_partitions and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    if server.holds_partitions:
        log.warning(
            "partitions %s still here %g s after the hand-over; stopping them",
            ", ".join(map(str, sorted(server.partitions))),
            HAND_OVER_WAIT,
        )


async def _ready(coordinator: ServerCoordinator, server: WaltzServer) -> None:
    """Registered and following ZooKeeper, and the access policy read: the ready file
    (and /readyz) say so only then. Until the policy is read, requests answer NOT_READY
    (an unreadable policy keeps the server there: it refuses to guess)."""
    await coordinator.start(before_registering=server.ready_connections)
    polls = 0
    while server.access_policy is None:  # its watch reports through the loop, soon
        polls += 1
        if polls == 100:  # 5 s: say why this server is not ready
            log.warning(
                "still waiting for a readable access policy at %s; requests answer NOT_READY",
                coordinator.paths.access,
            )
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    run_daemon("waltz-server", lambda: load_config(argv, os.environ), serve, ConfigError)


if __name__ == "__main__":
    main()
