"""What an idle WaltzCluster costs the API server: requests per minute by verb, with the
operator's owned objects watched (applied only when they differ) and without (every
object applied every reconcile, as before).

    .venv/bin/python tests/k8s/idle_api_requests.py [--seconds 60] [--interval 10]

Runs the operator in-process against the strict API server (strict_api/) and an
embedded ZooKeeper, with one WaltzCluster whose pods are not running (what the operator
does for a cluster does not depend on it: it reads, decides there is nothing to do, and
applies). Counts only what follows the first minute-fraction of settling.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operator_harness import (
    NS,
    OPERATOR_USER,
    cluster_doc,
    create_cluster_object,
    kubernetes_api,
    running_operator,
)

from waltz_client.tools.local.zookeeper import EmbeddedZooKeeper
from waltz_operator import handlers


async def measure(
    zookeeper: EmbeddedZooKeeper, seconds: float, interval: float, tls_mode: str
) -> dict:
    async with kubernetes_api() as api:
        doc = cluster_doc(zookeeper, f"/idle-{uuid.uuid4().hex}", tls={"mode": tls_mode})
        create_cluster_object(api, doc)
        async with running_operator(api, NS, interval=interval):
            await asyncio.sleep(max(5.0, 2 * interval))  # created, settled
            start = len(api.requests)
            await asyncio.sleep(seconds)
            counted = [r for r in api.requests[start:] if r.user == OPERATOR_USER]
    per_minute = 60.0 / seconds
    verbs = collections.Counter(
        "WATCH" if r.method == "GET" and r.query.get("watch") in ("true", "1") else r.method
        for r in counted
    )
    return {verb: round(n * per_minute, 1) for verb, n in sorted(verbs.items())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=10.0, help="the reconcile interval")
    p.add_argument(
        "--tls-mode",
        choices=("disabled", "operator"),
        default="disabled",
        help="operator: the operator's own CA, certificates and ZooKeeper credential",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        zookeeper = EmbeddedZooKeeper(directory)
        zookeeper.start()
        try:
            watched = asyncio.run(measure(zookeeper, args.seconds, args.interval, args.tls_mode))
            handlers.OWNED_RESOURCES = ()  # no indexes: every object applied every time
            applied = asyncio.run(measure(zookeeper, args.seconds, args.interval, args.tls_mode))
        finally:
            zookeeper.stop()
    print(
        f"requests per minute, one idle cluster (tls.mode {args.tls_mode}), reconcile every "
        f"{args.interval:g} s:"
    )
    for label, figures in (("every object applied", applied), ("owned objects watched", watched)):
        total = sum(figures.values())
        print(f"  {label:24} {total:6.1f}  " + "  ".join(f"{v} {n}" for v, n in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
