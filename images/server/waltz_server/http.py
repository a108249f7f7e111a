"""Health and readiness of a server (``/healthz``, ``/readyz``); the HTTP app with
``/metrics`` is the daemons' shared ``probe_app``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from waltz_client.runtime.daemon import probe_app

from .server import WaltzServer


def _partitions(server: WaltzServer) -> dict[str, dict[str, Any]]:
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
    def healthz() -> tuple[bool, dict[str, Any]]:
        """Healthy: connected to ZooKeeper and every owned partition active."""
        connected = server.coordinator.connected
        unhealthy = [p for p, part in server.partitions.items() if not part.healthy]
        ok = connected and not unhealthy
        return ok, {
            "status": "ok" if ok else "failing",
            "zookeeper_connected": connected,
            "unhealthy_partitions": sorted(unhealthy),
            "partitions": _partitions(server),
        }

    def readyz() -> tuple[bool, dict[str, Any]]:
        """Ready: listening, registered in ZooKeeper and the access policy read (partitions
        may still recover). Before the policy is read, requests answer NOT_READY."""
        ready = server.ready
        return ready, {
            "ready": ready,
            "server_id": server.coordinator.registration.server_id,
            "zookeeper_connected": server.coordinator.connected,
            "access_policy_read": server.access_policy is not None,
        }

    return probe_app(healthz, readyz, server.metrics.registry)
