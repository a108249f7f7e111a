"""Waltz client library: everything an application or a Spark job imports."""

__version__ = "0.1.0"
