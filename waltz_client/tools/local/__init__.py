"""Real dependencies (ZooKeeper, ...) started as local processes for development and tests."""
