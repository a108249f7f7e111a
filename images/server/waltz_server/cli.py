"""``waltz server ...``: server tools (the benchmark)."""

from __future__ import annotations

import argparse

from . import bench, bench_catch_up


def register(groups: argparse._SubParsersAction) -> None:
    server = groups.add_parser("server", help="server tools (benchmarks)")
    cmds = server.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench.register(cmds)
    bench_catch_up.register(cmds)
