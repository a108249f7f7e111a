"""The tools built on the client and the daemons: the ``waltz`` command (``cli``), the local
cluster (``local``), the demo and its checks (``demo``: run, smoke, soak, bench, compare,
floor, check), the fuzzer (``fuzz``), backup and restore (``backup``) and the server's
benchmarks (``server_bench``).

Nothing below this package imports it; only the Spark source's demo job sits above it.
"""
