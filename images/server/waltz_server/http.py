"""Health, readiness and Prometheus metrics over HTTP (aiohttp), on its own port."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .server import WaltzServer


def _partitions(server: WaltzServer) -> dict[str, dict]:
    return {
        str(p): {
            "state": part.state.value,
            "status": part.status,
            "generation": part.generation,
            "high_water_mark": part.high_water_mark,
        }
        for p, part in sorted(server.partitions.items())
    }


def build_app(server: WaltzServer) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        """Healthy: connected to ZooKeeper and every owned partition active."""
        connected = server.coordinator.connected
        unhealthy = [p for p, part in server.partitions.items() if not part.healthy]
        ok = connected and not unhealthy
        body = {
            "status": "ok" if ok else "failing",
            "zookeeper_connected": connected,
            "unhealthy_partitions": sorted(unhealthy),
            "partitions": _partitions(server),
        }
        return web.json_response(body, status=200 if ok else 503)

    async def readyz(_: web.Request) -> web.Response:
        """Ready: listening, registered in ZooKeeper and the access policy read (partitions
        may still recover). Before the policy is read, requests answer NOT_READY."""
        ready = server.ready
        body = {
            "ready": ready,
            "server_id": server.coordinator.registration.server_id,
            "zookeeper_connected": server.coordinator.connected,
            "access_policy_read": server.access_policy is not None,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
