"""Waltz storage node: the durable, checksummed on-disk log and its protocol server."""
