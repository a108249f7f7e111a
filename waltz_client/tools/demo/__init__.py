"""Demo applications built on the client library."""
