"""Health and readiness of a storage node (``/healthz``, ``/readyz``); the HTTP app with
``/metrics`` is the daemons' shared ``probe_app``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from waltz_client.runtime.daemon import probe_app

from .server import StorageServer


def build_app(server: StorageServer) -> web.Application:
    node = server.node

    def healthz() -> tuple[bool, dict[str, Any]]:
        # Live unless a partition failed *after* opening (an fsync error): a restart
        # recovers that. A partition that cannot open would fail again, so it only
        # makes the node unready.
        failed = {p: svc.unavailable for p, svc in node.partitions.items() if svc.failed_after_open}
        return not failed, {"status": "failing" if failed else "ok", "failed_partitions": failed}

    def readyz() -> tuple[bool, dict[str, Any]]:
        unavailable = {
            p: svc.unavailable or svc.out_of_space
            for p, svc in node.partitions.items()
            if svc.unavailable or svc.out_of_space
        }
        ready = server.listening and not unavailable
        return ready, {
            "ready": ready,
            "listening": server.listening,
            "partitions": sorted(node.partitions),
            "unavailable_partitions": unavailable,
        }

    return probe_app(healthz, readyz, node.metrics.registry)
