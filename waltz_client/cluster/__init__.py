"""Cluster metadata in ZooKeeper: layout, codecs, CreateCluster and the admin commands."""
