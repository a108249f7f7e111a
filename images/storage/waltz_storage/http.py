"""Health, readiness and Prometheus metrics over HTTP (aiohttp), on its own port."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .server import StorageServer


def build_app(server: StorageServer) -> web.Application:
    node = server.node

    async def healthz(_: web.Request) -> web.Response:
        # Live unless a partition failed *after* opening (an fsync error): a restart
        # recovers that. A partition that cannot open would fail again, so it only
        # makes the node unready.
        failed = {p: svc.unavailable for p, svc in node.partitions.items() if svc.failed_after_open}
        status = 503 if failed else 200
        return web.json_response(
            {"status": "failing" if failed else "ok", "failed_partitions": failed}, status=status
        )

    async def readyz(_: web.Request) -> web.Response:
        unavailable = {
            p: svc.unavailable or svc.out_of_space
            for p, svc in node.partitions.items()
            if svc.unavailable or svc.out_of_space
        }
        ready = server.listening and not unavailable
        body = {
            "ready": ready,
            "listening": server.listening,
            "partitions": sorted(node.partitions),
            "unavailable_partitions": unavailable,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(node.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
