"""``waltz-storage``: run a storage node until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

from waltz_client.partition_ranges import format_partition_ranges

from .config import ConfigError, StorageConfig, load_config
from .errors import ControlFileError
from .http import start_http
from .server import ServerSettings, StorageServer
from .service import EngineSettings, StorageNode

log = logging.getLogger("waltz_storage")


def _write_ready_file(path: str, info: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


async def serve(config: StorageConfig) -> int:
    server_settings = ServerSettings(
        max_frame_bytes=config.max_frame_bytes,
        queue_max_requests=config.queue_max_requests,
        queue_max_bytes=config.queue_max_bytes,
        write_group_max_bytes=config.write_group_max_bytes,
    )
    engine_settings = EngineSettings(
        segment_bytes=config.segment_bytes,
        # The most bytes one write group can leave unsynced: a drained batch stops
        # once it reaches write_group_max_bytes, so at most one more frame; records
        # take at most 40/36 of their wire size on disk.
        max_torn_bytes=(config.write_group_max_bytes + config.max_frame_bytes) * 10 // 9 + 1,
    )
    loop = asyncio.get_running_loop()
    try:
        node = await loop.run_in_executor(
            None,
            lambda: StorageNode.open(
                config.directory,
                config.cluster_key,
                config.num_partitions,
                set(config.partitions),
                engine_settings,
            ),
        )
    except ControlFileError as e:
        print(f"waltz-storage: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"waltz-storage: error: setting directory ({config.directory}): cannot use it as "
            f"the storage directory: {e.strerror or e}",
            file=sys.stderr,
        )
        return 2
    server = StorageServer(node, server_settings)
    try:
        port = await server.start(config.host, config.port)
        runner, http_port = await start_http(server, config.host, config.http_port)
    except OSError as e:
        print(
            f"waltz-storage: error: cannot listen on {config.host}: {e.strerror}", file=sys.stderr
        )
        await server.close()
        node.close()
        return 2
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "storage node serving partitions %s of cluster %s on %s:%d (http %d), dir %s",
        format_partition_ranges(config.partitions),
        config.cluster_key,
        config.host,
        port,
        http_port,
        config.directory,
    )
    if config.ready_file:
        _write_ready_file(
            config.ready_file, {"pid": os.getpid(), "port": port, "http_port": http_port}
        )
    await stop.wait()
    log.info("stopping")
    await runner.cleanup()
    await server.close()
    node.close()
    return 0


def main(argv: list[str] | None = None) -> None:
    try:
        config = load_config(argv, os.environ)
    except ConfigError as e:
        print(f"waltz-storage: error: {e}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        runner = asyncio.run
    sys.exit(runner(serve(config)))


if __name__ == "__main__":
    main()
