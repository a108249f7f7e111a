"""PySpark support: the ``waltz`` data source (``pip install 'waltz[spark]'``).

    from waltz_client.spark import WaltzDataSource
    spark.dataSource.register(WaltzDataSource)
    df = spark.read.format("waltz").option("zookeeper", "127.0.0.1:2181").load()

See docs/spark.md. The core client never imports this package (nor pyspark).
"""

from .options import WaltzOptionError
from .source import WaltzDataSource

__all__ = ["WaltzDataSource", "WaltzOptionError"]
