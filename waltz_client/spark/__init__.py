"""PySpark support: the ``waltz`` data source (``pip install 'waltz[spark]'``).

    from waltz_client.spark import WaltzDataSource
    spark.dataSource.register(WaltzDataSource)
    df = spark.read.format("waltz").option("zookeeper", "127.0.0.1:2181").load()

See docs/spark.md. The core client never imports this package (nor pyspark).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .options import WaltzOptionError
    from .source import WaltzDataSource

__all__ = ["WaltzDataSource", "WaltzOptionError"]


def __getattr__(name: str) -> Any:
    # Imported on first use: pyspark and pyarrow come with the ``spark`` extra, and
    # importing a submodule (the ``waltz`` command finds its Spark subcommands here)
    # must not need them.
    if name == "WaltzDataSource":
        from .source import WaltzDataSource

        return WaltzDataSource
    if name == "WaltzOptionError":
        from .options import WaltzOptionError

        return WaltzOptionError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
