"""Waltz server: partition ownership, quorum replication, recovery, optimistic locks, feeds."""
