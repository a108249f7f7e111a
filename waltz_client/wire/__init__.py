"""Frames and messages shared by every Waltz process.

Everything here is pure: bytes in, messages out, and back. Sockets live in
the connection shells (``storage_client`` here, the daemons' servers).
"""
