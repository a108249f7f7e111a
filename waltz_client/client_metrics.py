"""An optional Prometheus collector of a client's ``partition_stats``.

prometheus-client is not a dependency of the client (a Spark executor or a small service
installs only the core): this module imports it when a collector is registered, and
says which extra brings it when it is missing (``pip install 'waltz[metrics]'``).

Each scrape reads ``WaltzClient.partition_stats()`` (from the exporter's thread), labelled
by partition and by the ``client`` name given at registration: register one collector
per client, each with its own name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import WaltzClient

NAMESPACE = "waltz_client"

# name, help, the PartitionStats field it reports, whether it only grows
_SERIES = (
    (
        "high_water_mark",
        "Highest committed transaction ID the client knows of",
        "high_water_mark",
        False,
    ),
    (
        "applied_high_water_mark",
        "Last transaction the client delivered to the application",
        "applied",
        False,
    ),
    ("lag_transactions", "Transactions known committed and not yet applied", "lag", False),
    (
        "lag_seconds",
        "How long the oldest unapplied transaction has been known",
        "lag_seconds",
        False,
    ),
    ("outstanding_appends", "Appends sent and not yet settled", "outstanding_appends", False),
    ("mounted", "1 while the partition is mounted", "mounted", False),
    ("retries", "Executions of contexts beyond their first", "retries", True),
    ("lock_failures", "Appends refused for a lock", "lock_failures", True),
)


class ClientCollector:
    """Yields the client's per-partition figures at each scrape."""

    def __init__(self, client: WaltzClient, client_name: str) -> None:
        self.client = client
        self.client_name = client_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.client.partition_stats()
        for name, help_text, field, grows in _SERIES:
            family_type = CounterMetricFamily if grows else GaugeMetricFamily
            family = family_type(f"{NAMESPACE}_{name}", help_text, labels=["client", "partition"])
            for p, s in stats.items():
                family.add_metric([self.client_name, str(p)], float(getattr(s, field)))
            yield family


def register_client_metrics(
    client: WaltzClient, client_name: str, registry: Any = None
) -> ClientCollector:
    """Report ``client``'s partition figures in ``registry`` (prometheus-client's default
    one unless given), labelled ``client=client_name``."""
    if not client_name:
        raise ValueError("client_name labels the client's series: give it a name")
    try:
        import prometheus_client
    except ImportError as e:
        raise ImportError(
            "the client's Prometheus collector needs prometheus-client: "
            "pip install 'waltz[metrics]'"
        ) from e
    collector = ClientCollector(client, client_name)
    (registry or prometheus_client.REGISTRY).register(collector)
    return collector
