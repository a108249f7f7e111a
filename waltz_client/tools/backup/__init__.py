"""Backup and restore of a Waltz cluster's committed logs (``waltz backup``, ``waltz restore``).

A backup is a directory: a manifest (``waltz-backup.json``) and, per partition, chunk
files of committed records copied through the servers' range reads while the cluster
keeps serving. Every file is checksummed; later runs append only what is new. A
restore builds a new cluster (its metadata in ZooKeeper and its storage directories)
holding the same transactions under the same IDs. docs/backup.md describes the format,
the commands and the guarantees.
"""

from .format import BackupError, Manifest, PartitionBackup, verify_backup

__all__ = ["BackupError", "Manifest", "PartitionBackup", "verify_backup"]
