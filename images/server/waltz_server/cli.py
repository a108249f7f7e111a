"""``waltz server ...``: server tools (the benchmark)."""

from __future__ import annotations

import argparse

from . import bench


def register(groups: argparse._SubParsersAction) -> None:
    server = groups.add_parser("server", help="server tools (benchmark)")
    cmds = server.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench.register(cmds)
